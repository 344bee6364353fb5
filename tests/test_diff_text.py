"""`fuel diff --text` and `fuel perplexity` on the tiny checkpoints (with a byte tokenizer) and a real
text (the Python language reference shipped with the interpreter, pydoc_data.topics).

What is checked: the windows are llama-perplexity's; both oracles pass and the numbers agree with an
independent numpy computation; slicing a window (the bounded-memory path) changes nothing; a break
that starts at a given context position is found at exactly that position (the negative control); a
saved .bin dump works as an oracle and a changed row in it is caught; bad input exits 2, a missing
package 4. The llama.cpp oracle runs on the SmolLM2 GGUF when llama-cpp-python is installed.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
from test_diff import invoke

from fuelcli.oracle import tolerances

CTX = 32


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    import pydoc_data.topics as topics

    f = tmp_path_factory.mktemp("text") / "reference.txt"
    f.write_text("\n\n".join(topics.topics[k] for k in sorted(topics.topics))[:3000], encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def model_dir(tiny, tmp_path_factory):
    """llama31 (RoPE scaled; position 0 is never rotated) with a byte tokenizer: ids = bytes."""
    from tiny_models import write_byte_tokenizer

    d = tmp_path_factory.mktemp("m") / "llama31"
    shutil.copytree(tiny("llama31"), d)
    return write_byte_tokenizer(d)


def text_json(model_dir, text_file, *extra):
    code, out, err = invoke("diff", model_dir, "--text", text_file, "--ctx", CTX, "--json", *extra)
    return code, (json.loads(out) if out.strip().startswith("{") else None), err


def reference_ppl(model_dir, text_file, chunks: int):
    """llama-perplexity's numbers from fuel's numpy reference, computed here without fuel's windows."""
    from fuelcli.assembly import reference
    from fuelcli.assembly.loader import open_model

    m = open_model(str(model_dir))
    ids = list(text_file.read_bytes())  # the byte tokenizer adds no BOS
    nll = []
    for c in range(chunks):
        w = ids[c * CTX:(c + 1) * CTX]
        x = reference.forward(m.cfg, m.weights, w).astype(np.float64)
        lp = x - x.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        nll += [-lp[i, w[i + 1]] for i in range(CTX // 2, CTX - 1)]
    nll = np.array(nll)
    ppl = np.exp(nll.mean())
    return ppl, np.sqrt(((nll ** 2).mean() - nll.mean() ** 2) / (len(nll) - 1)) * ppl


@pytest.mark.parametrize("oracle", ["self", "transformers"])
def test_text_passes(model_dir, text_file, oracle):
    code, r, err = text_json(model_dir, text_file, "--chunks", 3, "--oracle", oracle)
    assert code == 0, err
    assert r["passed"] and r["mode"] == "text" and r["ctx"] == CTX and r["chunks_used"] == 3
    assert r["scored_from"] == CTX // 2 and r["bos"] is None
    assert r["text"]["tokens"] == len(text_file.read_bytes())
    assert [c["start"] for c in r["chunks"]] == [0, CTX, 2 * CTX]
    pos = r["chunks"][1]["positions"]
    assert len(pos["kl"]) == CTX and len(pos["nll_fuel"]) == CTX - 1 and len(r["by_position"]["max_kl"]) == CTX
    s = r["summary"]
    assert s["max_kl"] < 1e-8 and s["top1_rate"] == 1.0 and s["first_over_tol"] is None and s["positions"] == 3 * CTX
    assert s["ppl_fuel"] == pytest.approx(s["ppl_oracle"], rel=1e-5)
    ppl, err_ = reference_ppl(model_dir, text_file, 3)
    assert s["ppl_oracle"] == pytest.approx(ppl, rel=1e-5) and s["ppl_oracle_stderr"] == pytest.approx(err_, rel=1e-4)
    p = r["provenance"]
    assert p["fuel"]["version"] and p["model"]["files"][0]["name"] == "config.json"
    assert all(len(f["sha256"]) == 64 for f in p["model"]["files"])
    assert p["oracle"]["oracle"] == oracle and (oracle == "self" or p["oracle"]["version"])
    assert r["speed"]["fuel"]["tokens"] == 3 * CTX


def test_perplexity_command(model_dir, text_file, monkeypatch):
    code, out, err = invoke("perplexity", model_dir, text_file, "--ctx", CTX, "--chunks", 3, "--json")
    assert code == 0, err
    r = json.loads(out)
    ppl, stderr = reference_ppl(model_dir, text_file, 3)
    assert r["ppl"] == pytest.approx(ppl, rel=1e-5) and r["ppl_stderr"] == pytest.approx(stderr, rel=1e-4)
    assert r["scored"] == 3 * (CTX // 2 - 1) and r["chunks"] == 3 and len(r["running"]) == 3
    assert r["running"][-1] == r["ppl"] and r["provenance"]["model"]["files"]
    code, out, _ = invoke("perplexity", model_dir, text_file, "--ctx", CTX, "--chunks", 2)
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("[1]") and lines[0].count(",") == 2
    assert lines[-1].startswith("Final estimate: PPL = ") and " +/- " in lines[-1]
    break_rope(monkeypatch)  # negative control: the scored positions (16..30) see the break
    code, out, _ = invoke("perplexity", model_dir, text_file, "--ctx", CTX, "--chunks", 3, "--json")
    assert code == 0 and abs(json.loads(out)["ppl"] / ppl - 1) > 1e-2


def test_slices_change_nothing(model_dir, text_file, monkeypatch):
    """A window in slices of 8 through the KV caches (fuel's and transformers') gives what one block gives."""
    _, whole, _ = text_json(model_dir, text_file, "--chunks", 2, "--oracle", "transformers", "--path", "prefill")
    monkeypatch.setattr(tolerances, "SLICE", 8)
    _, sliced, _ = text_json(model_dir, text_file, "--chunks", 2, "--oracle", "transformers", "--path", "prefill")
    for a, b in zip(whole["chunks"], sliced["chunks"]):
        assert np.allclose(a["positions"]["nll_fuel"], b["positions"]["nll_fuel"], rtol=1e-5, atol=1e-6)
        assert np.allclose(a["positions"]["nll_oracle"], b["positions"]["nll_oracle"], rtol=1e-5, atol=1e-6)
    assert sliced["summary"]["max_kl"] < 1e-8


BREAK_AT = 20


def break_rope(monkeypatch):
    """The engine's RoPE turning the wrong way from context position BREAK_AT on: a position-dependent
    bug, zero before it."""
    from fuelcli.backends.cpu.engine import CpuEngine

    real = CpuEngine.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        self.sin = self.sin.copy()
        self.sin[:, BREAK_AT:] *= -1  # [RoPE tables, positions, head_dim / 2]

    monkeypatch.setattr(CpuEngine, "__init__", init)


@pytest.fixture
def rope_break_from(monkeypatch):
    break_rope(monkeypatch)


@pytest.mark.parametrize("oracle", ["self", "transformers"])
def test_first_position_over_tol(model_dir, text_file, rope_break_from, oracle):
    code, r, err = text_json(model_dir, text_file, "--chunks", 3, "--oracle", oracle, "--layers")
    assert code == 3 and "max KL" in err
    assert r["summary"]["first_over_tol"]["pos"] == BREAK_AT
    assert all(c["first_over_tol"] == BREAK_AT for c in r["chunks"])
    by_pos = np.array(r["by_position"]["max_kl"])
    assert by_pos[:BREAK_AT].max() < 1e-8 and by_pos[BREAK_AT:].min() > tolerances.DEFAULT_TOL
    assert r["first_bad_layer"] == 0
    rel = np.array(r["layer_rel_by_position"])  # [L+1, ctx]: the embeddings agree, layer 0 breaks at BREAK_AT
    assert rel[0].max() == 0 and rel[1, :BREAK_AT].max() < 1e-5 and rel[1, BREAK_AT:].min() > 1e-3


def test_terminal_picture_and_plot(model_dir, text_file, rope_break_from, tmp_path):
    code, out, _ = invoke("diff", model_dir, "--text", text_file, "--ctx", CTX, "--chunks", 2, "--layers",
                          "--plot", tmp_path / "kl.png")
    assert code == 3
    assert "max KL over 2 window(s) by context position" in out and "◀ tol" in out
    assert "per-layer divergence by context position" in out and "verdict: MISMATCH" in out
    assert (tmp_path / "kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ids = ",".join(map(str, range(1, BREAK_AT + 6)))
    assert invoke("diff", model_dir, "--tokens", ids, "--layers", "--plot", tmp_path / "kl.svg")[0] == 3
    assert b"<svg" in (tmp_path / "kl.svg").read_bytes()[:400]
    assert not list(tmp_path.glob(".*"))  # no temporary left behind


def test_saved_bin_oracle(model_dir, text_file, tmp_path):
    """A llama.cpp-style raw float32 dump [n_tokens, n_vocab] of every window's positions."""
    from fuelcli.assembly import reference
    from fuelcli.assembly.loader import open_model

    m = open_model(str(model_dir))
    ids = list(text_file.read_bytes())
    rows = np.concatenate([reference.forward(m.cfg, m.weights, ids[c * CTX:(c + 1) * CTX]) for c in range(2)])
    good = tmp_path / "good.bin"
    rows.astype("<f4").tofile(good)
    code, r, err = text_json(model_dir, text_file, "--chunks", 2, "--oracle", good)
    assert code == 0, err
    assert r["provenance"]["oracle"]["sha256"] and r["provenance"]["oracle"]["format"] == ".bin"
    bad = rows.copy()
    bad[CTX + 7] = bad[CTX + 7, ::-1]  # one position's distribution turned around
    bad.astype("<f4").tofile(tmp_path / "bad.bin")
    code, r, _ = text_json(model_dir, text_file, "--chunks", 2, "--oracle", tmp_path / "bad.bin")
    assert code == 3 and r["chunks"][0]["first_over_tol"] is None and r["chunks"][1]["first_over_tol"] == 7
    rows[:-1].astype("<f4").tofile(tmp_path / "short.bin")
    code, _, err = text_json(model_dir, text_file, "--chunks", 2, "--oracle", tmp_path / "short.bin")
    assert code == 2 and f"expected [seq={2 * CTX}, vocab=256]" in err
    (tmp_path / "odd.bin").write_bytes(b"\0" * 10)
    code, _, err = text_json(model_dir, text_file, "--chunks", 2, "--oracle", tmp_path / "odd.bin")
    assert code == 2 and "whole number of float32 rows" in err


def test_input_errors(model_dir, text_file, tmp_path, tiny):
    short = tmp_path / "short.txt"
    short.write_text("x" * (CTX + 5))
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    cases = [
        (("diff", model_dir, "--text", text_file, "--tokens", "1,2"), "exactly one of"),
        (("diff", model_dir, "--text", text_file, "--ctx", 2), "--ctx must be at least"),
        (("diff", model_dir, "--text", text_file, "--ctx", 4096), "exceeds the model's context"),
        (("diff", model_dir, "--text", text_file, "--ctx", CTX, "--chunks", 0), "--chunks must be at least 1"),
        (("diff", model_dir, "--text", tmp_path / "none.txt", "--ctx", CTX), "no such file"),
        (("diff", model_dir, "--text", tmp_path / "latin1.txt", "--ctx", CTX), "not UTF-8"),
        (("diff", model_dir, "--text", short, "--ctx", 64), "tokenizes to only"),
        (("diff", model_dir, "--text", text_file, "--ctx", CTX, "--oracle", "llama.cpp"), "reads .gguf files"),
        (("diff", model_dir, "--text", text_file, "--plot", tmp_path / "kl.jpg"), ".png or .svg"),
        (("diff", model_dir, "--tokens", "1,2", "--oracle", "llama.cpp", "--layers"), "llama.cpp gives logits only"),
        (("perplexity", model_dir, short, "--ctx", CTX), f"needs at least {2 * CTX}"),
        (("perplexity", model_dir, text_file, "--ctx", 3), "--ctx must be at least"),
        (("perplexity", tiny("llama2"), text_file, "--ctx", CTX), "tokenizer.json"),
    ]
    for args, what in cases:
        code, _, err = invoke(*args)
        assert code == 2 and what in err, (args, err)


def test_missing_packages(model_dir, text_file, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = invoke("diff", model_dir, "--tokens", "1,2", "--plot", tmp_path / "kl.png")
    assert code == 4 and "fuel-llm[plot]" in err
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    from fuelcli.peers import require

    with pytest.raises(Exception) as e:
        require("llama.cpp", "--oracle")
    assert e.value.exit_code == 4 and "fuel-llm[llama-cpp]" in str(e.value) and "GGML_NATIVE=OFF" in str(e.value)


# ---------------------------------------------------------------- llama.cpp on a real GGUF


def test_llama_cpp_oracle(smollm2_gguf, text_file, monkeypatch):
    """fuel against llama.cpp on the SmolLM2 GGUF: they agree as llama.cpp's 8-bit activations allow
    (measured on this text: max KL 2e-2, top-1 ≥ 0.9); the RoPE break from position 20 is found there."""
    pytest.importorskip("llama_cpp")
    args = ("diff", smollm2_gguf, "--text", text_file, "--ctx", 64, "--chunks", 2, "--oracle", "llama.cpp",
            "--json", "--tol", "0.1", "--min-top1", "0.85")
    code, out, err = invoke(*args)
    assert code == 0, err
    r = json.loads(out)
    assert r["summary"]["max_kl"] > 1e-5  # two different engines: never bit-equal
    assert r["summary"]["ppl_fuel"] == pytest.approx(r["summary"]["ppl_oracle"], rel=0.05)
    assert r["provenance"]["oracle"]["llama_cpp_python"] and r["bos"] is None
    break_rope(monkeypatch)
    code, out, _ = invoke(*args)
    r = json.loads(out)
    assert code == 3 and r["summary"]["first_over_tol"]["pos"] >= BREAK_AT
    assert np.array(r["by_position"]["max_kl"])[:BREAK_AT].max() < 0.1
