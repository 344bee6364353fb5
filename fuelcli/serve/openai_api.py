"""OpenAI's routes: /v1/models, /v1/chat/completions, /v1/completions, and /health, /metrics.

Each handler takes the app's state (app.AppState) and the request; app.py wraps it with the auth
and the error handling.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

from .errors import APIError
from .jobs import chat_job, completion_job, model_not_found
from .request_io import answer, read_body
from .responses import ChatFormat, CompletionFormat
from .schemas import ChatRequest, CompletionRequest, parse


def model_card(state) -> dict:
    model = state.model
    return {"id": model.id, "object": "model", "created": model.created, "owned_by": "fuel"}


async def health(state, request: Request):
    return JSONResponse({"status": "ok"})


async def list_models(state, request: Request):
    return JSONResponse({"object": "list", "data": [model_card(state)]})


async def get_model(state, request: Request):
    name = request.path_params["model_id"]
    if name not in state.model.names:
        raise model_not_found(name)
    return JSONResponse(model_card(state))


async def _complete(state, request: Request, schema, build, make_format):
    req = parse(schema, await read_body(request))
    job = build(req, state.model, asyncio.get_running_loop())
    state.worker.submit(job)
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    return await answer(request, job, make_format(req, job), req.stream, include_usage)


async def chat(state, request: Request):
    return await _complete(state, request, ChatRequest, chat_job,
                           lambda req, job: ChatFormat(state.model.id, req.n_logprobs, job.parser()))


async def completions(state, request: Request):
    return await _complete(state, request, CompletionRequest, completion_job,
                           lambda req, job: CompletionFormat(state.model.id, req.n_logprobs))


async def show_metrics(state, request: Request):
    if not state.metrics:  # as llama-server without --metrics
        raise APIError(501, "metrics are off: start fuel serve with --metrics", type="not_supported_error",
                       code="not_supported")
    worker = state.worker
    text = worker.metrics.render(waiting=worker.jobs.qsize(), running=len(worker.running))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
