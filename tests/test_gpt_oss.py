"""gpt-oss (attention sinks, alternating windowed and full layers, q/k/v/o biases, YaRN; a MoE whose
router has a bias and takes the softmax over its top-k, experts with biases and the clamped SwiGLU):
fuel's three logits paths (the reference forward, the CPU engine's prefill and its decode) against
transformers' eager f32 logits on a tiny random checkpoint, with negative controls that drop one
piece each and must fail the same comparison.

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

The CPU engine, max|Δ| against transformers f32 / f64 on the same 40 tokens: prefill 2.9e-5 / 6.4e-5,
decode 7.2e-5 / 3.2e-5 (TOL). Its controls miss alike on both paths: the sinks' weights dropped 8.9,
the clamp's limit made f32's largest 3.1, the router's bias dropped 0.15. At the tiny model's whole
context (256 tokens, decode steps from position 239 attending in two key runs whose combine adds the
sinks) transformers' own f32 is 1.3e-4 from its f64, and fuel's paths are 1.2e-4 (reference), 1.3e-4
(prefill) and 2.3e-4 (decode) from it, each within 2.0e-4 of f64: LONG_TOL 3e-4 there. The
converted GGUF on the engine: prefill 4.1e-5, decode 8.6e-5. Two sequences stepped together (serve
--parallel) give each one's logits alone bit for bit here (1e-5 allowed); a second turn after a
rewind is 5.2e-6 from a fresh prefill (the prompt tiled in other chunks).

MXFP4: llama.cpp's quantiser (MXFP4_MOE: experts MXFP4, the other matrices q8_0) on the converted
file; the engine against the reference on that file, largest KL over positions 1.3e-6 on both paths
(max|Δ| 6e-3 on logits up to 10: the int16 activations' rounding, as q8_0 alone gives 4e-3), top-1
equal; against transformers on the f32 source the KL is 0.28 (the control: the quantisation).

"Softmax over all experts" is the control without renormalising the chosen weights: renormalised,
a softmax over all then the top-k equals a softmax over the top-k, the same maths.
"""

import dataclasses
import math
import subprocess
import sys

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
LONG_TOL = 3e-4  # 256 tokens: transformers' own f32 is 1.3e-4 from its f64 there
MXFP4_KL = 1e-4
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


def test_cuda_refuses_in_one_line(oracle):
    model, _, _ = oracle
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


# ---------------------------------------------------------------- the CPU engine (prefill and decode)


def engine_diff(model, ids, ref, path) -> float:
    return float(np.abs(logits_by_path(model, ids, path) - ref).max())


@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_engine_matches_transformers(oracle, path):
    model, ids, ref = oracle
    assert engine_diff(model, ids, ref, path) <= TOL


def _without(weights, role):
    return dataclasses.replace(weights, layers=[dataclasses.replace(w, **{role: None}) for w in weights.layers])


@pytest.mark.parametrize("path", ["prefill", "decode"])
@pytest.mark.parametrize("brk", ["sinks dropped", "clamp dropped", "router bias dropped"])
def test_engine_negative_control_fails(oracle, path, brk):
    """The engine reads the sinks and biases where the weights have them: a control drops the
    weight; the clamp's limit becomes f32's largest (a clamp that never bites)."""
    model, ids, ref = oracle
    cfg, weights = model.cfg, model.weights
    if brk == "sinks dropped":
        weights = _without(weights, "sinks")
    elif brk == "clamp dropped":
        cfg = with_ffn(cfg, swiglu_limit=float(np.finfo(np.float32).max))
    else:
        weights = _without(weights, "router_bias")
    engine = make_engine(cfg, weights, n_ctx=len(ids))
    got = engine.prefill(ids, all_logits=True) if path == "prefill" else np.stack([engine.decode(t) for t in ids])
    assert float(np.abs(got - ref).max()) > 100 * TOL


def test_decode_in_key_runs_with_sinks(tiny, monkeypatch):
    """From position 239 a decode step's full-attention keys run in two parallel runs (matmul.
    attention_splits; scratch for 4 runs whatever the machine's threads), whose combine adds the
    sinks: decode to the tiny model's whole context (256) and prefill, which attends in one run,
    against transformers, at LONG_TOL (module docstring)."""
    from fuelcli.backends.cpu import activations
    from fuelcli.backends.cpu.matmul import attention_splits

    d = tiny("gpt_oss")
    model = open_model(str(d))
    ids = np.random.default_rng(2).integers(0, model.cfg.vocab_size, model.cfg.max_position).tolist()
    ref = hf_logits(d, ids)
    monkeypatch.setattr(activations, "attention_splits", lambda cfg, pool: 4)
    engine = make_engine(model.cfg, model.weights, n_ctx=len(ids))
    engine.prefill(ids[:-40])
    decoded = np.stack([engine.decode(t) for t in ids[-40:]])
    assert attention_splits(1, len(ids) - 1, 0, model.cfg.num_kv_heads, 4) == 2
    assert float(np.abs(decoded - ref[-40:]).max()) <= LONG_TOL
    assert float(np.abs(logits_by_path(model, ids, "prefill") - ref).max()) <= LONG_TOL


