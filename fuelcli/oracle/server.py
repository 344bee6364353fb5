"""--oracle http(s)://HOST:PORT/v1: an OpenAI-compatible server (vLLM, llama-server, fuel serve) as
the oracle, by teacher forcing. For each position t one POST /completions with the prompt ids[:t+1]
as token ids, max_tokens 1, temperature 0 and logprobs K: its answer's top K log-probabilities are
the server's distribution of the token after position t (its prompt cache makes request t+1 cost one
token). Two answer shapes are read:

  OpenAI's legacy completions (fuel serve, vLLM): logprobs.top_logprobs[0] = {token text: logprob};
      vLLM started with --return-tokens-as-token-ids spells each token "token_id:N"
  llama-server's: logprobs.content[0].top_logprobs = [{id, token, bytes, logprob}]

A token given by id is checked against fuel's spelling of that id (its bytes); a token given by text
alone is matched to fuel's vocabulary (text/token_bytes.py spells ids as servers do): a text no id has
means the tokenizers differ and is refused, a text several ids share (a lone byte of a split
character is "�" in all of them) has no id and goes into the "other" bucket (topk.py).
"""

from __future__ import annotations

import math
import re
from functools import cached_property

from ..errors import InputError, ServerFailed
from .http_json import Client, base_url
from .base import Oracle
from .topk import UNKNOWN, TopK

TOKEN_ID = re.compile(r"^token_id:(\d+)$")  # vLLM's --return-tokens-as-token-ids
LOWEST = -1e30  # llama-server writes log(0) as float32's lowest (JSON has no -inf)
SUM_SLACK = 1e-3  # the k probabilities may sum above 1 by the server's float32 rounding, not more


class Spelling:
    """fuel's vocabulary as servers spell it: id -> bytes, text -> ids (built on first use)."""

    def __init__(self, model):
        self.model, self.vocab = model, model.cfg.vocab_size
        self._ids = None

    @cached_property
    def tb(self):
        from ..text.token_bytes import TokenBytes

        return TokenBytes(self.model.tokenizer)

    def bytes_of(self, i: int) -> bytes:
        return bytes(self.tb.entry(i)[1])

    def special(self, i: int) -> bool:
        return self.tb.is_special(i)

    def ids_of(self, text: str) -> list:
        if self._ids is None:
            self._ids = {}
            for i in range(self.vocab):
                t = self.tb.entry(i)[0]
                if t:
                    self._ids.setdefault(t, []).append(i)
        return self._ids.get(text, [])


def _malformed(what: str):
    return ServerFailed(f"the oracle server's answer is malformed: {what}")


