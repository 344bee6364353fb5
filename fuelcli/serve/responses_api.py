"""OpenAI's Responses API: POST /v1/responses.

A request is checked and translated to a ChatRequest (responses_api_schemas.py), served as a chat
completion is, and answered in the Responses shapes (responses_api_format.py). Responses are kept
in memory for previous_response_id, the most recent STORED_RESPONSES of them (store false keeps
none); its jobs count as endpoint "responses" in /metrics.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from starlette.requests import Request

from .errors import APIError, bad_request
from .jobs import chat_job, takes_effort
from .request_io import answer, read_body
from .responses_api_format import ResponsesFormat, ResponsesFrames
from .responses_api_schemas import ResponsesRequest, to_chat
from .schemas import parse

STORED_RESPONSES = 256  # the conversations kept for previous_response_id, the oldest dropped first


class ResponseStore:
    """The conversations (chat turns, without the instructions) of recent responses, by id."""

    def __init__(self, size: int = STORED_RESPONSES):
        self.size, self.items = size, OrderedDict()

    def get(self, response_id: str) -> list[dict]:
        if response_id not in self.items:
            raise APIError(404, f"No response with id '{response_id}' is kept (fuel serve keeps the last "
                           f"{self.size} responses in memory, and none made with store false)",
                           param="previous_response_id", code="not_found")
        self.items.move_to_end(response_id)
        return self.items[response_id]

    def put(self, response_id: str, turns: list[dict]) -> None:
        self.items[response_id] = turns
        while len(self.items) > self.size:
            self.items.popitem(last=False)


ECHOED = ("instructions", "max_output_tokens", "temperature", "top_p", "tool_choice", "parallel_tool_calls",
          "previous_response_id", "metadata", "user")


def _echo(req: ResponsesRequest) -> dict:
    """The request's fields a response repeats, with OpenAI's defaults."""
    out = req.model_dump(include=set(ECHOED), mode="json")
    out |= {"tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "tool_choice": req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump")
            else req.tool_choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls is not False, "store": req.store is not False,
            "metadata": req.metadata or {}, "truncation": "disabled", "object": "response",
            "text": {"format": req.text.format.model_dump(exclude_none=True, by_alias=True)
                     if req.text is not None and req.text.format is not None else {"type": "text"}}}
    return out


async def responses(state, request: Request):
    req = parse(ResponsesRequest, await read_body(request))
    if req.reasoning is not None and req.reasoning.effort is not None and not takes_effort(state.model):
        raise bad_request("reasoning.effort is not supported by this model's chat template (chat_template_kwargs "
                          "{\"enable_thinking\": false} turns a Qwen3 model's thinking off)", param="reasoning.effort")
    history = state.responses.get(req.previous_response_id) if req.previous_response_id else []
    chat, conversation = to_chat(req, history)
    job = chat_job(chat, state.model, asyncio.get_running_loop())
    job.kind = "responses"
    state.worker.submit(job)
    fmt = ResponsesFormat(state.model.id, job.parser(), _echo(req), lambda turn: None)
    if req.store is not False:
        fmt.remember = lambda turn: state.responses.put(fmt.id, conversation + [turn])
    return await answer(request, job, fmt, req.stream, frames=ResponsesFrames())
