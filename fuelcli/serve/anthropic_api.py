"""Anthropic's routes: POST /v1/messages and /v1/messages/count_tokens.

A request is checked (anthropic_schemas.py), translated to a ChatRequest and served as a chat
completion is; the reply comes back in Anthropic's shapes (anthropic_format.py). Its jobs count as
endpoint "messages" in /metrics.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse

from .anthropic_format import AnthropicFrames, MessagesFormat
from .anthropic_schemas import CountTokensRequest, MessagesRequest, to_chat
from .jobs import chat_job, chat_prompt
from .request_io import answer, read_body
from .schemas import parse


async def messages(state, request: Request):
    req = parse(MessagesRequest, await read_body(request))
    job = chat_job(to_chat(req), state.model, asyncio.get_running_loop())
    job.kind = "messages"
    state.worker.submit(job)
    fmt = MessagesFormat(state.model.id, job.parser(), len(job.prompt_ids))
    return await answer(request, job, fmt, req.stream, frames=AnthropicFrames)


async def count_tokens(state, request: Request):
    req = parse(CountTokensRequest, await read_body(request))
    _, ids, _, _ = chat_prompt(to_chat(req), state.model)
    return JSONResponse({"input_tokens": len(ids)})
