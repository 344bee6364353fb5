"""The CLI end to end: one subprocess per class of bad input the issue found (the readers are
tested in-process elsewhere), the last line of defence in main() and Ctrl-C during start-up.
Every case: its exit code, stderr one line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import malformed as M


def fuel(*args, env=None, timeout=120, code=None):
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "fuelcli"]
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def one_line_error(r, code: int, *needles):
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ one per class of the issue


def test_json_deep_nesting(tmp_path):
    d = M.write_hf_dir(tmp_path / "m")
    (d / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(fuel("inspect", "config", d), 2, "config.json is not valid JSON fuel can read: it nests too deeply")


def test_fifo_as_model_file_does_not_hang(tmp_path):
    p = tmp_path / "m.gguf"
    os.mkfifo(p)
    one_line_error(fuel("inspect", "config", p, timeout=60), 2, "m.gguf: is a FIFO, not a regular file")


def test_chat_template_error_in_run(tmp_path):
    d = M.write_hf_dir(tmp_path / "m")
    M.write_byte_tokenizer(d, template="{{ 1 // 0 }}")
    one_line_error(fuel("run", d, "abc", "-n", "1"), 2, "chat template error: ZeroDivisionError")


def test_diff_tol_nan(tmp_path):
    d = M.write_hf_dir(tmp_path / "m")
    one_line_error(fuel("diff", d, "--tokens", "1,2,3", "--tol", "nan"), 2, "--tol must be a number >= 0")


def test_pull_into_a_file(tmp_path):
    (tmp_path / "home").write_text("x")
    one_line_error(fuel("pull", "smollm2-135m", "-q", env={"FUEL_HOME": str(tmp_path / "home")}), 2,
                   f"FUEL_HOME={tmp_path / 'home'}: cannot store")


def test_nan_weight_on_the_decode_path(tmp_path):
    t = M.hf_tensors()
    t["model.layers.0.mlp.gate_proj.weight"][1, 1] = np.nan
    d = M.write_hf_dir(tmp_path / "m", t)
    one_line_error(fuel("logits", d, "--tokens", "1,2", "--out", tmp_path / "o.npy"), 2,
                   "(decode path)", "in layer 0 of 1; weight model.layers.0.mlp.gate_proj.weight holds NaN")
    assert not (tmp_path / "o.npy").exists()


def test_logits_into_a_fifo_keeps_the_fifo(tmp_path):
    """--out names a pipe (or /dev/null): written in place, never replaced by a renamed file."""
    d = M.write_hf_dir(tmp_path / "m")
    fifo = tmp_path / "out.npy"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    r = fuel("logits", d, "--tokens", "1,2", "--path", "reference", "--out", fifo)
    reader.join(60)
    assert r.returncode == 0, r.stderr
    assert fifo.is_fifo()
    import io

    assert np.load(io.BytesIO(got[0])).shape == (2, M.V)


# ------------------------------------------------------------------ the last line of defence

# A command whose library call raises what validation did not foresee: stand-ins for a fuel bug.
_BUG = """
import sys, fuelcli.assembly.loader as loader
def boom(*a, **k):
    raise {exc}
loader.open_model = boom
from fuelcli.__main__ import main
sys.argv = ["fuel", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("exc, shown", [
    ("ZeroDivisionError('division by zero')", "error: internal error: ZeroDivisionError: division by zero "
                                              "(set FUEL_DEBUG=1 to see the traceback)"),
    ("MemoryError()", "error: internal error: MemoryError: "),
    ("type('PanicException', (BaseException,), {})('two\\nlines')", "error: internal error: PanicException: two\\nlines"),
])
def test_an_unexpected_exception_is_one_line_and_70(exc, shown):
    r = fuel("inspect", "config", "x", code=_BUG.format(exc=exc))
    assert r.returncode == 70, r.stderr
    assert r.stderr.strip().startswith(shown) and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_fuel_debug_shows_the_traceback():
    r = fuel("inspect", "config", "x", code=_BUG.format(exc="KeyError('k')"), env={"FUEL_DEBUG": "1"})
    assert r.returncode == 70
    assert "Traceback" in r.stderr and r.stderr.strip().splitlines()[-1] == "error: internal error: KeyError: 'k'"


def test_a_multi_line_message_stays_one_line():
    r = fuel("inspect", "config", "x", code=_BUG.format(exc="__import__('fuelcli.errors').errors.InputError('a\\nb')"))
    assert r.returncode == 2 and r.stderr.strip() == "error: a\\nb", r.stderr


# ------------------------------------------------------------------ Ctrl-C during start-up

# SIGINT arrives while the CLI's modules import (here: as typer starts importing), the moment a
# user's Ctrl-C most often lands on a cold start. A process started in the background of a
# non-interactive shell inherits SIGINT ignored; the child restores Python's default handler first.
_INTERRUPT_AT_IMPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, even if started ignoring it
class Interrupt:
    def find_spec(self, name, path, target=None):
        if name == "typer":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["fuel", "--version"]
{entry}
"""


def test_ctrl_c_while_importing_exits_130_quietly():
    r = fuel(code=_INTERRUPT_AT_IMPORT.format(entry="from fuelcli.__main__ import main; main()"))
    assert r.returncode == 130 and r.stderr == "" and r.stdout == "", (r.returncode, r.stderr)


def test_ctrl_c_while_importing_the_old_way_shows_why():
    """Negative control: the old entry point (import, then main's handler) prints a traceback."""
    r = fuel(code=_INTERRUPT_AT_IMPORT.format(entry="from fuelcli.cli import main; main()"))
    assert r.returncode != 130 and "KeyboardInterrupt" in r.stderr


def test_ctrl_c_during_a_command_still_reaches_it(tmp_path):
    """After start-up SIGINT is a KeyboardInterrupt again (run prints its stats line on it): here
    during a long reference forward, exit 130 without a traceback."""
    code = """
import os, signal, sys, threading, fuelcli.assembly.reference as ref
real = ref.forward
def slow(*a, **k):
    os.kill(os.getpid(), signal.SIGINT)
    import time; time.sleep(30)
ref.forward = slow
from fuelcli.__main__ import main
sys.argv = ["fuel", *sys.argv[1:]]
main()
"""
    d = M.write_hf_dir(tmp_path / "m")
    r = fuel("logits", d, "--tokens", "1", "--path", "reference", "--out", tmp_path / "o.npy", code=code)
    assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o.npy").exists()
