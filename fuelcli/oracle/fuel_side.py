"""The side on trial: fuel's engine over one window of tokens, as blocks of logits.

"decode" path: all but the last `decode_steps` tokens go through batched prefill (in slices of
tolerances.SLICE tokens, the KV cache kept between calls), then the rest one at a time through
decode, so both the batched and the persistent-decode kernels are on trial. "prefill" path: every
token batched. Each block is handed on as soon as it exists, so memory holds one slice of logits, not the window's.
"""

from __future__ import annotations

import time

from ..errors import InputError
from ..model.finite import check_engine_logits
from . import tolerances

PATHS = ("decode", "prefill")


def split(n: int, path: str, decode_steps: int) -> int:
    """How many tokens of a window the fuel side prefills in batches."""
    if path == "prefill":
        return n
    if n < 2:
        raise InputError(f"the decode path needs at least 2 tokens (1 prefilled + decoded ones), got {n}")
    return max(1, n - decode_steps)


class FuelSide:
    def __init__(self, model, n_ctx: int, path: str = "decode", decode_steps: int = 3, hidden: bool = False,
                 device: str | None = None, slice_len: int | None = None, cache_type: str = "f32",
                 activations: str | None = None):
        if path not in PATHS:
            raise InputError(f"--path must be decode or prefill, got {path!r}")
        if decode_steps < 1:
            raise InputError(f"--decode-steps must be at least 1, got {decode_steps}")
        from ..backends import make_engine

        self.path, self.decode_steps, self.hidden = path, decode_steps, hidden
        self.slice_len = slice_len or tolerances.SLICE
        self.engine = make_engine(model.cfg, model.weights, n_ctx=n_ctx, device=device, cache_type=cache_type,
                                  activations=activations)
        self.seconds, self.tokens = 0.0, 0  # time inside the engine, tokens it ran

    def window(self, ids):
        """Yields (start, logits [n, vocab] float32, states [L+1, n, H] or None) covering ids in order."""
        e = self.engine
        e.reset()
        n_pre = split(len(ids), self.path, self.decode_steps)
        for s in range(0, n_pre, self.slice_len):
            block = ids[s:min(n_pre, s + self.slice_len)]
            t0 = time.perf_counter()
            out = e.prefill(block, all_logits=True, hidden=self.hidden)
            self._count(t0, len(block))
            logits, states = out if self.hidden else (out, None)
            check_engine_logits(e, logits, ids[:s + len(block)], self.path, s)
            yield s, logits, states
        for t in range(n_pre, len(ids)):
            t0 = time.perf_counter()
            out = e.decode(ids[t], hidden=self.hidden)
            self._count(t0, 1)
            logits, states = out if self.hidden else (out, None)
            check_engine_logits(e, logits[None, :], ids[:t + 1], self.path, t)
            yield t, logits[None, :], states

    def _count(self, t0: float, n: int):
        self.seconds += time.perf_counter() - t0
        self.tokens += n

    def prefill_len(self, n: int) -> int:
        return split(n, self.path, self.decode_steps)


def aligned(a, b):
    """Two streams of (start, rows, states) blocks over the same positions, cut differently ->
    (start, a_rows, b_rows, a_states, b_states) over their common pieces."""
    pa = pb = None
    while True:
        pa = next(a, None) if pa is None else pa
        pb = next(b, None) if pb is None else pb
        if pa is None or pb is None:
            if pa is not None or pb is not None:
                raise RuntimeError("fuel and oracle streams cover different positions")
            return
        (sa, ra, xa), (sb, rb, xb) = pa, pb
        if sa != sb:
            raise RuntimeError(f"fuel and oracle streams out of step ({sa} vs {sb})")
        n = min(len(ra), len(rb))
        yield sa, ra[:n], rb[:n], None if xa is None else xa[:, :n], None if xb is None else xb[:, :n]
        pa = None if n == len(ra) else (sa + n, ra[n:], None if xa is None else xa[:, n:])
        pb = None if n == len(rb) else (sb + n, rb[n:], None if xb is None else xb[:, n:])
