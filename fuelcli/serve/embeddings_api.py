"""OpenAI's /v1/embeddings: the request checked, its texts tokenized, an EmbedJob for the engine
worker, the vectors answered as floats or base64 (little-endian float32, as OpenAI's clients decode).

`input` is a string, a list of strings, a list of token ids, or a list of token-id lists (at most
MAX_INPUTS); each is embedded on its own, from an empty cache, and must fit the context. Strings
are encoded with the tokenizer's special tokens (as sentence-transformers encodes them).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse

from .embed_job import EmbedJob
from .errors import APIError, bad_request
from .jobs import Done, Failed, model_not_found
from .pooling import truncated
from .request_io import read_body
from .schemas import Strict, parse
from .sse import shutting_down

MAX_INPUTS = 2048  # OpenAI's limit on a request's inputs


class EmbeddingRequest(Strict):
    model: str
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, v):
        """[str | list[int]]: one entry per text to embed."""
        ids = lambda x: isinstance(x, list) and bool(x) and all(type(t) is int for t in x)  # noqa: E731
        if isinstance(v, str) or ids(v):
            v = [v]
        if not isinstance(v, list) or not v:
            raise ValueError("must be a string, a list of strings, a list of token ids or a list of token-id "
                             "lists, not empty")
        if len(v) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs a request, got {len(v)}")
        for i, x in enumerate(v):
            if not (isinstance(x, str) and x) and not ids(x):
                raise ValueError(f"[{i}] must be a non-empty string or a non-empty list of token ids")
        return v

    def check(self):
        return self


def _token_ids(req: EmbeddingRequest, model) -> list[list[int]]:
    out = []
    for i, x in enumerate(req.input):
        where = "input" if len(req.input) == 1 else f"input[{i}]"
        ids = model.tokenizer.encode(x, add_special_tokens=True) if isinstance(x, str) else x
        bad = next((t for t in ids if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise bad_request(f"{where}: token id {bad} is out of range 0..{model.vocab_size - 1}", param="input")
        if not ids:
            raise bad_request(f"{where}: no tokens", param="input")
        if len(ids) > model.n_ctx:
            raise bad_request(f"{where} has {len(ids)} tokens; the context is {model.n_ctx} tokens (fuel serve -c)",
                              param="input", code="context_length_exceeded")
        out.append(ids)
    return out


def _encoded(v: np.ndarray, fmt: str):
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.tolist()


async def embeddings(state, request: Request):
    req = parse(EmbeddingRequest, await read_body(request))
    model = state.model
    if req.model not in model.names:
        raise model_not_found(req.model)
    embedder = model.embedder
    if not embedder.pooling.supported:
        raise APIError(400, f"this model declares pooling {embedder.pooling.mode!r} ({embedder.pooling.source}), "
                       "which gives no text embedding fuel computes: start fuel serve with --pooling mean|cls|last",
                       param="model", code="unsupported_pooling")
    if req.dimensions is not None and req.dimensions > embedder.hidden_size:
        raise bad_request(f"dimensions: at most the model's hidden size {embedder.hidden_size}, got {req.dimensions}",
                          param="dimensions")
    job = EmbedJob(_token_ids(req, model), embedder, asyncio.get_running_loop())
    state.worker.submit(job)
    try:
        event = await job.events.get()
    finally:
        job.cancel()  # a no-op once answered; a job still queued is dropped
    if isinstance(event, Failed):
        raise event.error
    if isinstance(event, Done):  # cancelled: the server is stopping
        raise shutting_down()
    data = [{"object": "embedding", "index": i, "embedding": _encoded(truncated(v, req.dimensions), req.encoding_format)}
            for i, v in enumerate(event.vectors)]
    usage = {"prompt_tokens": event.prompt_tokens, "total_tokens": event.prompt_tokens}
    return JSONResponse({"object": "list", "data": data, "model": model.id, "usage": usage})
