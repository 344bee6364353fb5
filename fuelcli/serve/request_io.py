"""What every route does with a request: read its body (bounded), answer an APIError, and answer a
job: streamed, or its whole answer, cancelling the job when the client goes away."""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, StreamingResponse

from .errors import APIError
from .jobs import Delta, Failed
from .sse import OpenAIFrames, shutting_down, sse_stream

MAX_BODY = 16 * 2**20  # bytes; far above any prompt that fits a context


def error_response(e: APIError, body: dict | None = None) -> JSONResponse:
    """The error in OpenAI's shape, or in `body` (another API's shape of it)."""
    return JSONResponse(e.body() if body is None else body, status_code=e.status, headers=e.headers)


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


async def answer(request: Request, job, fmt, stream: bool, include_usage: bool = False, frames=OpenAIFrames):
    """The job's answer through its formatter: server-sent events (framed by `frames`), or one JSON body."""
    if stream:
        return StreamingResponse(sse_stream(job, fmt, include_usage, frames), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    watch = asyncio.create_task(cancel_on_disconnect(request, job))
    try:
        text, lps, done = await collect(job)
    finally:
        watch.cancel()
        job.cancel()  # a no-op once finished; stops the engine if this handler itself is cancelled
    return JSONResponse(fmt.response(text, lps, done))
