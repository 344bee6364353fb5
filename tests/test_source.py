"""fuelcli.source: local paths, and the hub path against a cache written by huggingface_hub itself.

The hub cache is filled by running the real huggingface_hub.snapshot_download against a tiny fake
hub on 127.0.0.1 serving the routes it calls (repo info, tree listing, file HEAD/GET); then
resolve() must find that snapshot with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from huggingface_hub import constants

from fuelcli.errors import InputError, ModelNotFound
from fuelcli.source import ModelSource, resolve

REPO = "fuel-test/tiny-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b"{}",
    "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
    "README.md": b"not fetched: outside fuel's allow_patterns",
}


class _FakeHub(BaseHTTPRequestHandler):
    """Just the routes snapshot_download uses; anything else is a 404 so a new route shows up."""

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head: bool):
        path = self.path.split("?")[0]
        api = f"/api/models/{REPO}"
        if path in (f"{api}/revision/main", f"{api}/revision/{COMMIT}"):
            info = {"id": REPO, "sha": COMMIT, "siblings": [{"rfilename": f} for f in FILES]}
            return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
        if path == f"{api}/tree/{COMMIT}":
            tree = [
                {"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                for f, b in FILES.items()
            ]
            return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
        prefix = f"/{REPO}/resolve/{COMMIT}/"
        if path.startswith(prefix) and path[len(prefix) :] in FILES:
            body = FILES[path[len(prefix) :]]
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
            return self._send(200, body, headers, head)
        self.server.unknown.append(f"{self.command} {self.path}")
        code = "RevisionNotFound" if path.startswith(f"{api}/revision/") else "RepoNotFound"  # as the hub answers
        self._send(404, b'{"error": "not found"}', {"X-Error-Code": code}, head)

    def do_GET(self):
        self._route(head=False)

    def do_HEAD(self):
        self._route(head=True)

    def log_message(self, *args):
        pass


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """A private HF_HOME. huggingface_hub reads its env vars once at import into `constants`,
    so the constants are patched too, not only os.environ."""
    home = tmp_path / "hf"
    for var in ("HF_HUB_CACHE", "HF_TOKEN", "HF_TOKEN_PATH", "HF_ASSETS_CACHE", "HF_XET_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    # Every path constant derived from HF_HOME (hub cache, token, xet cache, update stamps, ...).
    for name, value in vars(constants).items():
        if name.isupper() and isinstance(value, str) and value.startswith(constants.HF_HOME):
            monkeypatch.setattr(constants, name, str(home) + value[len(constants.HF_HOME) :])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    return home


def set_offline(monkeypatch, offline: bool):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


@pytest.fixture
def fake_hub(hf_home, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    server.unknown = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    set_offline(monkeypatch, False)
    yield server
    server.shutdown()
    server.server_close()


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
    fuelcli/demo.py is written separately; a local path still wins over an alias."""
    import fuelcli

    pulled = tmp_path / "smol.gguf"
    stub = types.ModuleType("fuelcli.demo")
    stub.lookup = lambda alias: pulled if alias == "smol" else None
    monkeypatch.setitem(sys.modules, "fuelcli.demo", stub)
    monkeypatch.setattr(fuelcli, "demo", stub, raising=False)
    assert resolve("smol") == ModelSource("gguf", pulled, "smol")
    set_offline(monkeypatch, True)
    with pytest.raises(ModelNotFound, match="owner/other"):
        resolve("owner/other")  # not an alias: goes on to the hub
    (tmp_path / "smol").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="config.json"):
        resolve("smol")
