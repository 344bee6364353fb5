"""fuelcli.sources.source: local paths, and the hub path against a cache written by huggingface_hub itself.

The hub cache is filled by running the real huggingface_hub.snapshot_download against a tiny fake
hub on 127.0.0.1 serving the routes it calls (tests/fake_hub.py; fixtures in conftest.py); then
resolve() must find that snapshot with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import sys
import types

import pytest
from conftest import set_offline

from fuelcli.errors import InputError, ModelNotFound
from fuelcli.sources.source import ModelSource, resolve

REPO = "fuel-test/tiny-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b"{}",
    "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
    "README.md": b"not fetched: outside fuel's allow_patterns",
}


@pytest.fixture
def fake_hub(fake_hub_server):
    fake_hub_server.repos[REPO] = (COMMIT, FILES)
    return fake_hub_server


def test_hub_snapshot_found_offline(fake_hub, hf_home, monkeypatch):
    online = resolve(REPO)  # downloads through the real huggingface_hub into hf_home
    assert [u for u in fake_hub.unknown if REPO in u] == []  # (side calls like /api/agent-harnesses may 404)
    storage = hf_home / "hub" / "models--fuel-test--tiny-model"
    assert (storage / "refs" / "main").read_text() == COMMIT
    assert (storage / "snapshots" / COMMIT / "config.json").is_symlink()  # blobs + symlinks, as the hub lays it
    assert not (storage / "snapshots" / COMMIT / "README.md").exists()  # allow_patterns honoured

    set_offline(monkeypatch, True)
    fake_hub.shutdown()  # prove offline mode needs no server
    for rev in (None, "main", COMMIT):
        src = resolve(REPO, revision=rev)
        assert src == ModelSource("dir", storage / "snapshots" / COMMIT, REPO) == online
        assert (src.path / "config.json").read_bytes() == FILES["config.json"]


def test_hub_offline_uncached(hf_home, monkeypatch):
    set_offline(monkeypatch, True)
    with pytest.raises(ModelNotFound, match=r"fuel-test/absent.*HF_HUB_OFFLINE"):
        resolve("fuel-test/absent")
    with pytest.raises(ModelNotFound, match=r"fuel-test/absent \(revision v2\)"):
        resolve("fuel-test/absent", revision="v2")


def test_hub_unknown_revision_offline(fake_hub, monkeypatch):
    resolve(REPO)
    set_offline(monkeypatch, True)
    with pytest.raises(ModelNotFound, match=r"tiny-model \(revision v9\)"):
        resolve(REPO, revision="v9")


def test_hub_missing_repo_or_revision(fake_hub):
    with pytest.raises(ModelNotFound, match="fuel-test/nope: no such hub repo") as e:
        resolve("fuel-test/nope")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelNotFound, match=r"tiny-model \(revision v9\): no such revision"):
        resolve(REPO, revision="v9")


def test_local_dir(tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    with pytest.raises(InputError, match="config.json"):
        resolve(str(d))
    (d / "config.json").write_text("{}")
    assert resolve(str(d)) == ModelSource("dir", d.resolve(), "my-model")


def test_gguf_path(tmp_path):
    f = tmp_path / "m.Q4_0.gguf"
    f.write_bytes(b"GGUF")
    assert resolve(str(f)) == ModelSource("gguf", f.resolve(), "m.Q4_0.gguf")


def test_bad_local_paths(tmp_path):
    other = tmp_path / "weights.bin"
    other.write_bytes(b"")
    with pytest.raises(InputError, match="weights.bin"):
        resolve(str(other))
    with pytest.raises(ModelNotFound, match="nowhere.gguf"):
        resolve(str(tmp_path / "nowhere.gguf"))
    with pytest.raises(ModelNotFound, match="not-a-model"):
        resolve("not-a-model")


def test_demo_alias_before_hub(tmp_path, hf_home, monkeypatch):
    """The demo module's contract (lookup -> .gguf path | None) with a stand-in module, since
    fuelcli/sources/demo.py is written separately; a local path still wins over an alias."""
    import fuelcli.sources

    pulled = tmp_path / "smol.gguf"
    stub = types.ModuleType("fuelcli.sources.demo")
    stub.lookup = lambda alias: pulled if alias == "smol" else None
    monkeypatch.setitem(sys.modules, "fuelcli.sources.demo", stub)
    monkeypatch.setattr(fuelcli.sources, "demo", stub, raising=False)
    assert resolve("smol") == ModelSource("gguf", pulled, "smol")
    set_offline(monkeypatch, True)
    with pytest.raises(ModelNotFound, match="owner/other"):
        resolve("owner/other")  # not an alias: goes on to the hub
    (tmp_path / "smol").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="config.json"):
        resolve("smol")
