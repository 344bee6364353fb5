"""`fuel inspect mask-plan|config|weights|rope` on the tiny checkpoints (and the SmolLM2 GGUF when it
is already in the test cache): the JSON values, the tables, and that mask-plan reads no weights."""

import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from fuelcli.cli import app
from fuelcli.errors import FuelError


def invoke(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, (FuelError, SystemExit)):
        raise r.exception
    code = r.exception.exit_code if isinstance(r.exception, FuelError) else r.exit_code
    return code, r.stdout


def inspect_json(what, model):
    code, out = invoke("inspect", what, model, "--json")
    assert code == 0, out
    return json.loads(out)


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight load fails: mask-plan, config and rope must not need one."""
    import fuelcli.weights.hf

    def boom(*a, **kw):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(fuelcli.weights.hf, "load_hf_weights", boom)


def test_mask_plan_qwen2_window(tiny, no_weights):
    d = tiny("qwen2_window")
    t0 = time.perf_counter()
    v = inspect_json("mask-plan", d)
    assert time.perf_counter() - t0 < 1.0
    assert [r["attention"] for r in v["layers"]] == ["full", "full", "window 4", "window 4"]
    assert [r["mask"] for r in v["layers"]] == ["causal", "causal", "window4", "window4"]
    assert [r["ffn"] for r in v["layers"]] == ["dense"] * 4
    assert v["num_variants"] == 2
    assert [(x["name"], x["layers"]) for x in v["variants"]] == [("causal", [0, 1]), ("window4", [2, 3])]
    assert "layer_types" in v["rule"]


def test_mask_plan_legacy_rule_and_table(tiny, no_weights):
    v = inspect_json("mask-plan", tiny("qwen2_window_legacy"))
    assert [r["window"] for r in v["layers"]] == [0, 0, 4, 4]
    assert "max_window_layers=2" in v["rule"] and "2–3" in v["rule"]
    code, out = invoke("inspect", "mask-plan", tiny("qwen2_window_legacy"))
    assert code == 0
    assert "2 distinct mask variants" in out and "layers 0–1" in out and "layers 2–3" in out
    assert "rule: use_sliding_window=true, max_window_layers=2" in out


def test_mask_plan_moe(tiny, no_weights):
    v = inspect_json("mask-plan", tiny("qwen3_moe_norm_false"))
    assert [r["ffn"] for r in v["layers"]] == ["dense", "MoE 2 of 8", "dense", "dense"]
    assert v["moe_layers"] == [1] and v["num_variants"] == 1
    code, out = invoke("inspect", "mask-plan", tiny("qwen3_moe_norm_false"))
    assert "MoE 2 of 8" in out and "1 distinct mask variant:" in out


def test_mask_plan_sinks_shared_kv_and_per_layer_inputs(tiny, no_weights, monkeypatch):
    """gpt-oss's sinks, Gemma 4 E2B's shared KV (which layer each reads) and per-layer inputs, in the
    JSON and the table; each family against the other's (qwen2's: none of them). The table is read at
    a width that keeps each cell on one line (at 80 columns "KV of layer 1" wraps)."""
    monkeypatch.setenv("COLUMNS", "300")
    oss = inspect_json("mask-plan", tiny("gpt_oss"))
    assert oss["sink_layers"] == [0, 1, 2, 3] and oss["shared_kv_layers"] == {}
    assert oss["per_layer_input_layers"] == []
    g4 = inspect_json("mask-plan", tiny("gemma4_e2b"))
    assert g4["sink_layers"] == [] and g4["shared_kv_layers"] == {"3": 1, "4": 1, "5": 2}
    assert g4["per_layer_input_layers"] == [0, 1, 2, 3, 4, 5]
    plain = inspect_json("mask-plan", tiny("qwen2_window"))
    assert (plain["sink_layers"], plain["shared_kv_layers"], plain["per_layer_input_layers"]) == ([], {}, [])
    code, out = invoke("inspect", "mask-plan", tiny("gpt_oss"))
    assert code == 0 and out.count("+ sinks") == 4
    code, out = invoke("inspect", "mask-plan", tiny("gemma4_e2b"))
    assert code == 0 and out.count("KV of layer 1") == 2 and out.count("KV of layer 2") == 1
    assert out.count("+ per-layer input") == 6


def test_mask_plan_gemma3_and_smollm3(tiny, no_weights):
    """The block properties per layer: Gemma 3's 5 local : 1 global pattern with its two RoPE bases and
    sandwich norms, SmolLM3's layer without RoPE; each against the other family's value."""
    v = inspect_json("mask-plan", tiny("gemma3_6layers"))
    assert [r["attention"] for r in v["layers"]] == ["window 4"] * 5 + ["full"]
    assert [(x["name"], x["layers"]) for x in v["variants"]] == [("window4", [0, 1, 2, 3, 4]), ("causal", [5])]
    assert [r["rope"] for r in v["layers"]] == ["θ=10000"] * 5 + ["θ=1e+06"]
    assert {r["norms"] for r in v["layers"]} == {"pre + post"} and v["nope_layers"] == []
    assert {r["ffn"] for r in v["layers"]} == {"dense GELU-tanh"}
    v = inspect_json("mask-plan", tiny("gemma3"))  # sliding_window_pattern 2 and a scaled global RoPE
    assert [r["window"] for r in v["layers"]] == [4, 0, 4]
    assert [r["rope"] for r in v["layers"]] == ["θ=100", "θ=10000 linear ×4", "θ=100"]
    assert v["rope_rule"] == "local layers θ=100, global layers θ=10000 linear ×4"
    v = inspect_json("mask-plan", tiny("smollm3"))
    assert [r["rope"] for r in v["layers"]] == ["θ=10000"] * 3 + ["none"] and v["nope_layers"] == [3]
    assert {r["norms"] for r in v["layers"]} == {"pre"} and {r["ffn"] for r in v["layers"]} == {"dense"}
    assert v["num_variants"] == 1 and "no_rope_layers" in v["rope_rule"]
    code, out = invoke("inspect", "mask-plan", tiny("smollm3"))
    assert code == 0 and "none" in out and "RoPE: no RoPE on layers 3 (no_rope_layers)" in out
    code, out = invoke("inspect", "mask-plan", tiny("gemma3"))
    assert code == 0 and "pre + post" in out and "GELU-tanh" in out and "window4" in out


def test_config_blocks_gemma3_and_smollm3(tiny, no_weights):
    rows = {r["name"]: r for r in inspect_json("config", tiny("gemma3"))["values"]}
    assert rows["windows"]["value"] == [4, 0, 4]
    assert rows["rope_layers"] == {"name": "rope_layers", "value": ["θ=100", "θ=10000 linear ×4", "θ=100"],
                                   "origin": "derived"}
    assert rows["sandwich_norms"] == {"name": "sandwich_norms", "value": True, "origin": "family"}
    assert rows["norm_offset"]["value"] == 1.0 and rows["qk_norm"]["value"] is True
    assert rows["activation"]["value"] == "gelu_tanh" and rows["embed_scale"]["value"] == 8.0  # sqrt(64)
    assert rows["attention_scale"]["value"] == pytest.approx(24 ** -0.5)  # query_pre_attn_scalar, not head_dim
    assert rows["final_softcap"] == {"name": "final_softcap", "value": 30.0, "origin": "config.json"}
    rows = {r["name"]: r for r in inspect_json("config", tiny("smollm3"))["values"]}
    assert rows["rope_layers"]["value"] == ["θ=10000"] * 3 + [None]
    assert rows["windows"]["value"] == [0, 0, 0, 0] and rows["sandwich_norms"]["value"] is False
    assert rows["norm_offset"]["value"] == 0.0 and rows["attention_scale"]["value"] is None
    assert "rope_layers" not in {r["name"] for r in inspect_json("config", tiny("llama2"))["values"]}  # one RoPE
    code, out = invoke("inspect", "config", tiny("smollm3"))
    assert code == 0 and '["θ=10000", "θ=10000",' in out and "\\u03b8" not in out  # θ, not its JSON escape


def test_config_origins(tiny, no_weights):
    v = inspect_json("config", tiny("llama31"))
    rows = {r["name"]: r for r in v["values"]}
    assert rows["hidden_size"] == {"name": "hidden_size", "value": 64, "origin": "config.json"}
    assert rows["rope.type"]["value"] == "llama3" and rows["rope.type"]["origin"] == "config.json"
    assert rows["rope.factor"]["value"] == 8.0
    assert rows["tie_embeddings"]["value"] is True
    assert rows["windows"] == {"name": "windows", "value": [0, 0], "origin": "derived"}
    assert rows["qkv_bias"]["origin"] == "family"
    assert rows["q_dim"]["value"] == 64 and rows["kv_dim"]["value"] == 32
    assert all(r["origin"] in {"config.json", "default", "derived", "family", "generation_config.json"}
               for r in v["values"])
    v = inspect_json("config", tiny("qwen3_moe_norm_false"))
    rows = {r["name"]: r for r in v["values"]}
    assert rows["moe_layers"]["value"] == [False, True, False, False]
    assert rows["num_experts"] == {"name": "num_experts", "value": 8, "origin": "config.json"}
    code, out = invoke("inspect", "config", tiny("qwen3_moe_norm_false"))
    assert "[false, true, false, false]" in out  # not swallowed as rich markup


def test_weights_table_and_params(tiny):
    import torch
    from transformers import AutoModelForCausalLM

    for case in ("llama31", "qwen3_moe_norm_false"):
        d = tiny(case)
        v = inspect_json("weights", d)
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        assert v["params"] == hf.num_parameters()  # tied embeddings counted once on both sides
        assert v["bytes"] == 4 * v["params"]
        assert v["formats"] == [{"format": "f32", "tensors": v["num_tensors"], "params": v["params"],
                                 "bytes": v["bytes"], "bits_per_weight": 32.0}]
    names = {r["name"]: r for r in v["tensors"]}
    assert names["model.layers.1.mlp.experts.7.down_proj.weight"]["shape"] == [64, 32]
    assert names["model.norm.weight"]["bytes"] == 256
    code, out = invoke("inspect", "weights", tiny("llama31"))
    assert code == 0 and "per format" in out and "tied" in out


def test_weights_bf16(tiny):
    v = inspect_json("weights", tiny("llama2", dtype="bfloat16"))
    assert [f["format"] for f in v["formats"]] == ["bf16"] and v["bytes"] == 2 * v["params"]


def test_rope_llama3_bands(tiny, no_weights):
    from fuelcli.model.rope import inv_freq
    from fuelcli.assembly.loader import open_model

    d = tiny("llama31")
    v = inspect_json("rope", d)
    f = v["frequencies"]
    assert len(f) == 8 and f[1]["dims"] == [1, 9]
    assert [x["band"] for x in f] == ["kept", "smoothed", "smoothed"] + ["divided"] * 5
    assert v["band_counts"] == {"kept": 1, "smoothed": 2, "divided": 5}
    cfg = open_model(str(d)).cfg
    np.testing.assert_array_equal(np.array([x["inv_freq"] for x in f], np.float32), inv_freq(cfg.rope, 16))
    assert f[0]["inv_freq"] == f[0]["base_inv_freq"] == 1.0  # kept
    assert abs(f[7]["inv_freq"] * 8 - f[7]["base_inv_freq"]) < 1e-9  # divided by factor 8
    assert abs(f[1]["wavelength"] - 13.66) < 0.01
    code, out = invoke("inspect", "rope", d)
    assert "smoothed" in out and "bands: kept 1, smoothed 2, divided 5" in out


def test_rope_default_has_no_band(tiny, no_weights):
    v = inspect_json("rope", tiny("qwen2_window"))
    assert all(x["band"] is None and x["inv_freq"] == x["base_inv_freq"] for x in v["frequencies"])
    code, out = invoke("inspect", "rope", tiny("qwen2_window"))
    assert "—" in out


def test_bad_model(tmp_path):
    assert invoke("inspect", "mask-plan", tmp_path / "nope")[0] == 2


def test_gguf_inspect(smollm2_gguf):
    g = smollm2_gguf
    v = inspect_json("mask-plan", g)
    assert v["num_layers"] == 30 and v["num_variants"] == 1 and v["layers"][0]["ffn"] == "dense"
    v = inspect_json("weights", g)
    assert v["num_tensors"] == 272 and v["params"] == 134_515_008
    assert {f["format"]: f["tensors"] for f in v["formats"]} == {"q4_1": 210, "q8_0": 1, "f32": 61}
    rows = {r["name"]: r for r in inspect_json("config", g)["values"]}
    assert rows["hidden_size"]["value"] == 576 and rows["hidden_size"]["origin"] != "default"
    assert inspect_json("rope", g)["head_dim"] == 64
