"""A sequence's state beyond the KV cache: each linear-attention layer's conv window (the last
taps - 1 inputs) and the delta rule's [k_head_dim, v_head_dim] matrix per value head, for every slot.

A KV cache rewinds by forgetting positions; a recurrent state cannot: it is restored from a
checkpoint taken at a position (as llama.cpp's recurrent-state checkpoints). The engine takes one at
the end of every prompt segment (a turn, a request's prompt) and keeps the last KEEP of each slot;
position 0 needs none (the state starts at zero there).
"""

from __future__ import annotations

import numpy as np

KEEP = 2  # checkpoints per slot: a chat's last turn and the one before


class RecurrentState:
    def __init__(self, spec, n_layers: int, slots: int):
        self.layers = n_layers if spec is not None else 0
        if self.layers:
            self.rec = np.zeros((n_layers, slots, spec.v_heads, spec.k_head_dim, spec.v_head_dim), np.float32)
            self.conv = np.zeros((n_layers, slots, spec.conv_kernel - 1, spec.conv_dim), np.float32)
        else:  # the forward's arguments keep their types
            self.rec, self.conv = np.zeros((1, 1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32)
        self.checkpoints = [{} for _ in range(slots)]  # slot -> {position: (rec, conv)}
        self.verified = [None] * slots  # slot -> (position, rec, conv, tokens) before its last verify

    def save(self, slot: int, pos: int):
        if not self.layers or pos == 0:
            return
        kept = self.checkpoints[slot]
        kept[pos] = (self.rec[:, slot].copy(), self.conv[:, slot].copy())
        for old in sorted(kept)[:-KEEP]:
            del kept[old]

    def restore(self, slot: int, pos: int) -> int:
        """The state of the latest checkpoint at or before pos, restored; its position (0: none, and
        the next forward starts the state afresh)."""
        kept = self.checkpoints[slot]
        at = max((p for p in kept if p <= pos), default=0)
        for p in [p for p in kept if p > pos]:
            del kept[p]  # past the rewind: its tokens may be replaced
        if at:
            self.rec[:, slot], self.conv[:, slot] = kept[at]
        return at

    def before_verify(self, slot: int, pos: int, tokens):
        """Keeps the state before a verify of `tokens` at pos (speculative decoding rewinds into them)."""
        if self.layers:
            self.verified[slot] = (pos, self.rec[:, slot].copy(), self.conv[:, slot].copy(), list(tokens))

    def restore_verified(self, slot: int, pos: int) -> list | None:
        """Back to the state before the last verify when pos lies within its tokens: the tokens from
        there to pos, to run again; None when pos lies before it."""
        last, self.verified[slot] = self.verified[slot], None
        if last is None or not last[0] <= pos <= last[0] + len(last[3]):
            return None
        at, rec, conv, tokens = last
        self.rec[:, slot], self.conv[:, slot] = rec, conv
        return tokens[:pos - at]

    def clear(self, slot: int):
        self.checkpoints[slot].clear()
        self.verified[slot] = None
