"""OpenAI's tool results for the first Gemma 4 chat template, as llama.cpp hands them to it.

That template (the one the first Gemma 4 checkpoints carry, and GGUF files converted from them) reads
a tool's results from `tool_responses` on the model's turn that called it, not from `role: tool`
messages: rendered as they come, the results would form a "tool" turn the model never saw. llama.cpp
(common/parsers/gemma4.cpp, convert_tool_responses_gemma4) folds each assistant turn with calls, the
`tool` messages after it and the assistant's answer after those into one turn; so does
`for_template`. The newer template (the 31B's, "OpenAI Chat Completions" in a comment) reads the
`tool` messages itself and is left alone.
"""

from __future__ import annotations

import json

CALL_MARK = "'<|tool_call>call:'"  # how the Gemma 4 templates write a call
READS_TOOL_MESSAGES = "{#- OpenAI Chat Completions:"


def folds_tool_results(template: str | None) -> bool:
    """Whether the template is the first Gemma 4 one, which needs the results on the calling turn."""
    return bool(template) and CALL_MARK in template and READS_TOOL_MESSAGES not in template


def for_template(messages: list[dict]) -> list[dict]:
    """The messages with each assistant turn that calls tools, the `tool` messages answering it and
    the assistant's text answer after them folded into one assistant message (tool_calls,
    tool_responses [{name, response}], content, reasoning_content)."""
    out, i = [], 0
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") != "assistant" or not isinstance(msg.get("tool_calls"), list) or not msg["tool_calls"]:
            out.append(msg)
            i += 1
            continue
        calls, i = msg["tool_calls"], i + 1
        responses = []
        while i < len(messages) and messages[i].get("role") == "tool":
            responses.append(_response(messages[i], calls, len(responses)))
            i += 1
        folded = {"role": "assistant", "tool_calls": calls}
        if responses:
            folded["tool_responses"] = responses
        if i < len(messages) and messages[i].get("role") == "assistant" and not messages[i].get("tool_calls") \
                and messages[i].get("content"):
            folded["content"] = messages[i]["content"]
            i += 1
        if isinstance(msg.get("reasoning_content"), str):
            folded["reasoning_content"] = msg["reasoning_content"]
        out.append(folded)
    return out


def _response(tool: dict, calls: list, k: int) -> dict:
    """A tool message as {name, response}: the k-th call's function name (else the message's
    tool_call_id), the content parsed as JSON where it is JSON (else the text)."""
    content = tool.get("content")
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            pass
    name = ""
    if k < len(calls) and isinstance(calls[k], dict) and isinstance(calls[k].get("function"), dict):
        name = calls[k]["function"].get("name") or ""
    return {"name": name or tool.get("tool_call_id") or "", "response": content}
