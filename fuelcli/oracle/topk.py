"""An oracle that gives only the k most likely tokens of each position with their log-probabilities
(a server's `logprobs`), and what can be computed from them against fuel's full logits:

  KL over a partition of the vocabulary: each of the oracle's k tokens a bucket of its own, every
  other token in one "other" bucket, on both sides:
      sum_i q_i log(q_i / p_i) + q_o log(q_o / p_o),  q_o = 1 - sum_i q_i,  p_o = fuel's mass outside
  the k tokens. Merging outcomes never raises a KL (the data-processing inequality; here the log-sum
  inequality on the "other" bucket), so this is a lower bound of the full KL(oracle ‖ fuel) at that
  position; docs/oracles.md says what it cannot see.
  max|Δ logprob| over the oracle's k tokens: |log q_i − log p_i| (log-probabilities, not logits:
  a server's logits carry an unknown shift per position).
  Each side's top-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

UNKNOWN = -1  # an entry whose id could not be told (a text several tokens share): lumped into "other"


@dataclass
class TopK:
    """Rows of an oracle's top-k: ids [n, k] (each known id at most once a row, UNKNOWN where the id
    is not known), logprobs [n, k] float64; top1_alike[r]: when row r's most likely entry has no
    known id, the ids spelled as it is (fuel's top-1 among them agrees with it)."""

    ids: np.ndarray
    logprobs: np.ndarray
    top1_alike: list = field(default_factory=list)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, s: slice) -> "TopK":
        return TopK(self.ids[s], self.logprobs[s], self.top1_alike[s])

    @staticmethod
    def row(ids: list, logprobs: list, top1_alike=frozenset()) -> "TopK":
        return TopK(np.asarray([ids], np.int64), np.asarray([logprobs], np.float64), [frozenset(top1_alike)])


def reduce(lf: np.ndarray, o: TopK):
    """fuel's log-softmax rows lf [n, vocab] (float64) against the oracle's top-k ->
    (kl [n], max_abs [n], top1_oracle [n]); top1_oracle is UNKNOWN where the oracle's top token has
    no known id and fuel's top-1 is not spelled as it is."""
    rows = np.arange(len(lf))[:, None]
    known = o.ids != UNKNOWN
    at = np.where(known, o.ids, 0)
    lp = lf[rows, at]  # fuel's log-probability of each of the oracle's tokens
    q = np.where(known, np.exp(o.logprobs), 0.0)
    kl = np.where(q > 0, q * (o.logprobs - lp), 0.0).sum(-1)
    e = np.exp(lf)
    r, c = np.nonzero(known)
    e[r, o.ids[r, c]] = 0.0
    # fuel's mass outside the known tokens, summed directly (no 1 - sum); floored at the smallest
    # normal double, so that the oracle's rounding residue against an empty bucket stays ~1e-13
    tiny = np.finfo(np.float64).tiny
    p_other = np.maximum(e.sum(-1), tiny)
    q_other = np.clip(1.0 - q.sum(-1), 0.0, 1.0)
    kl += np.where(q_other > 0, q_other * (np.log(np.maximum(q_other, tiny)) - np.log(p_other)), 0.0)
    finite = known & np.isfinite(o.logprobs)  # an underflowed oracle probability says nothing more
    max_abs = np.where(finite, np.abs(o.logprobs - lp), 0.0).max(-1)
    best = o.logprobs.argmax(-1)
    top1 = o.ids[np.arange(len(lf)), best]
    fuel_top1 = lf.argmax(-1)
    for r in np.flatnonzero(top1 == UNKNOWN):
        if int(fuel_top1[r]) in o.top1_alike[r]:
            top1[r] = fuel_top1[r]
    return np.maximum(kl, 0.0), max_abs, top1


def nll(ids: np.ndarray, logprobs: np.ndarray, target: np.ndarray) -> np.ndarray:
    """-log q of each row's target token where the oracle listed it, NaN where it did not."""
    hit = ids == target[:, None]
    return np.where(hit.any(-1), -np.where(hit, logprobs, 0.0).sum(-1), np.nan)
