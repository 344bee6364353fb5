"""Qwen3.5 and Qwen3-Next as users' files hold them: the hub's Qwen3.5 vision-language wrappers
(qwen3_5, qwen3_5_moe: the decoder under text_config and model.language_model., beside a vision
tower and an MTP head that are not run) and the GGUFs llama.cpp's converter writes from them and
from Qwen3-Next (qwen35, qwen35moe, qwen3next). fuel's reference forward on each must match
transformers f32 on the HF checkpoint within test_qwen3_5's tolerances (80 tokens: the chunked
delta rule crosses a chunk boundary), and each transform left undone must fail the same comparison.

The tiny wrappers hold the text cases' weights (transformers' own logits on them equal the text
model's exactly); every case has 2 key heads and 4 value heads, so the converter reorders
Qwen3.5's value heads. Measured, max|Δ| (reference against transformers on the HF checkpoint):
qwen3_5 wrapper 5.0e-5, GGUF 5.1e-5; qwen3_5_moe wrapper 9.3e-4, GGUF 9.3e-4 (transformers' own
f32 noise, test_qwen3_5); qwen3_next GGUF 1.8e-4. The broken GGUF readings miss by 20 or more
(logits up to ~20).
"""

import dataclasses

import numpy as np
import pytest
from hf_oracle import hf_logits
from llama_convert import convert
from test_qwen3_5 import SEQ, tol

from fuelcli.assembly.forward_paths import logits_by_path
from fuelcli.assembly.loader import open_model
from fuelcli.errors import ConfigError
from fuelcli.families import FAMILIES
from fuelcli.families.schema import Elementwise, Regroup
from fuelcli.formats import dequantize, quantize
from fuelcli.model.config import from_hf_config
from fuelcli.weights.build import _regroup
from fuelcli.weights.gguf_model import config_from_gguf
from fuelcli.weights.tensor import Tensor

CASES = {"qwen3_5": "qwen3_5_wrapped", "qwen3_5_moe": "qwen3_5_moe_wrapped", "qwen3_next": "qwen3_next"}
WRAPPERS = ("qwen3_5", "qwen3_5_moe")
TEXT_FAMILY = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "qwen3_next": "qwen3_next"}


