"""What every oracle is: a stream of logits windows, timed, with a provenance for the report."""

import time


class Oracle:
    name = "?"  # what the report says was compared
    layer_name = None  # what --layers compares with, for oracles that give residual-stream states
    top_k = None  # k for an oracle of top-k log-probabilities only (a server); None: whole logits

    def __init__(self):
        self.seconds, self.tokens = 0.0, 0

    def window(self, ids, hidden: bool = False):
        """Yields (start, logits [n, vocab] float32, states [L+1, n, H] or None) covering ids in order."""
        raise NotImplementedError

    def provenance(self) -> dict:
        raise NotImplementedError

    def _timed(self, fn, n: int):
        t0 = time.perf_counter()
        out = fn()
        self.seconds += time.perf_counter() - t0
        self.tokens += n
        return out
