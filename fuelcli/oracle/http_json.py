"""JSON over HTTP(S) to an OpenAI-compatible server, with the standard library (urllib). Every failure
is one line: ServerFailed (exit 5) when the server cannot be reached, answers a non-2xx status or
answers what is not a JSON object (read by jsondoc, as every JSON document fuel reads); InputError
(exit 2) for a URL that is not one."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request

from ..errors import InputError, ServerFailed
from ..fileio.jsondoc import parse_object

TIMEOUT_S = 300.0  # per request: one new token behind a cached prefix, or a whole prompt's prefill
MAX_REPLY = 64 * 2**20  # bytes; a top-k answer is a few kB


def is_url(spec: str) -> bool:
    return spec.lower().startswith(("http://", "https://"))


def base_url(spec: str) -> str:
    """The server's base URL as the openai client takes it (http://HOST:PORT/v1), checked."""
    try:
        u = urllib.parse.urlsplit(spec)
        u.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as e:
        raise InputError(f"--oracle {spec}: not a URL ({e})") from None
    if not u.hostname:
        raise InputError(f"--oracle {spec}: no host (use http://HOST:PORT/v1)")
    if u.query or u.fragment:
        raise InputError(f"--oracle {spec}: the base URL takes no ?query or #fragment")
    return spec.rstrip("/")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _error_message(raw: bytes) -> str:
    """What a server's error body says: OpenAI's {"error": {"message"}}, vLLM's older {"message"}, or
    the body itself."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON (or hostile): the body itself, cut short
        return _one_line(raw.decode("utf-8", "replace"))
    if isinstance(doc, dict):
        e = doc.get("error")
        for msg in (e.get("message") if isinstance(e, dict) else e, doc.get("message"), doc.get("detail")):
            if isinstance(msg, str) and msg:
                return _one_line(msg)
    return _one_line(raw.decode("utf-8", "replace"))


class Client:
    def __init__(self, base: str, api_key: str | None = None, timeout: float | None = None):
        self.base, self.timeout = base, TIMEOUT_S if timeout is None else timeout
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def get(self, path: str) -> dict:
        return self._request("GET", path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._request("POST", path, json.dumps(body).encode())

    def _request(self, method: str, path: str, data: bytes | None) -> dict:
        url = self.base + path
        what = f"the oracle server ({method} {url})"
        req = urllib.request.Request(url, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read(MAX_REPLY + 1)
        except urllib.error.HTTPError as e:
            try:
                body = e.read(MAX_REPLY)
            except (OSError, http.client.HTTPException):
                body = b""
            msg = _error_message(body) or e.reason
            hint = {401: " (give the server's key with --api-key)",
                    404: " (the base URL of an OpenAI-compatible server ends in /v1)"}.get(e.code, "")
            if e.code in (400, 422, 500) and "logprob" in str(msg).lower():
                hint = " (lower --top-k: servers cap it, vLLM at its --max-logprobs, 20 by default)"
            elif e.code in (400, 422, 500) and "prompt" in str(msg).lower():
                hint = " (fuel sends the prompt as token ids: this server may take text only)"
            raise ServerFailed(f"{what} answered HTTP {e.code}: {msg}{hint}") from None
        except urllib.error.URLError as e:
            reason = e.reason if not isinstance(e.reason, OSError) else (e.reason.strerror or e.reason)
            raise ServerFailed(f"cannot reach {what}: {reason}") from None
        except (TimeoutError, socket.timeout):
            raise ServerFailed(f"{what} did not answer within {self.timeout:g} s") from None
        except (http.client.HTTPException, OSError) as e:  # a dropped connection, a reply that is not HTTP
            raise ServerFailed(f"{what} broke off: {type(e).__name__}: {_one_line(str(e)) or 'no reply'}") from None
        if len(raw) > MAX_REPLY:
            raise ServerFailed(f"{what} answered more than {MAX_REPLY // 2**20} MiB")
        return parse_object(raw, f"the answer of {what}", ServerFailed)