@pytest.fixture(scope="module")
def files(tiny, llama_converter, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf")
    dirs = {case: tiny(source) for case, source in CASES.items()}
    convert(llama_converter, [(dirs[c], out / f"{c}.gguf") for c in CASES])
    ids = np.random.default_rng(1).integers(0, 256, SEQ).tolist()
    return lambda case: (dirs[case], out / f"{case}.gguf", ids, hf_logits(dirs[case], ids))


def max_diff(model, ids, ref) -> float:
    return float(np.abs(logits_by_path(model, ids, "reference") - ref).max())


@pytest.mark.parametrize("case", WRAPPERS)
def test_wrapper_reads_its_text_model(files, tiny, case):
    d, _, ids, ref = files(case)
    assert np.array_equal(ref, hf_logits(tiny(case), ids))  # transformers: the wrapper is its text model
    model = open_model(str(d))
    assert model.cfg.family == case
    assert model.cfg.not_run == ("the multi-token-prediction head (mtp.*), the vision tower (model.visual.*): "
                                 "not run")
    assert max_diff(model, ids, ref) <= tol(case)


@pytest.mark.parametrize("case", CASES)
def test_gguf_matches_transformers_on_the_source(files, case):
    _, gguf, ids, ref = files(case)
    model = open_model(str(gguf))
    assert model.cfg.family == TEXT_FAMILY[case] and model.cfg.num_layers == 4
    assert model.cfg.not_run == "the multi-token-prediction head (blk.4): not run"
    assert [b.linear is not None for b in model.cfg.blocks] == [True, True, True, False]
    assert model.cfg.linear.v_heads == 2 * model.cfg.linear.k_heads and model.cfg.blocks[3].attention.rotary_dim == 4
    assert max_diff(model, ids, ref) <= tol(case)


def _without(kind):
    """The family's weights with one kind of GGUF transform left out."""
    def edit(schema):
        layer = tuple(dataclasses.replace(w, undo={"gguf": tuple(s for s in w.undo.get("gguf", ())
                                                                 if not isinstance(s, kind))}) for w in schema.layer)
        return dataclasses.replace(schema, layer=layer)
    return edit


BREAKS = {
    "value heads left tiled": _without(Regroup),
    "A read as A_log": _without(Elementwise),
    "norms read without the file's 1 +": lambda schema: dataclasses.replace(schema, gguf_norm_shift=0.0),
}
# qwen3next files keep HF's value-head order: nothing to leave tiled
GGUF_BREAKS = [(case, brk) for case in CASES for brk in BREAKS if (case, brk) != ("qwen3_next", "value heads left tiled")]


@pytest.mark.parametrize("case,brk", GGUF_BREAKS)
def test_negative_control_fails(files, case, brk, monkeypatch):
    _, gguf, ids, ref = files(case)
    family = FAMILIES[TEXT_FAMILY[case]]
    monkeypatch.setitem(FAMILIES, family.model_type,
                        dataclasses.replace(family, weights=BREAKS[brk](family.weights)))
    assert max_diff(open_model(str(gguf)), ids, ref) > 100 * tol(case)


def test_qwen3_next_qkv_is_regathered(files, monkeypatch):
    """in_proj_qkvz split per key head but q, k, v left in each head's turn must fail."""
    d, _, ids, ref = files("qwen3_next")
    family = FAMILIES["qwen3_next"]
    layer = tuple(dataclasses.replace(w, undo={**w.undo, "hf": ()}) for w in family.weights.layer)
    monkeypatch.setitem(FAMILIES, "qwen3_next",
                        dataclasses.replace(family, weights=dataclasses.replace(family.weights, layer=layer)))
    assert max_diff(open_model(str(d)), ids, ref) > 100 * tol("qwen3_next")


@pytest.mark.parametrize("fmt", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("unit", [32, 16])  # columns: whole q8_0 blocks move as bytes; half blocks widen to f32
@pytest.mark.parametrize("axis", [0, 1])
def test_regroup_in_any_format(fmt, unit, axis):
    a = np.random.default_rng(3).standard_normal((128, 128)).astype(np.float32)
    t = Tensor("w", fmt, a.shape, quantize(fmt, a))
    order = [1, 0, 3, 2] if unit == 32 else [5, 4, 3, 2, 1, 0]
    start = 128 - unit * len(order)
    r = Regroup(unit=lambda c: unit, order=lambda c: order, start=lambda c: start, axis=axis)
    stored = np.moveaxis(dequantize(t), axis, 0)
    want = np.concatenate([stored[:start]] + [stored[start + unit * u:start + unit * (u + 1)] for u in order])
    got = _regroup(t, r, None)
    assert got.fmt == (fmt if axis == 0 or unit % t.format.block_elems == 0 else "f32")
    assert np.array_equal(dequantize(got), np.moveaxis(want, 0, axis)) and not got.data.flags.writeable


def _wrapper(**top):
    text = {"model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
            "linear_key_head_dim": 8, "linear_value_head_dim": 12, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "tie_word_embeddings": False}
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
            "vision_config": {"depth": 1}, **top}


def test_wrapper_config_is_its_text_config():
    cfg = from_hf_config(_wrapper(eos_token_id=7))
    assert cfg.family == "qwen3_5" and cfg.hidden_size == 64 and cfg.linear.v_heads == 4
    assert cfg.eos_token_ids == (7,) and not cfg.tie_embeddings
    with pytest.raises(ConfigError, match="needs a text_config object"):
        from_hf_config({**_wrapper(), "text_config": None})
    with pytest.raises(ConfigError, match="tie_word_embeddings is True but text_config.tie_word_embeddings is False"):
        from_hf_config(_wrapper(tie_word_embeddings=True))


def _qwen35_meta(**change):
    keys = {"block_count": 5, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.key_length": 16, "attention.value_length": 16,
            "vocab_size": 256, "nextn_predict_layers": 1, "ssm.conv_kernel": 4, "ssm.state_size": 8,
            "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 48,
            "attention.recurrent_layers": [True, True, True, False, False], "rope.dimension_count": 4, **change}
    return {"general.architecture": "qwen35", **{f"qwen35.{k}": v for k, v in keys.items()}}


def test_gguf_keys_read_and_refused():
    cfg = from_hf_config(config_from_gguf(_qwen35_meta(), ["output.weight"]), source="gguf")
    assert cfg.num_layers == 4 and cfg.linear.v_head_dim == 12 and cfg.blocks[3].attention.rotary_dim == 4
    assert [b.linear is None for b in cfg.blocks] == [False, False, False, True]
    for change, message in (({"ssm.inner_size": 50}, "qwen35.ssm.inner_size=50 is not a multiple"),
                            ({"nextn_predict_layers": 5}, "nextn_predict_layers=5 leaves no layers"),
                            ({"attention.recurrent_layers": [1, 1, 1, 0, 0]}, "must be an array of booleans")):
        with pytest.raises(ConfigError, match=message):
            from_hf_config(config_from_gguf(_qwen35_meta(**change), ["output.weight"]), source="gguf")
