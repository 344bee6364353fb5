"""What a new user met on a fresh machine (issue 34), each held to its fix with a control that shows
the check can fail: the converter without torch, the compile message, tables into a pipe, `pull
--quiet`, the order of `inspect weights`, "1 window"."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuelcli.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_converter_without_torch_is_one_line(monkeypatch, capsys):
    """examples/gguf_to_safetensors.py without the test extra: one line naming it, exit 4."""
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    monkeypatch.setattr(sys, "argv", ["gguf_to_safetensors.py", "smollm2-135m", "out"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "examples" / "gguf_to_safetensors.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert e.value.code == 4 and err.count("\n") == 1
    assert "needs torch" in err and "test extra" in err and "pip install -e '.[test]'" in err


def test_converter_names_a_missing_model(monkeypatch, capsys, tmp_path):
    """The control: with torch there, the same script goes on and names the next problem (an alias
    that is not pulled) in one line, exit 2, not a traceback."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    monkeypatch.setenv("FUEL_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["gguf_to_safetensors.py", "smollm2-135m", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "examples" / "gguf_to_safetensors.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "fuel pull smollm2-135m" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def byte_model(tiny, tmp_path_factory):
    """llama2 tiny with a byte tokenizer (ids = bytes), so that run and diff --text take text."""
    import shutil

    from tiny_models import write_byte_tokenizer

    d = tmp_path_factory.mktemp("newcomer") / "llama2"
    shutil.copytree(tiny("llama2"), d)
    return write_byte_tokenizer(d)


@pytest.mark.parametrize("cached", [False, True])
def test_compile_message_names_the_formats(byte_model, monkeypatch, cached):
    """A first run says what it compiles and that it happens once per format; a warm one says nothing."""
    import fuelcli.backends.cpu.engine as E

    monkeypatch.setattr(E, "kernels_cached", lambda weights=None, activations="int16": cached)
    r = runner.invoke(app, ["run", str(byte_model), "hi", "-n", "1", "--no-chat-template", "--temp", "0"])
    assert r.exit_code == 0, r.output
    msg = "compiling fuel's CPU kernels for f32 weights (once per weight format"
    assert (msg in r.stderr) == (not cached), r.stderr


@pytest.mark.parametrize("chunks, words", [(1, "1 window of 32"), (2, "2 windows of 32")])
def test_one_window_is_singular(byte_model, tmp_path, chunks, words):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4, encoding="utf-8")
    r = runner.invoke(app, ["diff", str(byte_model), "--text", str(text), "--ctx", "32", "--chunks", str(chunks)])
    assert r.exit_code == 0, r.output
    assert words in r.stdout and "1 windows" not in r.stdout


def test_tables_keep_their_width_in_a_pipe(tiny):
    """Into a pipe a rich table keeps its natural width (rich cut every line at 80 columns and
    wrapped the cells); with COLUMNS=60 it is cut, which shows the check can fail."""
    d = str(tiny("qwen2_window"))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])

    def table(columns=None):
        e = dict(env, **({"COLUMNS": columns} if columns else {}))
        p = subprocess.run([sys.executable, "-m", "fuelcli", "inspect", "config", d], capture_output=True,
                           text=True, env=e, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()

    cell = "layer_types from config.json (w=4)"
    wide = table()
    assert max(map(len, wide)) > 80 and any(cell in ln for ln in wide)
    cut = table("60")
    assert max(map(len, cut)) <= 60 and not any(cell in ln for ln in cut)


def test_pull_quiet_prints_nothing(tmp_path, monkeypatch):
    """`pull --quiet` of a pulled alias: no output at all; without it, the summary line."""
    from fuelcli.sources import demo

    monkeypatch.setenv("FUEL_HOME", str(tmp_path))
    d = demo.DEMOS["smollm2-135m"]
    with open(tmp_path / d.file, "wb") as f:  # as pulled: the size is what counts as present
        f.truncate(d.size)
    r = runner.invoke(app, ["pull", "smollm2-135m", "--quiet"])
    assert r.exit_code == 0 and r.stdout == "" and r.stderr == ""
    r = runner.invoke(app, ["pull", "smollm2-135m"])
    assert r.exit_code == 0 and r.stdout.startswith("smollm2-135m: already pulled")


def test_inspect_weights_natural_order(smollm2_gguf):
    """blk.2 before blk.10: the layers in their numbers' order (a plain sort would not pass this)."""
    import json

    r = runner.invoke(app, ["inspect", "weights", str(smollm2_gguf), "--json"])
    names = [t["name"] for t in json.loads(r.stdout)["tensors"]]
    layers = [int(m.group(1)) for n in names if (m := re.match(r"blk\.(\d+)\.", n))]
    assert layers == sorted(layers) and layers[-1] == 29
    assert sorted(names) != names  # the control: string order differs here


def test_natural_key():
    from fuelcli.assembly.inspect_views import natural_key

    names = ["blk.10.attn_q.weight", "blk.2.attn_q.weight", "blk.1.ffn_up.weight", "output.weight",
             "blk.1.attn_k.weight", "model.layers.11.mlp", "model.layers.9.mlp"]
    assert sorted(names, key=natural_key) == ["blk.1.attn_k.weight", "blk.1.ffn_up.weight", "blk.2.attn_q.weight",
                                              "blk.10.attn_q.weight", "model.layers.9.mlp", "model.layers.11.mlp",
                                              "output.weight"]
