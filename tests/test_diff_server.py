"""`fuel diff MODEL --oracle http://HOST:PORT/v1`: against `fuel serve` on the same tiny model it
passes with a top-k KL of ~1e-12; a block property changed on fuel's side, or one weight changed in
the file the server serves, fails with exit 3 (the negative controls); the same answers in
llama-server's and vLLM's shapes pass; every malformed or failing server is one line with its exit
code (a fake server on loopback answers each case of the table).

Measured (tiny llama2 f32, 10 tokens, top-20): max top-k KL 2e-12, max|Δ logprob| 8e-6 (fuel's
decode path against the server's one-token prefills); window 2 on fuel's side: max KL 4.4, top-1
0.2; layer 0's down_proj ×1.5 in the served file: max KL 0.16, top-1 0.8.
"""

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from block_edits import with_attention
from serve_helpers import CHARS, SPECIALS, ServerProcess, with_tokenizer
from test_diff import invoke

import fuelcli.assembly.loader
from fuelcli.oracle import http_json
from fuelcli.oracle.topk import TopK, reduce

MODEL = "tiny-chat"
IDS = [1, 17, 88, 3, 99, 42, 7, 128, 64, 31]
TOKENS = ",".join(map(str, IDS))
VOCAB = SPECIALS + CHARS  # the char tokenizer: id i spells VOCAB[i]


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory):
    return with_tokenizer(tiny("llama2"), tmp_path_factory.mktemp("oracle") / MODEL)


@pytest.fixture(scope="module")
def server(checkpoint):
    s = ServerProcess(checkpoint)
    yield s
    s.stop()


def diff_json(model, url, *extra):
    code, out, err = invoke("diff", model, "--oracle", url, "--tokens", TOKENS, "--json", *extra)
    return code, (json.loads(out) if out.strip() else None), err


# ---------------------------------------------------------------- against fuel serve


def test_passes_against_fuel_serve(checkpoint, server):
    code, r, err = diff_json(checkpoint, server.base_url)
    assert code == 0, err
    s = r["summary"]
    assert s["max_kl"] < 1e-9 and s["top1_rate"] == 1.0 and s["max_abs"] < 1e-4
    assert r["top_k"] == 20 and "lower bound" in r["measures"]["kl"]
    p = r["provenance"]["oracle"]
    assert p["model"] == MODEL and p["entries"] == 20 * len(IDS) and p["entries_without_id"] == 0


def test_prompt_and_top_k_and_the_table(checkpoint, server):
    code, out, _ = invoke("diff", checkpoint, "--oracle", server.base_url, "--prompt", "hello", "--top-k", "3",
                          "--path", "prefill")
    assert code == 0 and "verdict: PASS" in out and "top-3" in out


def test_block_property_changed_on_fuel_side_fails(checkpoint, server, monkeypatch):
    """Negative control: fuel runs the file with sliding window 2 on every layer, the server as stored."""
    real = fuelcli.assembly.loader.open_model

    def broken(model, revision=None, hf_file=None):
        m = real(model, revision, hf_file)
        m.cfg = with_attention(m.cfg, window=2)
        return m

    monkeypatch.setattr(fuelcli.assembly.loader, "open_model", broken)
    code, r, err = diff_json(checkpoint, server.base_url)
    assert code == 3 and not r["passed"] and "max KL" in err
    kl = [p["kl"] for p in r["positions"]]
    assert max(kl[:2]) < 1e-9 and max(kl[2:]) > 1e-2  # a window of 2 sees what full attention sees up to position 1


