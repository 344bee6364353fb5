"""A job's events as server-sent events, framed per API: OpenAI's `data: {chunk}` frames ending with
`data: [DONE]`, or Anthropic's `event: TYPE` + `data: {event}` frames.

Once the headers are out an error can no longer change the status, so it goes as a frame holding
the API's error object (the openai and anthropic clients raise it). When the client disconnects,
starlette cancels this generator, and `finally` cancels the job so the engine stops generating for
nobody.
"""

from __future__ import annotations

import json
import logging

from .errors import APIError
from .jobs import Delta, Failed, Job

log = logging.getLogger("fuel.serve")

DONE = "data: [DONE]\n\n"


def frame(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class OpenAIFrames:
    end = DONE

    @staticmethod
    def frame(data: dict) -> str:
        return frame(data)

    @staticmethod
    def error(e: APIError) -> str:
        return frame(e.body())


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", type="server_error")


async def sse_stream(job: Job, fmt, include_usage: bool, frames=OpenAIFrames):
    try:
        start = fmt.start_chunk()
        if start is not None:
            yield frames.frame(start)
        while True:
            event = await job.events.get()
            if isinstance(event, Delta):
                for chunk in fmt.delta_chunks(event.text, event.logprobs):
                    yield frames.frame(chunk)
            elif isinstance(event, Failed):
                yield frames.error(event.error)
                break
            elif event.finish_reason == "cancelled":
                yield frames.error(shutting_down())
                break
            else:
                for chunk in fmt.finish_chunks(event):
                    yield frames.frame(chunk)
                if include_usage:
                    yield frames.frame(fmt.usage_chunk(event.stats))
                break
        if frames.end:
            yield frames.end
    except Exception as e:  # a bug of ours: one line in the log, an error frame, no traceback
        log.error("streaming a response: %s: %s", type(e).__name__, e)
        yield frames.error(APIError(500, f"internal error: {type(e).__name__}", type="server_error"))
    finally:
        job.cancel()
