"""Per-position numbers of two sets of logits, reduced block by block so no [T, vocab] float64 array
ever exists: KL(oracle ‖ fuel), max|Δ|, each side's top-1 and the negative log-likelihood each side
gives the next token; per layer, max|Δ| of the residual stream at each position and the layer's
scale (max|oracle state|). An oracle of top-k log-probabilities only (a server) is reduced by topk.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from . import topk
from .topk import TopK

ROWS = 32  # rows per float64 step: 32 x 151936 x 8 B = 39 MB per temporary


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl_div(oracle: np.ndarray, fuel: np.ndarray) -> np.ndarray:
    """KL(oracle ‖ fuel) per row, in nats, computed in float64."""
    lo, lf = log_softmax(oracle), log_softmax(fuel)
    return np.maximum((np.exp(lo) * (lo - lf)).sum(-1), 0.0)


@dataclass
class LayerDiff:
    layer: int  # -1 = the embeddings (input to layer 0); i = the residual stream after layer i
    max_abs: float
    scale: float  # max|oracle state| of that layer
    rel: float  # max_abs / scale
    ok: bool  # rel <= layer_tol


class WindowStats:
    """The per-position numbers of one window of n tokens, filled block by block (add)."""

    def __init__(self, ids, n_states: int = 0):
        n = len(ids)
        self.ids = np.asarray(ids, np.int64)
        self.kl = np.full(n, np.nan)
        self.max_abs = np.full(n, np.nan)
        self.top1_fuel = np.full(n, -1, np.int64)
        self.top1_oracle = np.full(n, -1, np.int64)
        # logits at position t score token t+1: the last position has no target
        self.nll_fuel = np.full(n - 1, np.nan)
        self.nll_oracle = np.full(n - 1, np.nan)
        self.layer_abs = np.zeros((n_states, n)) if n_states else None  # max_h |Δ| per layer and position
        self.layer_scale = np.zeros(n_states) if n_states else None  # max |oracle state| per layer

    def __len__(self):
        return len(self.ids)

    def add(self, start: int, fuel: np.ndarray, oracle, fuel_states=None, oracle_states=None):
        """oracle: logits [rows, vocab] like fuel's, or a server's topk.TopK rows."""
        sparse = isinstance(oracle, TopK)
        if not sparse and fuel.shape != oracle.shape:
            raise InputError(f"logits shapes differ: fuel {list(fuel.shape)} vs oracle {list(oracle.shape)}")
        n = len(self.ids)
        for s in range(0, len(fuel), ROWS):
            f, o = fuel[s:s + ROWS], oracle[s:s + ROWS]
            p0 = start + s
            rows = np.arange(len(f))
            lf = log_softmax(f)
            sl = slice(p0, p0 + len(f))
            self.top1_fuel[sl] = f.argmax(-1)
            if sparse:
                self.kl[sl], self.max_abs[sl], self.top1_oracle[sl] = topk.reduce(lf, o)
            else:
                lo = log_softmax(o)
                self.kl[sl] = np.maximum((np.exp(lo) * (lo - lf)).sum(-1), 0.0)
                self.max_abs[sl] = np.abs(f.astype(np.float64) - o).max(-1)
                self.top1_oracle[sl] = o.argmax(-1)
            has = p0 + rows + 1 < n
            tgt = self.ids[p0 + rows[has] + 1]
            self.nll_fuel[p0 + rows[has]] = -lf[rows[has], tgt]
            self.nll_oracle[p0 + rows[has]] = (topk.nll(o.ids[has], o.logprobs[has], tgt) if sparse
                                               else -lo[rows[has], tgt])
        if self.layer_abs is not None:
            if fuel_states is None or oracle_states is None or fuel_states.shape != oracle_states.shape:
                shapes = [None if x is None else list(x.shape) for x in (fuel_states, oracle_states)]
                raise InputError(f"hidden-state shapes differ: fuel {shapes[0]} vs oracle {shapes[1]}")
            d = np.abs(fuel_states.astype(np.float64) - oracle_states).max(-1)  # [L+1, rows]
            self.layer_abs[:, start:start + len(fuel)] = d
            self.layer_scale = np.maximum(self.layer_scale, np.abs(oracle_states).max(axis=(1, 2)))

    @property
    def top1_agree(self) -> np.ndarray:
        return self.top1_fuel == self.top1_oracle


def layer_diffs(layer_abs: np.ndarray, layer_scale: np.ndarray, rtol: float) -> list:
    """Per layer (entry 0 = embeddings): max|Δ| over every position and dimension, relative to the
    layer's max|oracle state|. The residual stream grows with depth (|x| ~ 50-100 on the tiny
    models, hundreds on real ones), so a layer is judged relative to its own scale."""
    m = layer_abs.max(-1)
    scale = np.maximum(layer_scale, 1e-30)
    rel = m / scale
    return [LayerDiff(i - 1, float(m[i]), float(layer_scale[i]), float(rel[i]), bool(rel[i] <= rtol))
            for i in range(len(m))]


def perplexity(nll: np.ndarray) -> tuple[float, float]:
    """exp(mean NLL) and llama-perplexity's uncertainty: sqrt(var(NLL) / (count - 1)) * PPL."""
    nll = np.asarray(nll, np.float64)
    count = len(nll)
    if count == 0:
        return float("nan"), float("nan")
    mean = nll.sum() / count
    ppl = float(np.exp(mean))
    var = (nll * nll).sum() / count - mean * mean
    err = float(np.sqrt(var / (count - 1)) * ppl) if var > 0 and count > 1 else float("nan")
    return ppl, err
