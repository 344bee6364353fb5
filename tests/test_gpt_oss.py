"""gpt-oss (attention sinks, alternating windowed and full layers, q/k/v/o biases, YaRN; a MoE whose
router has a bias and takes the softmax over its top-k, experts with biases and the clamped SwiGLU):
fuel's reference forward against transformers' eager f32 logits on a tiny random checkpoint, with
negative controls that drop one piece each and must fail the same comparison.

The sequence is 40 tokens, five times the tiny model's window (8). Measured (AMD EPYC, logits up to
~10), max|Δ|: fuel's reference against transformers f32 3.8e-5 (its default grouped_mm experts;
4.0e-5 against its eager experts); against transformers float64 (eager experts) fuel 7.0e-5 and
transformers' own f32 5.2e-5, so the bound is the issue's 1e-4. The dropped pieces miss by 100x
that or more: sinks 8.9, clamp 3.1, router bias 0.15, softmax over all experts 0.057, no window
12. With the experts at N(0, 0.3) and swiglu_limit 3, transformers' own f32 logits were 1.3e-4 from
its f64 ones (fuel 7.7e-5): the fixture keeps the experts at 0.1 and the limit at 1, where the
clamp still bites. The same weights in bf16 (experts turned on load two bytes an element): 3.8e-5
against transformers reading that directory.

GGUF: llama.cpp's converter writes the gpt_oss_limit7 checkpoint (gpt_oss's weights with the
swiglu_limit llama.cpp fixes, 7: no key carries it) as an f32 GGUF; fuel's reference on it against
transformers on the source 3.1e-5 (as on the HF directory: the same f32 values); the misreadings
miss by more: ggml's rounded YaRN ramp (its truncate) 8.4, gate and up swapped 4.7.

"Softmax over all experts" is the control without renormalising the chosen weights: renormalised,
a softmax over all then the top-k equals a softmax over the top-k, the same maths.
"""

import dataclasses
import math

import numpy as np
import pytest
from block_edits import with_attention, with_ffn
from hf_oracle import hf_logits
from llama_convert import convert

from fuelcli.assembly import reference
from fuelcli.assembly.forward_paths import logits_by_path
from fuelcli.assembly.loader import open_model
from fuelcli.backends import make_engine
from fuelcli.errors import ConfigError, InputError
from fuelcli.model.config import from_hf_config
from fuelcli.model.rope import inv_freq

TOL = 1e-4
SEQ = 40


@pytest.fixture(scope="module")
def oracle(tiny):
    d = tiny("gpt_oss")
    model = open_model(str(d))
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, SEQ).tolist()
    return model, ids, hf_logits(d, ids)


def max_diff(model, ids, ref) -> float:
    return float(np.abs(logits_by_path(model, ids, "reference") - ref).max())


def test_reference_matches_transformers(oracle):
    model, ids, ref = oracle
    assert model.cfg.windows == (8, 0, 8, 0) and SEQ > 8
    assert model.cfg.rope.type == "yarn" and not model.cfg.rope.truncate
    assert max_diff(model, ids, ref) <= TOL


def _unclamped_swiglu(gate, up, limit, alpha):
    return (up + 1) * (gate * reference.sigmoid(gate * np.float32(alpha)))


@pytest.mark.parametrize("brk", ["sinks dropped", "clamp dropped", "router bias dropped",
                                 "softmax over all experts", "no window"])
def test_negative_control_fails(oracle, brk, monkeypatch):
    model, ids, ref = oracle
    cfg = model.cfg
    if brk == "sinks dropped":
        cfg = with_attention(cfg, sinks=False)
    elif brk == "clamp dropped":
        monkeypatch.setattr(reference, "clamped_swiglu", _unclamped_swiglu)
    elif brk == "router bias dropped":
        cfg = with_ffn(cfg, router_bias=False)
    elif brk == "softmax over all experts":
        cfg = with_ffn(cfg, router="softmax")
    else:
        cfg = with_attention(cfg, window=0)
    assert not cfg.norm_topk_prob
    # the loaded weights with the edited blocks (a reloaded model would refuse the unused sinks)
    assert float(np.abs(reference.forward(cfg, model.weights, ids) - ref).max()) > 100 * TOL


def test_engines_refuse_in_one_line(oracle):
    model, ids, _ = oracle
    for path in ("prefill", "decode"):
        with pytest.raises(InputError, match=r"^the cpu backend does not run .* \(layer 0 of this gpt_oss model\); "
                                             r"only the reference forward runs it so far") as e:
            logits_by_path(model, ids, path)
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="^the cuda backend does not run ") as e:
        make_engine(model.cfg, model.weights, n_ctx=8, device="cuda")
    assert "\n" not in str(e.value)


