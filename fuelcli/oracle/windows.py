"""A text file as llama-perplexity's windows (tools/perplexity/perplexity.cpp, `perplexity()`):

the whole file is tokenized once (BOS in front when the vocabulary adds one; special-token text is
read as plain text, as llama.cpp's common_tokenize(..., parse_special=false)), cut into
non-overlapping windows of n_ctx tokens (the tail that fills no window is dropped), and each
window's first token is replaced by BOS when the vocabulary adds one. Perplexity scores the second
half of each window: the logits at position i (i >= n_ctx/2, i < n_ctx-1) against token i+1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..fileio.files import describe_os_error, is_present, open_regular

MIN_CTX = 4  # the smallest window with a scored half (positions n_ctx/2 .. n_ctx-2)


def read_text(path: str | Path) -> str:
    """A UTF-8 text file (a regular file: a FIFO or a directory is refused, not waited on)."""
    if not is_present(Path(path)):
        raise InputError(f"{path}: no such file")
    with open_regular(path) as f:
        try:
            data = f.read()
        except OSError as e:
            raise InputError(f"{path}: cannot read: {describe_os_error(e)}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


@dataclass
class TextWindows:
    file: str
    n_bytes: int
    ids: list  # the whole text as tokens
    ctx: int
    n_chunks: int
    bos: int | None  # the id each window starts with, when the vocabulary adds BOS

    @property
    def first(self) -> int:
        """The first position perplexity scores in every window."""
        return self.ctx // 2

    def start(self, c: int) -> int:
        return c * self.ctx

    def window(self, c: int) -> list:
        w = list(self.ids[c * self.ctx:(c + 1) * self.ctx])
        if self.bos is not None:
            w[0] = self.bos
        return w


def check_ctx(model, ctx: int):
    if ctx < MIN_CTX:
        raise InputError(f"--ctx must be at least {MIN_CTX}, got {ctx}")
    if ctx > model.cfg.max_position:
        raise InputError(f"--ctx {ctx} exceeds the model's context of {model.cfg.max_position}")


def text_windows(model, path: str | Path, ctx: int, chunks: int | None, min_tokens: int | None = None) -> TextWindows:
    """The windows of FILE; min_tokens (default: one window) is the fewest tokens the text must have."""
    check_ctx(model, ctx)
    if chunks is not None and chunks < 1:
        raise InputError(f"--chunks must be at least 1, got {chunks}")
    text = read_text(path)
    tok = model.tokenizer
    ids = tok.encode(text, add_special_tokens=True, parse_special=False)
    need = ctx if min_tokens is None else min_tokens
    if len(ids) < need:
        raise InputError(f"{path} tokenizes to only {len(ids)} tokens; a context of {ctx} needs at least {need}")
    n = len(ids) // ctx
    bos = tok.bos_token_id if tok.adds_bos else None
    return TextWindows(str(path), len(text.encode("utf-8")), ids, ctx, n if chunks is None else min(chunks, n), bos)
