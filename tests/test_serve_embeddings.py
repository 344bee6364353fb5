"""/v1/embeddings on a live `fuel serve`, through the official openai client.

The checkpoint is Qwen3-Embedding-shaped: a tiny random Qwen3 (tests/tiny_models.py) with a character
tokenizer, plus sentence-transformers' modules (Transformer, Pooling with last-token pooling as
Qwen3-Embedding declares it, Normalize). The reference is sentence-transformers itself on
transformers' model: each vector within 1e-4 cosine distance of fuel's. The negative control pools
the same states by mean where last is declared, and must miss. A second server serves the checkpoint
without the modules and with --pooling mean, against sentence-transformers' mean pooling. Both sides
take the token ids of tokenizer.json.
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import openai
import pytest

from serve_helpers import ServerProcess, assert_error_shape, raw, with_tokenizer

MODEL = "tiny-embed"
TEXTS = ["The quick brown fox", "jumps over the lazy dog.", "a", "Héllo, wörld! 123"]
TOL = 1e-4  # cosine distance


def st_modules(directory, mode: str) -> None:
    """sentence-transformers' files for Transformer -> Pooling(mode) -> Normalize, as the hub's."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    flags = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": None, "mean_sqrt_len_tokens": None,
             "weightedmean_tokens": None, "lasttoken": "last"}
    conf = {"word_embedding_dimension": 64, **{f"pooling_mode_{k}": v == mode for k, v in flags.items()},
            "include_prompt": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(conf))
    (directory / "2_Normalize").mkdir(exist_ok=True)


@pytest.fixture(scope="module")
def plain(tiny, tmp_path_factory):
    """The tiny Qwen3 with a tokenizer and no sentence-transformers files (a plain causal LM)."""
    return with_tokenizer(tiny("qwen3_bias_headdim"), tmp_path_factory.mktemp("embed") / "plain")


@pytest.fixture(scope="module")
def declared(plain, tmp_path_factory):
    """The same with sentence-transformers' modules declaring last-token pooling (Qwen3-Embedding's)."""
    d = tmp_path_factory.mktemp("embed") / MODEL
    shutil.copytree(plain, d)
    st_modules(d, "last")
    return d


@pytest.fixture(scope="module")
def server(declared):
    s = ServerProcess(declared, "--metrics", "--parallel", "2")
    yield s
    assert s.stop() == 130
    assert "Traceback" not in s.log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)