def _logprob(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v == math.inf:
        raise _malformed(f"{where} is {v!r}, not a log-probability")
    if v > SUM_SLACK:
        raise _malformed(f"{where} is {v:g} > 0, not a log-probability")
    return -math.inf if v <= LOWEST else min(float(v), 0.0)


def entries(reply: dict) -> list:
    """The answer's top-k as [(id or None, text or None, bytes or None, logprob)], most likely first."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _malformed("no choices[0]")
    lp = choices[0].get("logprobs")
    if lp is None:
        raise ServerFailed("the oracle server answered without logprobs (choices[0].logprobs is null): it does not "
                           "give log-probabilities on /v1/completions")
    if not isinstance(lp, dict):
        raise _malformed("choices[0].logprobs is not an object")
    out = []
    if "top_logprobs" in lp:  # OpenAI's legacy shape
        tops = lp["top_logprobs"]
        if not isinstance(tops, list) or not tops or not isinstance(tops[0], dict):
            raise _malformed("choices[0].logprobs.top_logprobs[0] is not an object of token: logprob")
        for text, v in tops[0].items():
            m = TOKEN_ID.match(text)
            out.append((int(m.group(1)) if m else None, None if m else text, None,
                        _logprob(v, f"top_logprobs[0][{text!r}]")))
    elif "content" in lp:  # llama-server's (and chat's) shape
        content = lp["content"]
        if not isinstance(content, list) or not content or not isinstance(content[0], dict):
            raise _malformed("choices[0].logprobs.content[0] is not an object")
        tops = content[0].get("top_logprobs")
        if not isinstance(tops, list) or not all(isinstance(e, dict) for e in tops):
            raise _malformed("choices[0].logprobs.content[0].top_logprobs is not a list of objects")
        for j, e in enumerate(tops):
            where = f"content[0].top_logprobs[{j}]"
            i, text, raw = e.get("id"), e.get("token"), e.get("bytes")
            if i is not None and (isinstance(i, bool) or not isinstance(i, int)):
                raise _malformed(f"{where}.id is {i!r}, not a token id")
            if text is not None and not isinstance(text, str):
                raise _malformed(f"{where}.token is not a string")
            if raw is not None and not (isinstance(raw, list) and all(type(b) is int and 0 <= b < 256 for b in raw)):
                raise _malformed(f"{where}.bytes is not a list of bytes")
            if i is None and text is None:
                raise _malformed(f"{where} has neither an id nor a token")
            out.append((i, text, None if raw is None else bytes(raw), _logprob(e.get("logprob"), f"{where}.logprob")))
    else:
        raise _malformed("choices[0].logprobs has neither top_logprobs nor content")
    if not out:
        raise ServerFailed("the oracle server answered no top logprobs (an empty list): it does not give them")
    out.sort(key=lambda e: -e[3])
    return out


class ServerOracle(Oracle):
    def __init__(self, model, url: str, top_k: int, server_model: str | None = None, api_key: str | None = None,
                 client: Client | None = None):
        super().__init__()
        if top_k < 1:
            raise InputError(f"--top-k must be at least 1, got {top_k}")
        self.url, self.top_k, self.vocab = base_url(url), top_k, model.cfg.vocab_size
        self.client = client or Client(self.url, api_key)
        self.model_id, self.served = self._pick(server_model)
        self.name = f"server {self.url} ({self.model_id}), top-{top_k} logprobs"
        self.spelling = Spelling(model)
        self.lumped = self.listed = self.checked = 0  # entries without an id; entries; ids checked by spelling

    def _pick(self, wanted: str | None) -> tuple[str, list]:
        doc = self.client.get("/models")
        data = doc.get("data")
        if not isinstance(data, list) or not all(isinstance(d, dict) and isinstance(d.get("id"), str) for d in data):
            raise _malformed("GET /models has no data: [{id}]")
        served = [d["id"] for d in data]
        if wanted is not None:
            if wanted not in served:
                raise InputError(f"the oracle server does not serve {wanted!r}; it serves "
                                 f"{', '.join(served) or 'none'}")
            return wanted, served
        if len(served) != 1:
            raise InputError(f"the oracle server serves {len(served)} models ({', '.join(served)}): "
                             "name one with --server-model" if served else "the oracle server serves no model")
        return served[0], served

    def window(self, ids, hidden=False):
        for t in range(len(ids)):
            body = {"model": self.model_id, "prompt": [int(i) for i in ids[:t + 1]], "max_tokens": 1,
                    "temperature": 0, "logprobs": self.top_k}
            reply = self._timed(lambda: self.client.post("/completions", body), 1)
            yield t, self._row(reply, t), None

    def _row(self, reply: dict, t: int) -> TopK:
        got = reply.get("model")
        if isinstance(got, str) and got != self.model_id:
            raise ServerFailed(f"the oracle server answered with model {got!r} for a request to {self.model_id!r}")
        usage = reply.get("usage")
        n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if type(n) is int and n != t + 1:
            raise ServerFailed(f"the oracle server counted {n} prompt tokens for the {t + 1} token ids sent (it adds "
                               "or changes tokens), so its positions are not fuel's")
        ids, lps, alike = [], [], frozenset()
        for j, (i, text, raw, lp) in enumerate(entries(reply)):
            self.listed += 1
            if i is not None:
                self._check(i, text, raw, t)
                if i in ids:  # listed twice: counted once
                    continue
            else:
                found = self.spelling.ids_of(text)
                if not found:
                    raise InputError(f"the oracle server's token {text!r} (position {t}) is no token of this "
                                     "model's vocabulary: the server's tokenizer is not the model's")
                if len(found) == 1:
                    i = found[0]
                else:  # spelled alike by several ids: its mass joins the "other" bucket
                    self.lumped += 1
                    i = UNKNOWN
                    alike = frozenset(found) if j == 0 else alike
            ids.append(i)
            lps.append(lp)
        total = sum(math.exp(x) for x in lps)
        if total > 1 + SUM_SLACK:
            raise _malformed(f"the top-{len(lps)} probabilities at position {t} sum to {total:.4g} > 1")
        return TopK.row(ids, lps, alike)

    def _check(self, i: int, text: str | None, raw: bytes | None, t: int):
        """A token the server names by id is the token fuel has there (unless the server leaves its
        text out, as llama-server does for special tokens)."""
        if not 0 <= i < self.vocab:
            raise InputError(f"the oracle server's token id {i} (position {t}) is outside this model's vocabulary "
                             f"of {self.vocab}: the server's tokenizer is not the model's")
        if not (raw or text) or self.spelling.special(i):
            return
        ours = self.spelling.bytes_of(i)
        if (raw != ours) if raw else (text != ours.decode("utf-8", "replace")):
            raise InputError(f"the oracle server's token id {i} (position {t}) is {raw or text!r}, this model's is "
                             f"{ours!r}: the server's tokenizer is not the model's")
        self.checked += 1

    def provenance(self):
        return {"oracle": "server", "url": self.url, "model": self.model_id, "served": self.served,
                "endpoint": "/completions (teacher forcing, one request per position)", "top_k": self.top_k,
                "entries": self.listed, "entries_without_id": self.lumped, "ids_checked_by_spelling": self.checked}
