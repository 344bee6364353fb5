"""fuel's three paths (decode through the KV cache, batched prefill, numpy reference) against
transformers' eager f32 logits on tiny random checkpoints of every family, each with a negative
control that breaks one semantic and must fail the same comparison.

Tolerance: max|Δ| over all positions and the vocabulary ≤ TOL. Measured on these models (logits of
magnitude ~10-30): reference 0.9e-5..8.2e-5, prefill/decode 1.1e-5..7.2e-5 (llama31 and qwen2_window
largest); TOL leaves ~2.5x headroom. The broken variants miss by 1e-1 or more.
"""

import dataclasses

import numpy as np
import pytest
from block_edits import inverted_windows, with_attention
from hf_oracle import hf_logits

from fuelcli.loader import open_model
from fuelcli.rope import RopeConfig
from fuelcli.forward_paths import PATHS, logits_by_path

TOL = 2e-4
SEQ = 24  # longer than every window (4) and the llama31 original context bands (32 > SEQ is fine: wavelengths 6..1425)


def tokens(vocab: int, n: int = SEQ, seed: int = 0) -> list:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def max_diff(model, ids, path, ref) -> float:
    return float(np.abs(logits_by_path(model, ids, path) - ref).max())


BREAKS = {
    "window direction inverted": inverted_windows,
    "dense routing over all experts": lambda c: dataclasses.replace(c, experts_per_tok=c.num_experts,
                                                                    norm_topk_prob=False),
    "renorm flipped": lambda c: dataclasses.replace(c, norm_topk_prob=not c.norm_topk_prob),
    "unscaled RoPE": lambda c: with_attention(c, rope=lambda r: RopeConfig(theta=r.theta)),
    "QK-norm skipped": lambda c: with_attention(c, qk_norm=False),  # with the weights' norms dropped
    "biases dropped": lambda c: with_attention(c, qkv_bias=False, o_bias=False),  # and the bias vectors
    "rope_theta misread": lambda c: with_attention(c, rope=lambda r: dataclasses.replace(r, theta=r.theta * 10)),
}

CASES = {
    # case: (write_tiny kwargs, the negative controls that apply)
    "qwen2_window": ({}, ["window direction inverted"]),
    "qwen2_window_legacy": ({}, ["window direction inverted"]),
    "qwen3_bias_headdim": ({}, ["QK-norm skipped", "biases dropped"]),
    "qwen3_moe_norm_false": ({}, ["dense routing over all experts", "renorm flipped"]),
    "qwen3_moe_norm_true": ({"legacy_moe_key": True}, ["dense routing over all experts", "renorm flipped"]),
    "llama31": ({"legacy_rope": True}, ["unscaled RoPE"]),
    "llama2": ({"legacy_rope": "type"}, ["rope_theta misread"]),
}


@pytest.fixture(scope="module")
def oracle(tiny):
    cache = {}

    def get(case):
        if case not in cache:
            d = tiny(case, **CASES[case][0])
            model = open_model(str(d))
            ids = tokens(model.cfg.vocab_size)
            cache[case] = (model, ids, hf_logits(d, ids))
        return cache[case]

    return get


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(oracle, case, path):
    model, ids, ref = oracle(case)
    assert max_diff(model, ids, path, ref) <= TOL


NEGATIVE = [(case, brk) for case, (_, breaks) in CASES.items() for brk in breaks]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case, brk", NEGATIVE)
def test_negative_control_fails(oracle, case, brk, path):
    model, ids, ref = oracle(case)
    broken = dataclasses.replace(model, cfg=BREAKS[brk](model.cfg))
    # the same weights, less whatever the broken config no longer reads
    drop = {"QK-norm skipped": ("q_norm", "k_norm"), "biases dropped": ("q_bias", "k_bias", "v_bias", "o_bias")}
    layers = [dataclasses.replace(layer, **{f: None for f in drop.get(brk, ())}) for layer in model.weights.layers]
    broken.__dict__["weights"] = dataclasses.replace(model.weights, layers=layers)
    assert max_diff(broken, ids, path, ref) > 100 * TOL


def test_plan_of_the_window_cases(oracle):
    for case in ("qwen2_window", "qwen2_window_legacy"):
        cfg = oracle(case)[0].cfg
        assert cfg.windows == (0, 0, 4, 4), case  # transformers: layers >= max_window_layers=2
    moe = oracle("qwen3_moe_norm_false")[0].cfg
    assert moe.moe_layers == (False, True, False, False)


def test_bf16_checkpoint_stays_bf16(tiny):
    d = tiny("llama2", dtype="bfloat16")
    model = open_model(str(d))
    assert {t.fmt for t in model.weights.tensors()} == {"bf16"}
    ids = tokens(model.cfg.vocab_size)
    assert max_diff(model, ids, "decode", hf_logits(d, ids)) <= TOL


def test_sharded_checkpoint_matches_the_single_file(tiny, tmp_path):
    """model.safetensors.index.json + shards, as hub checkpoints over a few GB come."""
    import json

    from safetensors.numpy import load_file, save_file

    d = tiny("qwen2_window")
    tensors = load_file(str(d / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    out = tmp_path / "sharded"
    out.mkdir()
    for f in ("config.json", "generation_config.json"):
        (out / f).write_text((d / f).read_text())
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(out / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    ids = tokens(256)
    single = logits_by_path(open_model(str(d)), ids, "prefill")
    assert np.array_equal(logits_by_path(open_model(str(out)), ids, "prefill"), single)