def reference(directory, texts, mode: str | None = None) -> np.ndarray:
    """sentence-transformers on transformers: the vectors of `texts` (normalised) with the directory's
    own modules, or with Pooling(mode) in place of its pooling."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    model = st.SentenceTransformer(str(directory), device="cpu")
    if mode is not None:
        pooling = Pooling(64, pooling_mode={"last": "lasttoken"}.get(mode, mode))
        model = st.SentenceTransformer(modules=[model[0], pooling, Normalize()], device="cpu")
    # the ids of tokenizer.json as fuel reads it (transformers' tokenizer class reads the test's character
    # tokenizer's spaces otherwise); one text at a time: no padding
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    out = []
    with torch.no_grad():
        for t in texts:
            ids = torch.tensor([tok.encode(t).ids])
            out.append(model({"input_ids": ids, "attention_mask": torch.ones_like(ids)})["sentence_embedding"][0])
    return torch.stack(out).numpy()


def cosine_distance(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return 1 - (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def vectors(resp) -> np.ndarray:
    return np.array([d.embedding for d in sorted(resp.data, key=lambda d: d.index)], np.float64)


def test_declared_last_pooling_matches_sentence_transformers(client, declared):
    resp = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    got = vectors(resp)
    assert got.shape == (len(TEXTS), 64) and [d.index for d in resp.data] == list(range(len(TEXTS)))
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    st = pytest.importorskip("sentence_transformers")
    assert st.SentenceTransformer(str(declared), device="cpu")[1].pooling_mode == "lasttoken"
    assert cosine_distance(got, reference(declared, TEXTS)).max() <= TOL
    # the negative control: mean pooling where last is declared is told apart
    assert cosine_distance(got, reference(declared, TEXTS, "mean")).min() > 100 * TOL
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == sum(len(t) + 1 for t in TEXTS)  # chars + BOS


def test_input_forms_and_base64(client):
    """A string, token ids, a list of token-id lists, base64 (the openai client's default) all agree."""
    one = vectors(client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float"))
    ids = [1] + [ord(c) - 32 + 6 for c in TEXTS[0]]  # BOS + the character vocabulary's ids (serve_helpers.CHARS)
    by_ids = vectors(client.embeddings.create(model=MODEL, input=ids, encoding_format="float"))
    by_lists = vectors(client.embeddings.create(model=MODEL, input=[ids, ids[:3]], encoding_format="float"))
    b64 = vectors(client.embeddings.create(model=MODEL, input=TEXTS[0]))  # the client asks for base64, decodes it
    np.testing.assert_array_equal(one, by_ids)
    np.testing.assert_array_equal(one[0], by_lists[0])
    np.testing.assert_array_equal(one, b64.astype(np.float32))
    assert cosine_distance(by_lists[0], by_lists[1]) > TOL


def test_dimensions_truncate_and_renormalise(client):
    full = vectors(client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float"))
    cut = vectors(client.embeddings.create(model=MODEL, input=TEXTS[:2], dimensions=16, encoding_format="float"))
    assert cut.shape == (2, 16)
    want = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, want, atol=1e-6)


def test_embeddings_beside_generation(client):
    """A chat request and an embeddings request together: both answered, the vector unchanged."""
    before = vectors(client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float"))
    chat = []
    t = threading.Thread(target=lambda: chat.append(client.completions.create(
        model=MODEL, prompt="abc", max_tokens=40, temperature=0)))
    t.start()
    during = vectors(client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float"))
    t.join(120)
    assert chat and chat[0].choices[0].finish_reason in ("length", "stop")
    np.testing.assert_array_equal(before, during)


MALFORMED = [
    ({"model": MODEL}, "input"),
    ({"input": "x"}, "model"),
    ({"model": MODEL, "input": 3}, "input"),
    ({"model": MODEL, "input": []}, "input"),
    ({"model": MODEL, "input": [[]]}, "input"),
    ({"model": MODEL, "input": ""}, "input"),
    ({"model": MODEL, "input": ["a", 3]}, "input"),
    ({"model": MODEL, "input": [1, "a"]}, "input"),
    ({"model": MODEL, "input": [[1, 2], "a", [3.5]]}, "input"),
    ({"model": MODEL, "input": {"text": "a"}}, "input"),
    ({"model": MODEL, "input": [[[1]]]}, "input"),
    ({"model": MODEL, "input": [True]}, "input"),
    ({"model": MODEL, "input": [10**6]}, "input"),
    ({"model": MODEL, "input": [-1]}, "input"),
    ({"model": MODEL, "input": "x" * 300}, "input"),  # more tokens than the context (256)
    ({"model": MODEL, "input": ["a"] * 2049}, "input"),
    ({"model": MODEL, "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"model": MODEL, "input": "a", "encoding_format": 1}, "encoding_format"),
    ({"model": MODEL, "input": "a", "dimensions": 0}, "dimensions"),
    ({"model": MODEL, "input": "a", "dimensions": -3}, "dimensions"),
    ({"model": MODEL, "input": "a", "dimensions": 65}, "dimensions"),
    ({"model": MODEL, "input": "a", "dimensions": "8"}, "dimensions"),
    ({"model": MODEL, "input": "a", "dimensions": 8.0}, "dimensions"),
    ({"model": MODEL, "input": "a", "pooling": "mean"}, "pooling"),
    ({"model": 5, "input": "a"}, "model"),
]


@pytest.mark.parametrize("body,field", MALFORMED, ids=[f"{i}-{f}" for i, (_, f) in enumerate(MALFORMED)])
def test_malformed_is_a_400_naming_the_field(server, body, field):
    err = assert_error_shape(*raw(server.port, "POST", "/v1/embeddings", json.dumps(body))[::2], 400)
    assert err["param"] == field and field in err["message"], err


def test_malformed_bodies(server):
    for body in ["", "[1, 2]", "{", "null", '{"model": "tiny-embed", "input": ' + "[" * 100000 + "]" * 100000 + "}"]:
        status, _, data = raw(server.port, "POST", "/v1/embeddings", body)
        assert_error_shape(status, data, 400)
    assert_error_shape(*raw(server.port, "POST", "/v1/embeddings",
                            json.dumps({"model": "nope", "input": "a"}))[::2], 404, "nope")


def test_metrics_count_the_endpoint(client, server):
    client.embeddings.create(model=MODEL, input="count me", encoding_format="float")
    text = raw(server.port, "GET", "/metrics")[2].decode()
    line = next(l for l in text.splitlines() if l.startswith('fuel_requests_total{endpoint="embeddings"'))
    assert 'finish_reason="stop"' in line and int(line.split()[-1]) >= 1


def test_pooling_option_overrides(plain):
    """A plain causal LM's default is last-token pooling; --pooling mean overrides it."""
    s = ServerProcess(plain, "--pooling", "mean")
    try:
        c = openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0)
        got = vectors(c.embeddings.create(model="plain", input=TEXTS, encoding_format="float"))
    finally:
        assert s.stop() == 130
    assert "Traceback" not in s.log
    tmp = plain.parent / "plain-mean"
    if not tmp.exists():
        shutil.copytree(plain, tmp)
        st_modules(tmp, "mean")
    assert cosine_distance(got, reference(tmp, TEXTS)).max() <= TOL


def test_model_pooling_resolution(tmp_path):
    from fuelcli.errors import InputError
    from fuelcli.serve.pooling import model_pooling

    assert model_pooling("dir", tmp_path, None, None).mode == "last"  # a plain causal LM
    assert model_pooling("dir", tmp_path, None, "cls").mode == "cls"
    for value, mode in [(0, "none"), (1, "mean"), (2, "cls"), (3, "last"), (4, "rank")]:
        meta = {"general.architecture": "qwen3", "qwen3.pooling_type": value}
        assert model_pooling("gguf", tmp_path / "m.gguf", meta, None).mode == mode
    assert model_pooling("gguf", tmp_path / "m.gguf", {"general.architecture": "llama"}, None).mode == "last"
    odd = {"general.architecture": "qwen3", "qwen3.pooling_type": "mean"}
    assert not model_pooling("gguf", tmp_path / "m.gguf", odd, None).supported
    st_modules(tmp_path, "cls")
    assert model_pooling("dir", tmp_path, None, None).mode == "cls"
    assert model_pooling("dir", tmp_path, None, "mean").mode == "mean"
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "lasttoken"}))
    assert model_pooling("dir", tmp_path, None, None).mode == "last"
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    assert not model_pooling("dir", tmp_path, None, None).supported
    for bad in ["[1]", "{", '[{"type": "sentence_transformers.models.Pooling", "path": 3}]']:
        (tmp_path / "modules.json").write_text(bad)
        with pytest.raises(InputError, match="modules.json"):
            model_pooling("dir", tmp_path, None, None)


# --- in process, over test_serve_worker's scripted engine: how embeddings share the engine ----------

H = 8


def scripted_hidden_engine(**kw):
    from test_serve_worker import ScriptedEngine

    class HiddenEngine(ScriptedEngine):
        """ScriptedEngine whose prefill also gives a residual stream: row t is token t's one-hot
        (mod H) plus the position."""

        def prefill(self, tokens, all_logits=False, hidden=False):
            start = self.pos
            logits = super().prefill(tokens, all_logits)
            if not hidden:
                return logits
            ids = np.asarray(tokens).reshape(-1)
            states = np.zeros((1, len(ids), H), np.float32)
            states[0, np.arange(len(ids)), ids % H] = 1.0
            states[0, :, 0] += start + np.arange(len(ids))
            return logits, states

    return HiddenEngine(**kw)


@pytest.fixture
def scripted():
    from fuelcli.serve.pooling import Embedder, Pooling
    from test_serve_worker import Served

    made = []

    def make(mode="last", **kw):
        made.append(Served(scripted_hidden_engine(**kw), metrics=True))
        made[-1].model.embedder = Embedder(np.ones(H, np.float32), 1e-6, Pooling(mode, "test"), H)
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_unsupported_pooling_is_a_400_naming_the_option(scripted):
    s = scripted(mode="rank")
    err = assert_error_shape(*raw(s.port, "POST", "/v1/embeddings", json.dumps({"model": "scripted", "input": "a"}))[::2],
                             400, "--pooling", "rank")
    assert err["param"] == "model"


def test_each_input_from_an_empty_cache_after_the_generation_on_slot_0(scripted):
    """An embeddings request that arrives during a generation waits for it, both are answered, and each
    input starts at position 0 (the vectors of equal inputs are equal, whatever ran before)."""
    s = scripted(delay_s=0.02)
    replies = []
    t = threading.Thread(target=lambda: replies.append(s.client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "hi"}], max_tokens=20, temperature=0)))
    t.start()
    wait_for_running(s)
    out = s.client.embeddings.create(model="scripted", input=["abc", "abc", [5, 6]], encoding_format="float")
    t.join(30)
    assert replies and replies[0].choices[0].finish_reason == "length" and len(replies[0].choices[0].message.content) == 20
    got = vectors(out)
    np.testing.assert_array_equal(got[0], got[1])
    assert out.usage.prompt_tokens == 4 + 4 + 2
    assert s.engine.pos == 0  # slot 0 left empty: the next chat prefills its whole prompt