def test_weight_changed_in_the_served_file_fails(checkpoint, tmp_path):
    """Negative control: the server runs a copy of the file with one tensor scaled (the same name, so
    the same model id): a deployment that is not the file's reference."""
    from safetensors.numpy import load_file, save_file

    edited = tmp_path / MODEL
    shutil.copytree(checkpoint, edited)
    tensors = load_file(str(edited / "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.weight"] *= 1.5
    save_file(tensors, str(edited / "model.safetensors"), metadata={"format": "pt"})
    s = ServerProcess(edited)
    try:
        code, r, err = diff_json(checkpoint, s.base_url)
    finally:
        s.stop()
    assert code == 3 and r["summary"]["max_kl"] > 1e-3, r["summary"]


def test_a_text_and_layers_are_refused(checkpoint, server, tmp_path):
    (tmp_path / "t.txt").write_text("hello " * 100)
    code, _, err = invoke("diff", checkpoint, "--oracle", server.base_url, "--text", tmp_path / "t.txt", "--ctx", "16")
    assert code == 2 and "--text" in err and "--tokens" in err
    code, _, err = invoke("diff", checkpoint, "--oracle", server.base_url, "--tokens", TOKENS, "--layers")
    assert code == 2 and "--layers" in err
    code, _, err = invoke("diff", checkpoint, "--oracle", "self", "--tokens", TOKENS, "--server-model", "x")
    assert code == 2 and "server oracle" in err


# ---------------------------------------------------------------- a fake server: other shapes, malformed answers


class Fake:
    """A server on loopback whose /models and /completions answers a test sets: `models` and
    `answer(body, real)` -> (status, bytes); `real(body)` is fuel serve's own answer (a dict), so a
    case can reshape or break a true answer."""

    def __init__(self, upstream: str):
        self.upstream, self.models, self.answer, self.authorization = upstream, None, None, None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status, data):
                if status is None:  # drop the connection without an answer
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(*(fake.models or (200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())))

            def do_POST(self):
                fake.authorization = self.headers.get("Authorization")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(*fake.answer(body, fake.real))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def real(self, body: dict) -> dict:
        req = urllib.request.Request(self.upstream + "/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())


@pytest.fixture(scope="module")
def fake(server):
    f = Fake(server.base_url)
    yield f
    f.httpd.shutdown()


def ok(doc) -> tuple:
    return 200, json.dumps(doc).encode()


def top_of(real) -> dict:
    return real["choices"][0]["logprobs"]["top_logprobs"][0]


def llama_server_shape(body, real, spell=lambda t: {"bytes": list(t.encode())}):
    """fuel serve's answer as llama-server writes it: content[0].top_logprobs with ids and bytes."""
    doc = real(body)
    tops = [{"id": VOCAB.index(t), "token": t, **spell(t), "logprob": v} for t, v in top_of(doc).items()]
    doc["choices"][0]["logprobs"] = {"content": [{"id": tops[0]["id"], "token": tops[0]["token"],
                                                  "logprob": tops[0]["logprob"], "top_logprobs": tops}]}
    return ok(doc)


def vllm_token_ids(body, real):
    """fuel serve's answer as vLLM --return-tokens-as-token-ids writes it."""
    doc = real(body)
    lp = doc["choices"][0]["logprobs"]
    lp["top_logprobs"] = [{f"token_id:{VOCAB.index(t)}": v for t, v in top_of(doc).items()}]
    return ok(doc)


@pytest.mark.parametrize("shape", [llama_server_shape, vllm_token_ids,
                                   lambda b, r: llama_server_shape(b, r, lambda t: {})],
                         ids=["llama-server", "vllm-token-ids", "ids-and-text-only"])
def test_other_servers_answer_shapes_pass(checkpoint, fake, shape):
    fake.models, fake.answer = None, shape
    code, r, err = diff_json(checkpoint, fake.url)
    assert code == 0, err
    assert r["summary"]["max_kl"] < 1e-9 and r["summary"]["top1_rate"] == 1.0


def with_top(body, real, top):
    doc = real(body)
    doc["choices"][0]["logprobs"]["top_logprobs"] = [top]
    return ok(doc)


def patched(path, value):
    """fuel serve's true answer with doc[path...] = value."""
    def answer(body, real):
        doc = real(body)
        *head, last = path
        target = doc
        for k in head:
            target = target[k]
        target[last] = value
        return ok(doc)

    return answer


def raw_answer(status, data):
    return lambda body, real: (status, data)


TWO = {"object": "list", "data": [{"id": MODEL}, {"id": "other"}]}
# case: (models answer, completions answer, extra args, exit code, words of the message)
CASES = {
    "models-404": ((404, b'{"error": {"message": "no route"}}'), None, (), 5, ["HTTP 404", "/v1"]),
    "models-not-json": ((200, b"<html>"), None, (), 5, ["not valid JSON"]),
    "models-no-data": ((200, b'{"object": "list"}'), None, (), 5, ["malformed", "/models"]),
    "models-none": ((200, b'{"data": []}'), None, (), 2, ["serves no model"]),
    "models-two-unnamed": ((200, json.dumps(TWO).encode()), None, (), 2, ["2 models", "--server-model"]),
    "models-not-served": (None, None, ("--server-model", "nope"), 2, ["does not serve 'nope'", MODEL]),
    "http-500": (None, raw_answer(500, b'{"error": {"message": "boom"}}'), (), 5, ["HTTP 500", "boom"]),
    "http-401": (None, raw_answer(401, b'{"error": {"message": "no key"}}'), (), 5, ["HTTP 401", "--api-key"]),
    "http-400-logprobs": (None, raw_answer(400, b'{"message": "logprobs must be <= 5"}'), (), 5,
                          ["HTTP 400", "--top-k"]),
    "dropped": (None, raw_answer(None, b""), (), 5, ["broke off"]),
    "not-json": (None, raw_answer(200, b"{'choices': 1"), (), 5, ["not valid JSON"]),
    "not-utf8": (None, raw_answer(200, b'{"choices": "\xff"}'), (), 5, ["not UTF-8"]),
    "nested-too-deeply": (None, raw_answer(200, b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}"), (), 5,
                          ["nests too deeply"]),
    "json-array": (None, raw_answer(200, b"[1, 2]"), (), 5, ["not a JSON object"]),
    "no-choices": (None, patched(["choices"], []), (), 5, ["choices[0]"]),
    "logprobs-null": (None, patched(["choices", 0, "logprobs"], None), (), 5, ["without logprobs"]),
    "logprobs-a-list": (None, patched(["choices", 0, "logprobs"], [1]), (), 5, ["not an object"]),
    "logprobs-empty": (None, patched(["choices", 0, "logprobs"], {}), (), 5, ["neither top_logprobs nor content"]),
    "top-empty-list": (None, patched(["choices", 0, "logprobs", "top_logprobs"], []), (), 5, ["top_logprobs[0]"]),
    "top-empty-object": (None, lambda b, r: with_top(b, r, {}), (), 5, ["no top logprobs"]),
    "logprob-a-string": (None, lambda b, r: with_top(b, r, {"a": "-1"}), (), 5, ["not a log-probability"]),
    "logprob-nan": (None, raw_answer(200, b'{"choices": [{"logprobs": {"top_logprobs": [{"a": NaN}]}}]}'), (), 5,
                    ["nan"]),
    "logprob-positive": (None, lambda b, r: with_top(b, r, {"a": 0.5}), (), 5, ["> 0"]),
    "sum-above-one": (None, lambda b, r: with_top(b, r, {"a": -0.1, "b": -0.2}), (), 5, ["sum to", "> 1"]),
    "content-bad-id": (None, patched(["choices", 0, "logprobs"], {"content": [{"top_logprobs": [
        {"id": "7", "logprob": -1.0}]}]}), (), 5, ["not a token id"]),
    "content-no-id-no-token": (None, patched(["choices", 0, "logprobs"], {"content": [{"top_logprobs": [
        {"logprob": -1.0}]}]}), (), 5, ["neither an id nor a token"]),
    "content-bad-bytes": (None, patched(["choices", 0, "logprobs"], {"content": [{"top_logprobs": [
        {"id": 7, "bytes": [300], "logprob": -1.0}]}]}), (), 5, ["not a list of bytes"]),
    "other-model": (None, patched(["model"], "someone-else"), (), 5, ["'someone-else'"]),
    "prompt-tokens-off": (None, patched(["usage", "prompt_tokens"], 99), (), 5, ["counted 99 prompt tokens"]),
    # the server is not this model's: its tokens are not fuel's
    "unknown-text": (None, lambda b, r: with_top(b, r, {"zzz": -0.1}), (), 2, ["'zzz'", "tokenizer"]),
    "id-outside-vocab": (None, patched(["choices", 0, "logprobs"], {"content": [{"top_logprobs": [
        {"id": 9999, "token": "a", "logprob": -0.1}]}]}), (), 2, ["9999", "outside"]),
    "id-spelled-otherwise": (None, lambda b, r: llama_server_shape(b, r, lambda t: {"bytes": list(b"?!")}), (), 2,
                             ["is b'?!'", "tokenizer"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_and_failing_servers(checkpoint, fake, case):
    models, answer, extra, want, words = CASES[case]
    fake.models, fake.answer = models, answer or (lambda b, r: ok(r(b)))
    code, _, err = invoke("diff", checkpoint, "--oracle", fake.url, "--tokens", TOKENS, *extra)
    assert code == want, err
    assert "\n" not in err and all(w in err for w in words), err


def test_the_api_key_is_sent(checkpoint, fake, monkeypatch):
    fake.models, fake.answer = None, lambda b, r: ok(r(b))
    assert invoke("diff", checkpoint, "--oracle", fake.url, "--tokens", "1,2", "--api-key", "k1")[0] == 0
    assert fake.authorization == "Bearer k1"
    monkeypatch.setenv("FUEL_API_KEY", "k2")
    assert invoke("diff", checkpoint, "--oracle", fake.url, "--tokens", "1,2")[0] == 0
    assert fake.authorization == "Bearer k2"


def test_url_errors(checkpoint):
    for url, words in [("http://", ["no host"]), ("http://h:port/v1", ["not a URL"]),
                       ("http://127.0.0.1:9/v1?x=1", ["?query"])]:
        code, _, err = invoke("diff", checkpoint, "--oracle", url, "--tokens", TOKENS)
        assert code == 2 and all(w in err for w in words), (url, err)
    code, _, err = invoke("diff", checkpoint, "--oracle", "http://127.0.0.1:9/v1", "--tokens", TOKENS)
    assert code == 5 and "cannot reach" in err


def test_a_server_that_does_not_answer_times_out(checkpoint, fake, monkeypatch):
    monkeypatch.setattr(http_json, "TIMEOUT_S", 0.5)
    fake.models, fake.answer = None, lambda b, r: (time.sleep(2), ok(r(b)))[1]
    code, _, err = invoke("diff", checkpoint, "--oracle", fake.url, "--tokens", TOKENS)
    assert code == 5 and ("0.5 s" in err or "timed out" in err), err


def test_through_main_one_line_no_traceback(checkpoint, fake):
    fake.models, fake.answer = None, raw_answer(200, b"not json")
    r = subprocess.run([sys.executable, "-m", "fuelcli", "diff", str(checkpoint), "--oracle", fake.url,
                        "--tokens", TOKENS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 5 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- the top-k KL itself


def test_top_k_kl_is_a_lower_bound_and_exact_with_the_whole_vocabulary():
    rng = np.random.default_rng(0)
    f, o = rng.normal(size=(6, 50)) * 3, rng.normal(size=(6, 50)) * 3
    lf = f - np.log(np.exp(f).sum(-1, keepdims=True))
    lo = o - np.log(np.exp(o).sum(-1, keepdims=True))
    full = (np.exp(lo) * (lo - lf)).sum(-1)
    for k in (1, 5, 20, 50):
        top = np.argsort(-lo, -1)[:, :k]
        kl, max_abs, top1 = reduce(lf, TopK(top, np.take_along_axis(lo, top, -1), [frozenset()] * 6))
        assert np.all(kl <= full + 1e-12) and np.all(kl >= 0)
        assert np.array_equal(top1, lo.argmax(-1))
        np.testing.assert_allclose(max_abs, np.abs(np.take_along_axis(lo - lf, top, -1)).max(-1))
    np.testing.assert_allclose(kl, full, rtol=1e-10)  # k = the vocabulary: the full KL


def test_top_k_kl_sees_a_shift_inside_the_top_k_only():
    """Blind spot: a change that moves mass among the tail tokens only leaves the top-k KL at 0."""
    lo = np.log(np.r_[0.5, 0.3, np.full(8, 0.2 / 8)])[None]
    tail_moved = np.log(np.r_[0.5, 0.3, 0.2 * 0.9, np.full(7, 0.2 * 0.1 / 7)])[None]
    top = np.array([[0, 1]])
    kl, _, _ = reduce(tail_moved, TopK(top, lo[:, :2], [frozenset()]))
    assert kl[0] < 1e-12 and (np.exp(lo) * (lo - tail_moved)).sum() > 0.1
    head_moved = np.log(np.r_[0.3, 0.5, np.full(8, 0.2 / 8)])[None]
    assert reduce(head_moved, TopK(top, lo[:, :2], [frozenset()]))[0][0] > 0.1
