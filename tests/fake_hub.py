"""A tiny fake of the Hugging Face hub on 127.0.0.1, serving the routes huggingface_hub calls to
list and download a repo (repo info, tree listing, file HEAD/GET), so the real client fills a real
cache. `repos` maps a repo id to (commit, {file name: bytes}); anything else is a 404 (logged in
`unknown`, so a new route shows up)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head: bool):
        path = self.path.split("?")[0]
        for repo, (commit, files) in self.server.repos.items():
            api = f"/api/models/{repo}"
            if path in (api, f"{api}/revision/main", f"{api}/revision/{commit}"):
                info = {"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in files]}
                return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
            if path == f"{api}/tree/{commit}":
                tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                        for f, b in files.items()]
                return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
            prefix = f"/{repo}/resolve/{commit}/"
            if path.startswith(prefix) and path[len(prefix):] in files:
                body = files[path[len(prefix):]]
                if not head:
                    self.server.served.append(f"{repo}/{path[len(prefix):]}")
                headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
                return self._send(200, body, headers, head)
        self.server.unknown.append(f"{self.command} {self.path}")
        known = any(path.startswith(f"/api/models/{repo}/revision/") for repo in self.server.repos)
        code = "RevisionNotFound" if known else "RepoNotFound"  # as the hub answers
        self._send(404, b'{"error": "not found"}', {"X-Error-Code": code}, head)

    def do_GET(self):
        self._route(head=False)

    def do_HEAD(self):
        self._route(head=True)

    def log_message(self, *args):
        pass


def start() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.repos, server.unknown, server.served = {}, [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