def wait_for_running(s, timeout=10.0):
    end = time.monotonic() + timeout
    while not s.worker.running:
        assert time.monotonic() < end, "the chat never started"
        time.sleep(0.005)


def test_engine_failure_is_a_500_and_the_server_goes_on(scripted):
    s = scripted(fail_on_call=1)
    err = assert_error_shape(*raw(s.port, "POST", "/v1/embeddings",
                                  json.dumps({"model": "scripted", "input": "a"}))[::2], 500, "embeddings failed")
    assert err["type"] == "server_error"
    assert len(s.client.embeddings.create(model="scripted", input="a").data) == 1
    text = raw(s.port, "GET", "/metrics")[2].decode()
    assert 'fuel_requests_total{endpoint="embeddings",finish_reason="error"} 1' in text
    assert 'fuel_requests_total{endpoint="embeddings",finish_reason="stop"} 1' in text


def test_hub_download_fetches_the_pooling(fake_hub_server, hf_home):
    """A hub model's modules.json and 1_Pooling/config.json come with it (and another module's do not)."""
    from fuelcli.serve.pooling import model_pooling
    from fuelcli.sources.source import resolve

    repo, commit = "fuel-test/tiny-embedding", "89abcdef0123456789abcdef0123456789abcdef"
    files = {"config.json": b'{"model_type": "qwen3"}', "tokenizer.json": b"{}",
             "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
             "modules.json": json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                          "type": "sentence_transformers.models.Pooling"}]).encode(),
             "1_Pooling/config.json": json.dumps({"pooling_mode_cls_token": True}).encode(),
             "2_Dense/config.json": b"{}"}
    fake_hub_server.repos[repo] = (commit, files)
    src = resolve(repo)
    assert (src.path / "1_Pooling" / "config.json").is_file() and not (src.path / "2_Dense").exists()
    assert model_pooling(src.kind, src.path, None, None).mode == "cls"
