"""Peers in processes of their own (fuelcli/peers/): the messages carry arrays whole, fuel's errors
come back as themselves, and a peer that dies is one line naming it and the signal, exit 5, with
the build advice, for bench and for the oracle. The fake peer (tests/fake_peer.py) kills itself
with SIGSEGV where FAKE_PEER_CRASH says; without it the same calls succeed (the negative control).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fuelcli import errors
from fuelcli.peers import PEERS, install
from fuelcli.peers.child import PeerProcess, describe_exit

TESTS = Path(__file__).parent
ROOT = TESTS.parent


@pytest.fixture
def fake_env(monkeypatch):
    """The child finds tests/fake_peer.py; no crash unless a test asks for one."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("FAKE_PEER_CRASH", raising=False)
    return monkeypatch


def fake_kind(name="llama.cpp"):
    return PEERS[name]._replace(modules=(), adapter="fake_peer:FakePeer")


def test_arrays_round_trip(fake_env):
    p = PeerProcess(fake_kind(), threads=3, path="x")
    try:
        assert p.info["threads"] == 3 and p.proc.pid != os.getpid()
        big = np.random.default_rng(0).standard_normal((512, 4099)).astype(np.float32)
        ids = np.arange(7, dtype=np.int64)
        a, b, c = p.call("echo", big, ids, {"k": (1, "two")})
        assert a.dtype == np.float32 and np.array_equal(a, big) and np.array_equal(b, ids) and c == {"k": (1, "two")}
        a[0, 0] = 1.0  # received into a buffer of its own: writable
        assert not p.call("numba_loaded")  # the child runs no fuel thread pool (and no torch here)
        assert p.peak_rss_bytes() > 1 << 20
    finally:
        p.close()
    assert p.proc.returncode == 0


def test_errors_come_back_typed(fake_env):
    p = PeerProcess(fake_kind(), threads=1)
    try:
        with pytest.raises(errors.InputError, match="refuses this input"):
            p.call("fail", "input")
        with pytest.raises(errors.PeerFailed, match="the llama.cpp peer failed: ValueError: something inside") as e:
            p.call("fail", "other")
        assert "died" not in str(e.value)
        assert p.call("pp", np.arange(3)) == 0.5  # the child lives on after an exception
    finally:
        p.close()


@pytest.mark.parametrize("method", ["__init__", "pp"])
def test_crash_is_one_line_exit_5(fake_env, method):
    fake_env.setenv("FAKE_PEER_CRASH", method)
    with pytest.raises(errors.PeerFailed) as e:
        p = PeerProcess(fake_kind(), threads=1)
        p.call("prepare", np.arange(2))  # the negative control below: this call alone succeeds
        p.call("pp", np.arange(3))
    msg = str(e.value)
    assert e.value.exit_code == 5 and "\n" not in msg
    assert msg.startswith("the llama.cpp peer (llama-cpp-python, in its own process) died of SIGSEGV (signal 11)")
    assert ("while loading the model" if method == "__init__" else "in pp()") in msg
    assert install.LLAMA_CPP_AMX_BUILD in msg


def test_no_crash_without_the_signal(fake_env):
    """The negative control: the same calls with FAKE_PEER_CRASH unset return their values."""
    p = PeerProcess(fake_kind(), threads=1)
    p.call("prepare", np.arange(2))
    assert p.call("pp", np.arange(3)) == 0.5 and p.proc.poll() is None
    p.close()


def test_describe_exit():
    assert describe_exit(-11) == "died of SIGSEGV (signal 11)"
    assert describe_exit(-4) == "died of SIGILL (signal 4)"
    assert describe_exit(3) == "exited with code 3"


def _fuel_with_fake_peer(peer: str, args: list, crash: str | None):
    """`fuel ARGS` in a fresh process whose peer `peer` is the fake one: exit code, stdout, stderr."""
    code = ("import sys; import fuelcli.peers as P; "
            f"P.PEERS[{peer!r}] = P.PEERS[{peer!r}]._replace(modules=(), adapter='fake_peer:FakePeer'); "
            f"sys.argv = ['fuel'] + {[str(a) for a in args]!r}; "
            "from fuelcli.__main__ import main; main()")
    env = {k: v for k, v in os.environ.items() if k != "FAKE_PEER_CRASH"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    if crash:
        env["FAKE_PEER_CRASH"] = crash
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("crash", ["pp", None])
def test_bench_compare_crash(smollm2_gguf, crash):
    """bench --compare llama.cpp whose peer segfaults: one line, exit 5, fuel's table not printed;
    the same run with a peer that lives prints the table with the peer's column."""
    rc, out, err = _fuel_with_fake_peer("llama.cpp", ["bench", smollm2_gguf, "-p", "8", "-n", "0", "-r", "1",
                                                      "--no-progress", "-t", "1", "--compare", "llama.cpp"], crash)
    if crash:
        assert rc == 5 and out == "", err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: the llama.cpp peer") and "SIGSEGV" in lines[0]
        assert install.LLAMA_CPP_AMX_CMAKE_ARGS in lines[0]
    else:
        assert rc == 0, err
        assert "| llama.cpp t/s | fuel/llama.cpp |" in out and "a fake peer, threads 1, in its own process" in out


@pytest.mark.parametrize("crash", ["logits", None])
def test_diff_oracle_crash(smollm2_gguf, crash):
    """diff --oracle llama.cpp whose peer segfaults: exit 5 and one line; alive, the comparison runs to
    its verdict (the fake's zero logits are a mismatch: exit 3)."""
    rc, out, err = _fuel_with_fake_peer("llama.cpp", ["diff", smollm2_gguf, "--oracle", "llama.cpp", "-t", "1",
                                                      "--tokens", "1,2,3,4,5", "--json"], crash)
    if crash:
        assert rc == 5 and out == "", err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "died of SIGSEGV (signal 11) in logits()" in lines[0]
    else:
        assert rc == 3, err
        assert '"oracle": "llama.cpp"' in out


def test_transformers_crash_names_it(fake_env, tiny):
    """The transformers peer's crash names transformers, with its own advice, not llama.cpp's."""
    from typer.testing import CliRunner

    from fuelcli.cli import app

    fake_env.setitem(PEERS, "transformers", fake_kind("transformers"))
    fake_env.setenv("FAKE_PEER_CRASH", "tg")
    r = CliRunner().invoke(app, ["bench", str(tiny("llama2")), "-p", "0", "-n", "4", "-r", "1", "--no-progress",
                                 "--compare", "transformers"])
    assert isinstance(r.exception, errors.PeerFailed) and r.exception.exit_code == 5
    assert "the transformers peer" in str(r.exception) and "in tg()" in str(r.exception)
    assert "GGML" not in str(r.exception)


def test_install_advice_said_once():
    """The llama.cpp advice is peers/install.py's: bench and diff raise it (above and
    test_diff_text.py), the README quotes its AMX build line word for word."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert install.LLAMA_CPP_AMX_BUILD in readme
    sources = [p for p in (ROOT / "fuelcli").rglob("*.py") if p.name != "install.py"]
    assert not [p for p in sources if "GGML_NATIVE" in p.read_text(encoding="utf-8")]
