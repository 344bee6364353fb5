"""How a `fuel` process starts: the garbage collector is off until the command's start is over
(fuelcli/process/collector.py), then on again with the start's objects frozen. Each case runs in its own
process (the collector and gc.freeze are process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Records, when the model's tokenizer is built (start-up work) and when generation begins, whether
# the collector is on and whether anything is frozen; then runs the CLI through ENTRY.
DRIVER = r"""
import gc, json, sys
import fuelcli.text.generate as G
import fuelcli.text.gguf_tokenizer as T

seen = {}

def spy(name, fn):
    def wrapped(*args, **kwargs):
        seen.setdefault(name, {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count() > 0})
        return fn(*args, **kwargs)
    return wrapped

T.tokenizer_from_gguf = spy("tokenizer", T.tokenizer_from_gguf)
G.generate = spy("generate", G.generate)
entry, out = sys.argv.pop(1), sys.argv.pop(1)
if entry == "__main__":
    from fuelcli.__main__ import main
else:  # the CLI without __main__'s start (as a library caller would run it): the collector stays on
    from fuelcli.cli import main
try:
    main()
finally:
    open(out, "w").write(json.dumps(seen))
"""


def observed(entry: str, args: list, tmp_path) -> dict:
    out = tmp_path / "seen.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", DRIVER, entry, str(out), *args], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def smol(smollm2_gguf):
    """The SmolLM2 GGUF with its kernels compiled (a cold first run is not what these tests time)."""
    from typer.testing import CliRunner

    from fuelcli.cli import app

    assert CliRunner().invoke(app, ["run", str(smollm2_gguf), "Hi", "-n", "1", "-q"]).exception is None
    return str(smollm2_gguf)


def test_run_starts_without_the_collector_and_generates_with_it(smol, tmp_path):
    seen = observed("__main__", ["run", smol, "Hi", "-n", "1", "-q"], tmp_path)
    assert seen["tokenizer"] == {"enabled": False, "frozen": False}  # the start: paused
    assert seen["generate"] == {"enabled": True, "frozen": True}  # the engine is ready: on, start frozen


def test_other_commands_resume_the_collector_as_they_begin(smol, tmp_path):
    seen = observed("__main__", ["logits", smol, "--prompt", "Hi", "--out", str(tmp_path / "l.npy")], tmp_path)
    assert seen["tokenizer"] == {"enabled": True, "frozen": True}


def test_negative_control_the_cli_without_main_never_pauses_it(smol, tmp_path):
    """The spy reads the collector's state: without __main__'s pause it sees it on, nothing frozen."""
    seen = observed("cli", ["run", smol, "Hi", "-n", "1", "-q"], tmp_path)
    assert seen["tokenizer"] == {"enabled": True, "frozen": False}
    assert seen["generate"] == {"enabled": True, "frozen": False}


# What `fuel run` on a GGUF file never needs: the oracle's machinery (fuel diff), the hub client, the
# peers, the plotting and serving stacks. Each costs a start its import time.
NOT_FOR_RUN = ("fuelcli.oracle.compare", "fuelcli.oracle.metrics", "huggingface_hub", "torch", "transformers",
               "matplotlib", "starlette", "uvicorn")

MODULES = r"""
import json, sys
out = sys.argv.pop(1)
from fuelcli.__main__ import main
try:
    main()
finally:
    open(out, "w").write(json.dumps(sorted(sys.modules)))
"""


def imported(args: list, tmp_path) -> set:
    out = tmp_path / "modules.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", MODULES, str(out), *args], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return set(json.loads(out.read_text()))


def test_run_imports_nothing_it_does_not_need(smol, tmp_path):
    mods = imported(["run", smol, "Hi", "-n", "1", "-q"], tmp_path)
    assert "fuelcli.backends.cpu.forward" in mods  # it did run
    assert not mods & set(NOT_FOR_RUN), sorted(mods & set(NOT_FOR_RUN))


def test_negative_control_diff_imports_the_oracle(smol, tmp_path):
    """The check sees lazy imports: `fuel diff` loads the oracle's modules that `fuel run` must not."""
    mods = imported(["diff", smol, "--prompt", "Hi there"], tmp_path)
    assert {"fuelcli.oracle.compare", "fuelcli.oracle.metrics"} <= mods


@pytest.mark.parametrize("values, stop", [([], 0), ([3], 1), ([3], 0), ([1, 3, 1, 3, 4, 3], 6), ([1, 3, 1, 3, 4, 3], 5),
                                          ([3, 3, 3], 2), ([1, 2, 4], 3), ([3, 3.0, True, "3"], 4)])
def test_positions_finds_what_a_loop_finds(values, stop):
    """gguf_meta.positions (list.index at C speed, for the 151k-entry token_type array on every start)
    against the loop it replaces."""
    from fuelcli.weights.gguf_meta import positions

    assert positions(values, 3, stop) == [i for i, v in enumerate(values[:stop]) if v == 3]


def _python(code: str, cwd) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


PROBES = "import sys; print(sorted(m for m in ('yaml', 'scipy', 'cffi') if m in sys.modules))"


def test_commands_import_numba_without_its_optional_probes(tmp_path):
    """set_threads (every command's first numba import) leaves PyYAML, SciPy and cffi unimported, and
    importable afterwards."""
    pytest.importorskip("yaml")
    out = _python("from fuelcli.process.threads import set_threads; set_threads(None); " + PROBES + "; import yaml",
                  tmp_path)
    assert out == "[]"


def test_negative_control_numba_alone_probes_yaml(tmp_path):
    pytest.importorskip("yaml")
    assert "'yaml'" in _python("import numba; " + PROBES, tmp_path)


def test_a_numba_config_file_is_still_read(tmp_path):
    """With a .numba_config.yaml in the working directory, PyYAML is left to numba, which reads it."""
    pytest.importorskip("yaml")
    (tmp_path / ".numba_config.yaml").write_text("color_scheme: light_bg\n")
    code = ("from fuelcli.process.threads import set_threads; set_threads(None); import numba; "
            "print(numba.config.COLOR_SCHEME)")
    assert _python(code, tmp_path) == "light_bg"
