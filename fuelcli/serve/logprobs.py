"""Log-probabilities of generated tokens (the `logprobs` fields).

The log-probabilities are the model's own: log-softmax of its logits before the sampler's
processors (penalties, temperature, top-k/p, min-p), as llama-server and vLLM report them by
default. So they do not depend on the sampling settings and are defined for greedy decoding too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..text.token_bytes import TokenBytes


@dataclass
class TokenLogprob:
    token: str
    bytes: list[int]
    logprob: float
    top: list[tuple[str, list[int], float]]  # the k most likely tokens at this step, most likely first
    special: bool = False  # a special token: reported here, but not part of the text

    @property
    def shown(self) -> int:
        """Characters this token adds to the text."""
        return 0 if self.special else len(self.token)


def logprobs_of(logits: np.ndarray, token: int, k: int, token_bytes: "TokenBytes") -> TokenLogprob:
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top = []
    if k > 0:
        ids = np.argpartition(-x, k - 1)[:k] if k < x.size else np.arange(x.size)
        ids = ids[np.argsort(-x[ids], kind="stable")]
        top = [(*token_bytes.entry(int(i)), float(x[i] - lse)) for i in ids]
    return TokenLogprob(*token_bytes.entry(token), float(x[token] - lse), top, token_bytes.is_special(token))
