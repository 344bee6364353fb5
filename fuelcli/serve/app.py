"""The routes (starlette): /health, /v1/models, /v1/chat/completions, /v1/completions, /metrics.

Every route answers errors in OpenAI's shape and never lets an exception reach the server: an
unexpected one becomes a 500 with one line in the log, not a traceback. With an API key set, every
route but /health needs `Authorization: Bearer KEY` (401 otherwise). The paths also answer
without the /v1 prefix, as llama-server's do.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from .errors import APIError
from .jobs import Delta, Failed, ServedModel, chat_job, completion_job, model_not_found
from .responses import ChatFormat, CompletionFormat
from .schemas import ChatRequest, CompletionRequest, parse
from .sse import shutting_down, sse_stream
from .worker import EngineWorker

log = logging.getLogger("fuel.serve")

MAX_BODY = 16 * 2**20  # bytes; far above any prompt that fits a context


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    too_big = APIError(413, f"the request body exceeds {limit // 2**20} MiB", code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_big
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
    except ClientDisconnect:  # nobody will read the answer; not a server error
        raise APIError(400, "the client closed the connection before sending the whole body") from None
    return bytes(body)


async def cancel_on_disconnect(request: Request, job) -> None:
    """For a non-streamed answer: cancel the job when the client goes away while it waits."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def collect(job):
    """Waits for the whole answer: (text, logprobs, Done)."""
    text, lps = [], []
    while True:
        event = await job.events.get()
        if isinstance(event, Delta):
            text.append(event.text)
            lps.extend(event.logprobs)
        elif isinstance(event, Failed):
            raise event.error
        elif event.finish_reason == "cancelled":
            raise shutting_down()  # (or the client is gone and reads nothing)
        else:
            return "".join(text), lps, event


def create_app(model: ServedModel, worker: EngineWorker, api_key: str | None = None,
               metrics: bool = False) -> Starlette:
    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "Incorrect API key provided." if given else
                           "You didn't provide an API key: send it as `Authorization: Bearer KEY`.",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def endpoint(fn, auth: bool = True):
        async def handle(request: Request):
            try:
                if auth:
                    authorize(request)
                return await fn(request)
            except APIError as e:
                return error_response(e)
            except Exception as e:  # a bug of ours: one line in the log, a 500, no traceback
                log.error("%s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
                log.debug("the failure in full", exc_info=True)  # only at --log-level debug
                return error_response(APIError(500, f"internal error: {type(e).__name__}", type="server_error"))

        return handle

    def model_card() -> dict:
        return {"id": model.id, "object": "model", "created": model.created, "owned_by": "fuel"}

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    async def list_models(request: Request):
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def get_model(request: Request):
        name = request.path_params["model_id"]
        if name not in model.names:
            raise model_not_found(name)
        return JSONResponse(model_card())

    async def complete(request: Request, schema, build, make_format):
        req = parse(schema, await read_body(request))
        if req.model not in model.names:
            raise model_not_found(req.model)
        job = build(req, model, asyncio.get_running_loop())
        worker.submit(job)
        fmt = make_format(req, job)
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(sse_stream(job, fmt, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watch = asyncio.create_task(cancel_on_disconnect(request, job))
        try:
            text, lps, done = await collect(job)
        finally:
            watch.cancel()
            job.cancel()  # a no-op once finished; stops the engine if this handler itself is cancelled
        return JSONResponse(fmt.response(text, lps, done.finish_reason, done.stats))

    async def chat(request: Request):
        return await complete(request, ChatRequest, chat_job,
                              lambda req, job: ChatFormat(model.id, req.n_logprobs, job.parser()))

    async def completions(request: Request):
        return await complete(request, CompletionRequest, completion_job,
                              lambda req, job: CompletionFormat(model.id, req.n_logprobs))

    async def show_metrics(request: Request):
        if not metrics:  # as llama-server without --metrics
            raise APIError(501, "metrics are off: start fuel serve with --metrics", type="not_supported_error",
                           code="not_supported")
        text = worker.metrics.render(waiting=worker.jobs.qsize(), running=len(worker.running))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [Route("/health", endpoint(health, auth=False), methods=["GET"]),
              Route("/metrics", endpoint(show_metrics), methods=["GET"])]
    for prefix in ("/v1", ""):
        routes += [
            Route(f"{prefix}/models", endpoint(list_models), methods=["GET"]),
            Route(f"{prefix}/models/{{model_id:path}}", endpoint(get_model), methods=["GET"]),
            Route(f"{prefix}/chat/completions", endpoint(chat), methods=["POST"]),
            Route(f"{prefix}/completions", endpoint(completions), methods=["POST"]),
        ]

    async def http_error(request: Request, exc: HTTPException):
        what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        e = APIError(exc.status_code, what.get(exc.status_code, str(exc.detail)),
                     code="not_found" if exc.status_code == 404 else None, headers=exc.headers)
        return error_response(e)

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
