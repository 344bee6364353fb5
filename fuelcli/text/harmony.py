"""OpenAI's harmony chat format (gpt-oss): what marks it, and the tokens that end the model's turn.

A reply is a run of messages, each a header and a body:

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant<|channel|>final<|message|>...<|return|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

The markers are special tokens: a decoder that skips special tokens loses them, so a harmony reply is
decoded with them kept (the serve worker does so for jobs that read the format).
"""

from __future__ import annotations

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
# what ends a message's body: <|start|> too, for a model that opens the next message without <|end|>
BODY_ENDS = (END, RETURN, CALL, START)
# the turn is over at <|return|> (the answer) and <|call|> (a tool call, whose result comes next);
# gpt-oss's generation_config.json names both, a GGUF only its eos_token_id (llama.cpp adds them)
TURN_ENDS = (RETURN, CALL)


def is_harmony(template: str | None) -> bool:
    """Whether a chat template writes the harmony format (gpt-oss's does)."""
    return bool(template) and CHANNEL in template and MESSAGE in template and START in template


def turn_end_ids(tokenizer) -> set[int]:
    """The ids of the tokens that end a harmony turn, for a tokenizer whose template writes harmony."""
    if not is_harmony(tokenizer.chat_template):
        return set()
    ids = (tokenizer.backend.token_to_id(t) for t in TURN_ENDS)
    return {i for i in ids if i is not None}
