"""`fuel diff`: passes on every tiny family against both oracles, and each deliberately broken variant
exits 3 with `--layers` naming the right first bad layer.

Which break which oracle can see:
  * config-level breaks (ModelConfig changed after loading: window direction, dense routing,
    unscaled RoPE) change the engine AND fuel's reference alike (both read the same config), so only
    `--oracle transformers` (which reads the files itself) sees them; under `--oracle self` they pass —
    asserted below, it is the self oracle's documented blind spot.
  * engine-level breaks (the Engine's windows array, its top-k, its cos/sin tables) leave the reference
    alone, so `--oracle self` sees them (and transformers too).

Measured on these checkpoints (10 tokens, f32): logits max|Δ| ≤ 6.5e-5 vs self and ≤ 7.9e-5 vs
transformers; per-layer relative max|Δ| ≤ 3.5e-6. Breaks: logits max|Δ| > 0.1, relative layer error
> 1e-2 at the first bad layer.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from block_edits import inverted_windows, with_attention, with_blocks
from typer.testing import CliRunner

import fuelcli.assembly.loader
from fuelcli.cli import app
from fuelcli.errors import FuelError
from fuelcli.model.rope import RopeConfig

IDS = [5, 17, 200, 3, 99, 42, 7, 128, 64, 31]  # 10 > every window (4): 7 prefilled + 3 decoded
TOKENS = ",".join(map(str, IDS))
CASES = ["qwen2_window", "qwen3_bias_headdim", "qwen3_moe_norm_false", "llama31"]


def invoke(*args):
    """In-process (so monkeypatches hold); FuelErrors mapped to their exit code like fuelcli.cli.main."""
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, (FuelError, SystemExit)):
        raise r.exception
    code = r.exception.exit_code if isinstance(r.exception, FuelError) else r.exit_code
    return code, r.stdout, (str(r.exception) if isinstance(r.exception, FuelError) else "")


def diff_json(model_dir, *extra):
    code, out, err = invoke("diff", model_dir, "--tokens", TOKENS, "--json", "--layers", *extra)
    return code, json.loads(out), err


# ---------------------------------------------------------------- passes


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("oracle", ["self", "transformers"])
def test_diff_passes(tiny, case, oracle):
    code, r, err = diff_json(tiny(case), "--oracle", oracle)
    assert code == 0, err
    assert r["passed"] and r["verdict"] == "pass"
    assert r["prefill_len"] == 7 and r["decode_steps"] == 3
    assert [p["step"] for p in r["positions"]] == ["prefill"] * 7 + ["decode"] * 3
    assert r["summary"]["max_abs"] < 1e-4 and r["summary"]["top1_rate"] == 1.0
    assert r["summary"]["mean_kl"] < 1e-8
    assert r["first_bad_layer"] is None
    assert len(r["layers"]) == {"qwen2_window": 5, "qwen3_moe_norm_false": 5}.get(case, 3)
    assert all(lay["rel"] < 1e-5 for lay in r["layers"])


def test_diff_prefill_path_and_table(tiny):
    code, out, _ = invoke("diff", tiny("qwen2_window"), "--tokens", TOKENS, "--path", "prefill", "--layers")
    assert code == 0
    assert "verdict: PASS" in out and "10 prefilled" in out and "first layer out of tolerance: none" in out


# ---------------------------------------------------------------- config-level breaks: transformers sees them


CONFIG_BREAKS = {
    # case: (break, first bad layer)
    "qwen2_window": (inverted_windows, 0),  # windowed layers become 0,1
    "qwen3_moe_norm_false": (lambda c: dataclasses.replace(c, experts_per_tok=c.num_experts), 1),  # MoE layer 1
    "llama31": (lambda c: with_attention(c, rope=lambda r: RopeConfig(theta=r.theta)), 0),  # unscaled RoPE
    # Gemma 3's global layer 1 rotated with the local base: --layers names it, and what its block is
    "gemma3": (lambda c: with_attention(c, rope=c.blocks[0].attention.rope), 1),
    # SmolLM3's NoPE layer 3 rotated like the others: layers 0-2 still agree
    "smollm3": (lambda c: with_attention(c, rope=c.blocks[0].attention.rope), 3),
    # the 5 local : 1 global pattern misread by one layer: layer 4 global, layer 5 local
    "gemma3_6layers": (lambda c: with_blocks(c, lambda i, b: dataclasses.replace(
        b, attention=dataclasses.replace(b.attention, window=0 if i == 4 else max(c.windows)))), 4),
}


@pytest.fixture
def break_config(monkeypatch):
    def apply(fn):
        real = fuelcli.assembly.loader.open_model

        def broken(model, revision=None, hf_file=None):
            m = real(model, revision, hf_file)
            m.cfg = fn(m.cfg)
            return m

        monkeypatch.setattr(fuelcli.assembly.loader, "open_model", broken)

    return apply


@pytest.mark.parametrize("case", sorted(CONFIG_BREAKS))
def test_config_break_caught_by_transformers(tiny, break_config, case):
    fn, first_bad = CONFIG_BREAKS[case]
    break_config(fn)
    code, r, err = diff_json(tiny(case), "--oracle", "transformers")
    assert code == 3, r
    assert not r["passed"] and r["summary"]["max_abs"] > 0.1
    assert r["first_bad_layer"] == first_bad
    assert all(lay["ok"] for lay in r["layers"] if lay["layer"] < first_bad)
    assert f"first layer out of tolerance: {first_bad}" in err
    bad = next(lay for lay in r["layers"] if lay["layer"] == first_bad)
    assert bad["block"] in err and bad["block"].startswith(("full", "window"))


@pytest.mark.parametrize("case", sorted(CONFIG_BREAKS))
def test_config_break_invisible_to_self(tiny, break_config, case):
    """Both sides of --oracle self read the broken config: it cannot see config-level semantics."""
    break_config(CONFIG_BREAKS[case][0])
    code, r, _ = diff_json(tiny(case), "--oracle", "self")
    assert code == 0 and r["passed"]


# ---------------------------------------------------------------- engine-level breaks: self sees them


def engine_break(monkeypatch, fn):
    from fuelcli.backends.cpu.engine import CpuEngine as Engine

    real_init = Engine.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        fn(self)

    monkeypatch.setattr(Engine, "__init__", init)


def _invert_engine_windows(e):
    from fuelcli.backends.cpu.forward import L_WINDOW

    windows = e.lay[:, L_WINDOW]
    e.lay[:, L_WINDOW] = np.where(windows > 0, 0, int(windows.max()))


def _dense_engine_routing(e):
    import dataclasses

    from fuelcli.backends.cpu import forward
    from fuelcli.backends.cpu.activations import allocate

    e.dims[forward.D_TOPK] = e.cfg.num_experts
    e.act = allocate(dataclasses.replace(e.cfg, experts_per_tok=e.cfg.num_experts), e.n_batch)  # room for all


def _unscaled_engine_rope(e):
    from fuelcli.model.rope import cos_sin_tables

    e.cos, e.sin = cos_sin_tables([RopeConfig(theta=e.cfg.rope.theta)], e.cfg.head_dim, e.n_ctx)


ENGINE_BREAKS = {
    "qwen2_window": (_invert_engine_windows, 0),
    "qwen3_moe_norm_false": (_dense_engine_routing, 1),
    "llama31": (_unscaled_engine_rope, 0),
}


@pytest.mark.parametrize("path", ["decode", "prefill"])
@pytest.mark.parametrize("case", sorted(ENGINE_BREAKS))
def test_engine_break_caught_by_self(tiny, monkeypatch, case, path):
    fn, first_bad = ENGINE_BREAKS[case]
    engine_break(monkeypatch, fn)
    code, r, err = diff_json(tiny(case), "--oracle", "self", "--path", path)
    assert code == 3, r
    assert r["summary"]["max_abs"] > 0.1
    assert r["first_bad_layer"] == first_bad
    assert "first layer out of tolerance" in err


def test_engine_break_caught_by_transformers(tiny, monkeypatch):
    engine_break(monkeypatch, _invert_engine_windows)
    code, r, _ = diff_json(tiny("qwen2_window"), "--oracle", "transformers")
    assert code == 3 and r["first_bad_layer"] == 0


def test_decode_only_break_positions(tiny, monkeypatch):
    """A break only in single-token decode shows on the decode positions only, and the prefill path passes."""
    from fuelcli.backends.cpu.engine import CpuEngine as Engine

    real = Engine.decode

    def bump(logits):  # one logit raised: a different distribution (a uniform shift would not be)
        logits = logits.copy()
        logits[5] += 3.0
        return logits

    def decode(self, token, hidden=False):
        out = real(self, token, hidden)
        return (bump(out[0]), out[1]) if hidden else bump(out)

    monkeypatch.setattr(Engine, "decode", decode)
    code, out, _ = invoke("diff", tiny("llama2"), "--tokens", TOKENS, "--json")
    r = json.loads(out)
    assert code == 3
    assert [p["max_abs"] > 0.5 for p in r["positions"]] == [False] * 7 + [True] * 3
    assert invoke("diff", tiny("llama2"), "--tokens", TOKENS, "--path", "prefill")[0] == 0


# ---------------------------------------------------------------- saved logits


@pytest.fixture(scope="module")
def ref_logits(tiny):
    from fuelcli.assembly.loader import open_model
    from fuelcli.assembly.forward_paths import logits_by_path

    d = tiny("llama2")
    return d, logits_by_path(open_model(str(d)), IDS, "reference")


def _save(path: Path, arr, kind):
    if kind == "npy":
        np.save(path, arr)
    elif kind == "npz":
        np.savez(path, other=np.zeros(3), logits=arr)
    elif kind == "npz_first":
        np.savez(path, arr)
    elif kind == "safetensors":
        from safetensors.numpy import save_file

        save_file({"x": np.ascontiguousarray(arr)}, str(path))
    return path


@pytest.mark.parametrize("kind", ["npy", "npz", "npz_first", "safetensors"])
def test_saved_logits_oracle(tmp_path, ref_logits, kind):
    d, ref = ref_logits
    ext = {"npz_first": "npz"}.get(kind, kind)
    good = _save(tmp_path / f"good.{ext}", ref, kind)
    code, out, _ = invoke("diff", d, "--tokens", TOKENS, "--oracle", good, "--json")
    assert code == 0 and json.loads(out)["passed"]
    bad_arr = ref.copy()
    bad_arr[8, 3] += 5.0
    bad = _save(tmp_path / f"bad.{ext}", bad_arr, kind)
    code, out, err = invoke("diff", d, "--tokens", TOKENS, "--oracle", bad, "--json")
    r = json.loads(out)
    assert code == 3 and abs(r["positions"][8]["max_abs"] - 5.0) < 1e-3 and "max KL" in err
    assert [p["kl"] > 1e-3 for p in r["positions"]] == [False] * 8 + [True] + [False]


def test_saved_logits_bad_shape_and_layers(tmp_path, ref_logits):
    d, ref = ref_logits
    p = _save(tmp_path / "short.npy", ref[:-1], "npy")
    code, _, err = invoke("diff", d, "--tokens", TOKENS, "--oracle", p)
    assert code == 2 and "expected [seq=10, vocab=256]" in err
    full = _save(tmp_path / "full.npy", ref, "npy")
    code, _, err = invoke("diff", d, "--tokens", TOKENS, "--oracle", full, "--layers")
    assert code == 2 and "--layers" in err
    code, _, err = invoke("diff", d, "--tokens", TOKENS, "--oracle", tmp_path / "missing.npy")
    assert code == 2


# ---------------------------------------------------------------- input errors, missing dependency


def test_input_errors(tiny):
    d = tiny("llama2")
    assert invoke("diff", d)[0] == 2  # neither --prompt nor --tokens
    assert invoke("diff", d, "--tokens", "1,2", "--prompt", "x")[0] == 2
    assert invoke("diff", d, "--tokens", "1")[0] == 2  # decode path needs ≥ 2 tokens
    assert invoke("diff", d, "--tokens", "1,999")[0] == 2  # outside the vocabulary
    assert invoke("diff", d, "--tokens", "1,2", "--path", "reference")[0] == 2
    code, out, _ = invoke("diff", d, "--tokens", "1,2", "--json")  # 1 prefilled + 1 decoded
    assert code == 0 and json.loads(out)["prefill_len"] == 1


def test_transformers_missing(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError
    code, _, err = invoke("diff", tiny("llama2"), "--tokens", TOKENS, "--oracle", "transformers")
    assert code == 4 and "pip install" in err and "transformers" in err


# ---------------------------------------------------------------- the real command and the CI script


def test_exit_codes_through_main(tmp_path, ref_logits):
    """The installed entry point: exit 3 and one `error:` line on mismatch."""
    d, ref = ref_logits
    shifted = ref.copy()
    shifted[:, 7] += 2.0  # token 7 favoured everywhere: a different distribution
    bad = _save(tmp_path / "bad.npy", shifted, "npy")
    r = subprocess.run([sys.executable, "-m", "fuelcli", "diff", str(d), "--tokens", TOKENS, "--oracle", str(bad)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip().startswith("error: ") and "Traceback" not in r.stderr
    assert "verdict: MISMATCH" in r.stdout


def test_ci_smoke_script(tiny, tmp_path):
    script = Path(__file__).resolve().parents[1] / "examples" / "ci-smoke.sh"
    env = {**os.environ, "FUEL": f"{sys.executable} -m fuelcli", "FUEL_SMOKE_OUT": str(tmp_path / "smoke.json")}
    r = subprocess.run(["bash", str(script), str(tiny("llama2"))], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and json.loads((tmp_path / "smoke.json").read_text())["passed"]
    r = subprocess.run(["bash", str(script), str(tmp_path / "no-such-model")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode != 0 and "FAIL" in r.stderr