_MINIMAL = {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}


def test_config_defaults_follow_transformers():
    """Without layer_types every even layer is windowed (128); without any RoPE key, transformers'
    default YaRN (factor 32 over 4096, truncate false): the same inverse frequencies and factor
    (1.347)."""
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = from_hf_config(dict(_MINIMAL))
    assert cfg.windows == (128, 0, 128, 0)
    assert cfg.num_experts == 128 and cfg.experts_per_tok == 4 and cfg.moe_intermediate_size == 32
    theirs = GptOssConfig(**{k: v for k, v in _MINIMAL.items() if k != "model_type"})
    want, factor = ROPE_INIT_FUNCTIONS["yarn"](theirs)
    assert math.isclose(cfg.rope.attention_factor, factor)
    # within 1 ulp: torch's float32 pow (model/rope.py's powers)
    np.testing.assert_array_max_ulp(inv_freq(cfg.rope, cfg.head_dim), want.numpy(), maxulp=1)


def test_hub_mxfp4_checkpoints_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="quantization_config=.* is not supported by fuel"):
        from_hf_config({**_MINIMAL, "quantization_config": {"quant_method": "mxfp4"}})


def test_mask_plan_shows_sinks(oracle):
    from fuelcli.model.plan import layer_plans

    model, _, _ = oracle
    assert [lp.attention for lp in layer_plans(model.cfg)] == ["window 8 + sinks", "full + sinks"] * 2


@pytest.fixture(scope="module")
def converted(tiny, llama_converter, tmp_path_factory):
    d = tiny("gpt_oss_limit7")
    out = tmp_path_factory.mktemp("gguf") / "gpt_oss.gguf"
    convert(llama_converter, [(d, out)])
    model = open_model(str(out))
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, SEQ).tolist()
    return model, ids, hf_logits(d, ids)


def test_what_the_gguf_says(converted):
    model, _, _ = converted
    cfg = model.cfg
    assert cfg.family == "gpt_oss" and cfg.windows == (8, 0, 8, 0)
    assert cfg.rope.type == "yarn" and not cfg.rope.truncate and cfg.rope.original_max_position == 32
    ffn = cfg.blocks[0].ffn
    assert (ffn.router, ffn.router_bias, ffn.expert_bias, ffn.swiglu_limit) == ("topk_softmax", True, True, 7.0)
    assert {"blk.0.attn_sinks.weight", "blk.0.ffn_gate_inp.bias", "blk.0.ffn_gate_exps.bias",
            "blk.0.post_attention_norm.weight"} <= set(model.gguf.tensors)


def test_gguf_matches_transformers_on_the_source(converted):
    model, ids, ref = converted
    assert max_diff(model, ids, ref) <= TOL


def _gate_and_up_swapped(weights):
    layers = [dataclasses.replace(w, gate_exps=w.up_exps, up_exps=w.gate_exps) for w in weights.layers]
    return dataclasses.replace(weights, layers=layers)


@pytest.mark.parametrize("brk", ["ggml's rounded YaRN ramp", "gate and up swapped"])
def test_gguf_negative_control_fails(converted, brk):
    model, ids, ref = converted
    cfg, weights = model.cfg, model.weights
    if brk == "gate and up swapped":
        weights = _gate_and_up_swapped(weights)
    else:
        cfg = with_attention(cfg, rope=lambda r: dataclasses.replace(r, truncate=True))
    assert float(np.abs(reference.forward(cfg, weights, ids) - ref).max()) > 100 * TOL


def test_bf16_checkpoint_matches_transformers_reading_it(tiny):
    """bf16 experts stored transposed: turned on load two bytes an element."""
    d = tiny("gpt_oss", dtype="bfloat16")
    model = open_model(str(d))
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, SEQ).tolist()
    assert model.weights.layers[0].gate_exps[0].fmt == "bf16"
    assert max_diff(model, ids, hf_logits(d, ids)) <= TOL


@pytest.mark.parametrize("change, says", [
    ({"swiglu_limit": 0}, "swiglu_limit must be > 0"),
    ({"num_experts_per_tok": 9, "num_local_experts": 8}, "num_experts_per_tok=9 must be in 1..num_local_experts=8"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention", "full_attention"]},
     "layer_types entries"),
])
def test_bad_configs_are_refused_in_one_line(change, says):
    with pytest.raises(ConfigError, match=says) as e:
        from_hf_config({**_MINIMAL, **change})
    assert "\n" not in str(e.value)