@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_gguf_on_the_engine_matches_transformers(converted, path):
    model, ids, ref = converted
    assert engine_diff(model, ids, ref, path) <= TOL


QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.allow_requantize, p.nthread = int(sys.argv[3]), True, 1
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""
MXFP4_MOE = 38  # llama_ftype LLAMA_FTYPE_MOSTLY_MXFP4_MOE: the experts MXFP4, as gpt-oss's GGUFs are


@pytest.fixture(scope="module")
def mxfp4(tiny, llama_converter, tmp_path_factory):
    """The converted f32 GGUF quantised by llama.cpp's own quantiser (MXFP4_MOE), as users' files are."""
    pytest.importorskip("llama_cpp")
    d = tiny("gpt_oss_limit7")
    tmp = tmp_path_factory.mktemp("mxfp4")
    src, dst = tmp / "f32.gguf", tmp / "mxfp4.gguf"
    convert(llama_converter, [(d, src)])
    r = subprocess.run([sys.executable, "-c", QUANTIZE, str(src), str(dst), str(MXFP4_MOE)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    model = open_model(str(dst))
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, SEQ).tolist()
    return model, ids, hf_logits(d, ids)


def _kl(ref, got) -> float:
    def logp(x):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lr, lg = logp(ref), logp(got)
    return float((np.exp(lr) * (lr - lg)).sum(-1).max())


@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_mxfp4_experts_on_the_engine(mxfp4, path):
    """MXFP4 experts (the rest q8_0, llama.cpp's choice for MXFP4_MOE) on the engine against the
    reference on the same file (its numpy decode): the int16 activations' rounding only (test_quant_
    types.py's criterion). Control: the f32 source's logits are far from them (the quantisation)."""
    model, ids, hf = mxfp4
    assert {model.weights.layers[0].gate_exps[0].fmt, model.weights.layers[0].down_exps[0].fmt} == {"mxfp4"}
    ref = logits_by_path(model, ids, "reference")
    got = logits_by_path(model, ids, path)
    assert _kl(ref, got) <= MXFP4_KL and np.array_equal(ref.argmax(-1), got.argmax(-1))
    assert _kl(hf, got) > 100 * MXFP4_KL


def _engine(model, slots=1):
    return make_engine(model.cfg, model.weights, n_ctx=128, slots=slots)


def test_parallel_slots_step_as_one_sequence(oracle):
    """Two sequences stepped side by side (serve --parallel: prompts in one step, then their next
    tokens in one) give each one's logits alone."""
    model, ids, _ = oracle
    prompts = [ids[:21], ids[15:38]]
    alone = []
    for p in prompts:
        e = _engine(model)
        first = e.prefill(p[:-1])
        alone.append((first, e.decode(p[-1])))
    e = _engine(model, slots=2)
    firsts = e.step([(s, p[:-1]) for s, p in enumerate(prompts)])
    nexts = e.step([(s, [p[-1]]) for s, p in enumerate(prompts)])
    for (a_first, a_next), first, nxt in zip(alone, firsts, nexts):
        assert float(np.abs(a_first - first).max()) <= 1e-5 and float(np.abs(a_next - nxt).max()) <= 1e-5


def test_a_rewind_and_a_second_turn(oracle):
    """A second turn after a rewind into the first reply equals a fresh run over the conversation."""
    model, ids, _ = oracle
    first, reply, second = ids[:20], ids[20:26], ids[26:40]
    fresh = _engine(model).prefill(first + reply + second)
    e = _engine(model)
    e.prefill(first)
    for t in reply:
        e.decode(t)
    kept = e.rewind(len(first) + 3)
    assert kept == len(first) + 3
    assert float(np.abs(e.prefill((first + reply + second)[kept:]) - fresh).max()) <= 1e-5


def test_speculative_greedy_is_plain_decoding(oracle):
    """Lookup decoding and a draft model (the model drafting for itself) give plain greedy
    decoding's tokens (verify steps and the rewinds after them)."""
    from fuelcli.text import speculative as S
    from fuelcli.text.generate import Sampler, SamplerParams, Stats, sample_steps

    model, ids, _ = oracle
    prompt = (ids[:12] * 3)[:32]  # repeats: the lookup finds n-grams
    greedy = SamplerParams(temp=0.0, top_k=0, top_p=1.0, min_p=0.0)

    def run(spec=None):
        engine = _engine(model)
        steps = sample_steps if spec is None else spec.steps
        stats = Stats()
        return [s.token for s in steps(engine, prompt, 24, Sampler(greedy), set(), stats)], stats

    plain, _ = run()
    tokens, stats = run(S.lookup(4))
    assert tokens == plain and stats.drafted > 0
    tokens, stats = run(S.draft_model(_engine(model), model.cfg.vocab_size, greedy, 4, p_min=0.0))
    assert tokens == plain and stats.accepted > 0
