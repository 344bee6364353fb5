"""What the streamed reply parsers share (serve's reply.ReplyParser, harmony.HarmonyParser,
gemma4_reply.Gemma4Parser): text is fed in the pieces it streams in, and each parser steps through
its states until a step changes nothing. Text that could still become a marker is held back until it
cannot (`held`), so feed() and finish() give the same parts whichever way the text is cut."""

from __future__ import annotations


def held(text: str, markers) -> int:
    """How many trailing characters of `text` are a proper prefix of one of `markers` (so may yet become it)."""
    for n in range(min(max(map(len, markers)) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def plain_call(name: str, arguments: dict) -> dict:
    return {"name": name, "arguments": arguments}


def marker_ids(tokenizer, markers) -> set[int]:
    """The ids of those of `markers` that are tokens of the tokenizer's vocabulary."""
    ids = (tokenizer.backend.token_to_id(t) for t in markers)
    return {i for i in ids if i is not None}


class StreamParser:
    """A subclass holds `buf` (the text not yet given out) and `calls`, and defines `_where()` (its
    state) and `_step(out, final)`, which appends ("reasoning" | "content", text) or ("tool_call",
    call) parts to out."""

    buf: str
    calls: list

    def feed(self, text: str) -> list[tuple[str, object]]:
        """Parts ready to send: ("reasoning" | "content", text) or ("tool_call", call)."""
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> list[tuple[str, object]]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list:
        out: list = []
        while True:
            before = (self._where(), len(self.buf))
            self._step(out, final)
            if (self._where(), len(self.buf)) == before:
                break
        return [p for p in out if p[1] != ""]

    def _where(self):
        raise NotImplementedError

    def _step(self, out: list, final: bool) -> None:
        raise NotImplementedError
