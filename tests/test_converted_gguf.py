"""GGUF files as users' are written: llama.cpp's own converter (tests/llama_convert.py) turns the
tiny HF checkpoints of the families whose GGUF form differs from their HF form into f32 GGUFs, and
fuel's three paths on each GGUF must match transformers on the HF directory it came from, each with
a negative control that misreads what the GGUF form says.

What each case checks of the GGUF form:
  llama31         llama3 RoPE scaling as a rope_freqs tensor (one divisor per frequency); q/k permuted
  mixtral         arch llama with stacked expert tensors (ffn_*_exps) -> the Mixtral family
  smollm3         arch smollm3: every 4th layer without RoPE (llama.cpp's rule, no key says it)
  qwen2_yarn      rope.scaling.type yarn with its factor and original context
  gemma3_6layers  arch gemma3: norms stored as 1 + w, sliding_window, 5 local : 1 global by default
  phi3_longrope   arch phi3: q|k|v and gate|up fused; LongRoPE's factors as tensors, its original
                  context and attention factor as keys

Tolerance: test_decoder_oracle's tol(case) (max|Δ| of the logits: 1e-4, 2e-4 for llama31 and
smollm3). Measured here (decode / prefill / reference), as on the HF directories: llama31 8.4e-5 /
4.2e-5 / 8.1e-5, smollm3 7.5e-5 / 8.0e-5 / 7.6e-5, gemma3_6layers 3.6e-5 / 4.2e-5 / 2.9e-5, qwen2_yarn
3.1e-5 / 1.6e-5 / 2.8e-5, mixtral 2.7e-5 / 1.5e-5 / 2.4e-5, phi3_longrope 2.6e-5 / 1.4e-5 / 1.4e-5.
The broken readings miss by 1e-1 or more.
"""

import dataclasses

import numpy as np
import pytest
from block_edits import with_attention
from hf_oracle import hf_logits
from llama_convert import convert
from test_decoder_oracle import tokens, tol

from fuelcli.assembly.forward_paths import PATHS, logits_by_path
from fuelcli.model.rope import RopeConfig
from fuelcli.assembly.loader import open_model

CASES = ("llama31", "mixtral", "smollm3", "qwen2_yarn", "gemma3_6layers", "phi3_longrope")
WRITE = {"llama31": {"legacy_rope": True}}  # the hub shape the converter reads best


@pytest.fixture(scope="module")
def converted(tiny, llama_converter, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf")
    dirs = {case: tiny(case, **WRITE.get(case, {})) for case in CASES}
    convert(llama_converter, [(dirs[c], out / f"{c}.gguf") for c in CASES])
    cache = {}

    def get(case):
        if case not in cache:
            model = open_model(str(out / f"{case}.gguf"))
            ids = tokens(model.cfg.vocab_size)
            cache[case] = (model, ids, hf_logits(dirs[case], ids))
        return cache[case]

    return get


def test_what_the_files_say(converted):
    llama = converted("llama31")[0]
    assert llama.cfg.family == "llama" and llama.cfg.rope.type == "factors" and "rope_freqs.weight" in llama.gguf.tensors
    assert converted("mixtral")[0].cfg.family == "mixtral"
    assert [b.attention.rope is None for b in converted("smollm3")[0].cfg.blocks] == [False, False, False, True]
    assert converted("qwen2_yarn")[0].cfg.rope.type == "yarn"
    gemma = converted("gemma3_6layers")[0].cfg
    assert gemma.windows == (4, 4, 4, 4, 4, 0) and {b.attention.rope.theta for b in gemma.blocks} == {1e4, 1e6}
    phi = converted("phi3_longrope")[0].cfg.rope
    assert phi.type == "longrope" and phi.original_max_position == 16 and len(phi.long_factors) == 8


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES)
def test_matches_transformers_on_the_source(converted, case, path):
    model, ids, ref = converted(case)
    assert float(np.abs(logits_by_path(model, ids, path) - ref).max()) <= tol(case)


def _norm_shift_kept(model):
    """Gemma's GGUF norms read as HF ones: 1 added to a weight that already holds 1 + w."""
    w = model.weights

    def plus_one(v):
        return None if v is None else (v + np.float32(1)).astype(np.float32)

    fields = ("attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm", "q_norm", "k_norm")
    layers = [dataclasses.replace(layer, **{f: plus_one(getattr(layer, f)) for f in fields}) for layer in w.layers]
    return model.cfg, dataclasses.replace(w, layers=layers, final_norm=plus_one(w.final_norm))


BREAKS = {
    "llama31": lambda m: (with_attention(m.cfg, rope=lambda r: RopeConfig(theta=r.theta)), m.weights),  # rope_freqs ignored
    "mixtral": lambda m: (dataclasses.replace(m.cfg, norm_topk_prob=False), m.weights),  # Qwen3-MoE's default routing
    "smollm3": lambda m: (with_attention(m.cfg, rope=m.cfg.blocks[0].attention.rope), m.weights),  # RoPE everywhere
    "qwen2_yarn": lambda m: (with_attention(m.cfg, rope=lambda r: RopeConfig(theta=r.theta)), m.weights),
    "gemma3_6layers": _norm_shift_kept,
    "phi3_longrope": lambda m: (with_attention(m.cfg, rope=lambda r: dataclasses.replace(r, long_factors=r.factors)),
                                m.weights),  # the short factors past the original context
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES)
def test_negative_control_fails(converted, case, path):
    model, ids, ref = converted(case)
    cfg, weights = BREAKS[case](model)
    broken = dataclasses.replace(model, cfg=cfg)
    broken.__dict__["weights"] = weights
    assert float(np.abs(logits_by_path(broken, ids, path) - ref).max()) > 100 * tol(case)
