"""What a comparison found, the verdict, and its JSON: one result for a short token list (a row per
position) and one for a long text (per window and overall summaries, per-position arrays)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .metrics import layer_diffs, perplexity


# what "kl" and "max_abs" are, by the kind of oracle
MEASURES = {
    "logits": {"kl": "KL(oracle ‖ fuel) over the vocabulary, nats", "max_abs": "max|Δ| of the logits"},
    "top_k": {"kl": "KL(oracle ‖ fuel) over the oracle's top-k tokens and one bucket of all others, nats "
                    "(a lower bound of the full KL)",
              "max_abs": "max|Δ| of the log-probabilities of the oracle's top-k tokens"},
}


@dataclass
class PositionDiff:
    pos: int
    token: int
    step: str  # "prefill" | "decode"
    max_abs: float
    top1_fuel: int
    top1_oracle: int
    kl: float

    @property
    def top1_agree(self) -> bool:
        return self.top1_fuel == self.top1_oracle


class Verdict:
    """The pass/fail rules shared by both results: the largest KL at any position within tol, the
    top-1 agreement rate at least min_top1, and (if given) max|Δ| within atol."""

    tol: float
    min_top1: float
    atol: float | None
    layer_list: list

    @property
    def passed(self) -> bool:
        return not self.reasons()

    def reasons(self) -> list:
        out = []
        if not self.max_kl <= self.tol:  # not `>`: a NaN never passes
            out.append(f"max KL {self.max_kl:.3g} > tol {self.tol:g}")
        if self.atol is not None and not self.max_abs <= self.atol:
            out.append(f"max|Δ| {self.max_abs:.3g} > atol {self.atol:g}")
        if self.top1_rate < self.min_top1:
            out.append(f"top-1 agreement {self.top1_rate:.3f} < {self.min_top1:g}")
        return out

    @property
    def first_bad_layer(self) -> int | None:
        return next((lay.layer for lay in self.layer_list if not lay.ok), None)

    def _verdict_json(self) -> dict:
        return {"passed": self.passed, "verdict": "pass" if self.passed else "mismatch", "reasons": self.reasons()}


@dataclass
class DiffResult(Verdict):
    """A short token list: every position reported."""

    oracle: str
    path: str
    tokens: list
    prefill_len: int
    positions: list
    tol: float
    min_top1: float
    atol: float | None = None
    layers: list = field(default_factory=list)
    layer_tol: float | None = None
    layer_oracle: str | None = None
    provenance: dict = field(default_factory=dict)
    window: object = None  # the metrics.WindowStats behind it (per-position arrays, for --plot)
    top_k: int | None = None  # an oracle of top-k log-probabilities: KL over them + "other", max|Δ logprob|

    @property
    def layer_list(self):
        return self.layers

    @property
    def max_abs(self) -> float:
        return max(p.max_abs for p in self.positions)

    @property
    def mean_kl(self) -> float:
        return float(np.mean([p.kl for p in self.positions]))

    @property
    def max_kl(self) -> float:
        return max(p.kl for p in self.positions)

    @property
    def top1_rate(self) -> float:
        return sum(p.top1_agree for p in self.positions) / len(self.positions)

    def position_ok(self, p: PositionDiff) -> bool:
        return p.kl <= self.tol and p.top1_agree and (self.atol is None or p.max_abs <= self.atol)

    def to_json(self) -> dict:
        return {
            "oracle": self.oracle,
            "path": self.path,
            "tokens": list(self.tokens),
            "prefill_len": self.prefill_len,
            "decode_steps": len(self.tokens) - self.prefill_len if self.path == "decode" else 0,
            "positions": [{**asdict(p), "top1_agree": p.top1_agree} for p in self.positions],
            "summary": {"max_abs": self.max_abs, "mean_kl": self.mean_kl, "max_kl": self.max_kl,
                        "top1_rate": self.top1_rate},
            "top_k": self.top_k,
            "measures": MEASURES["top_k" if self.top_k else "logits"],
            "tol": self.tol,
            "atol": self.atol,
            "min_top1": self.min_top1,
            "layers": [asdict(lay) for lay in self.layers] if self.layers else None,
            "layer_oracle": self.layer_oracle,
            "layer_tol": self.layer_tol,
            "first_bad_layer": self.first_bad_layer,
            "provenance": self.provenance,
            **self._verdict_json(),
        }


def from_window(st, n_pre: int) -> list:
    """A short window's WindowStats as one PositionDiff per position."""
    return [PositionDiff(t, int(st.ids[t]), "prefill" if t < n_pre else "decode", float(st.max_abs[t]),
                         int(st.top1_fuel[t]), int(st.top1_oracle[t]), float(st.kl[t])) for t in range(len(st))]


def _stats(kl: np.ndarray) -> dict:
    return {"mean_kl": float(kl.mean()), "p99_kl": float(np.percentile(kl, 99)), "max_kl": float(kl.max())}


def _first_over(kl: np.ndarray, tol: float) -> int | None:
    over = np.flatnonzero(kl > tol)
    return int(over[0]) if len(over) else None


def _floats(a, digits: int = 6) -> list:
    """JSON numbers with `digits` significant digits (a 4096-position array stays readable)."""
    return [float(f"{x:.{digits}g}") for x in np.asarray(a, np.float64).tolist()]


@dataclass
class TextDiffResult(Verdict):
    """A long text in llama-perplexity windows: KL at every position of every window, perplexity of
    both sides over each window's second half."""

    oracle: str
    path: str
    windows: object  # windows.TextWindows
    stats: list  # metrics.WindowStats, one per window
    tol: float
    min_top1: float
    atol: float | None = None
    layer_tol: float | None = None
    layer_oracle: str | None = None
    provenance: dict = field(default_factory=dict)
    speed: dict = field(default_factory=dict)  # side -> {"tokens", "seconds", "tokens_per_second"}

    @property
    def kl(self) -> np.ndarray:
        return np.concatenate([s.kl for s in self.stats])

    @property
    def max_abs(self) -> float:
        return float(max(s.max_abs.max() for s in self.stats))

    @property
    def max_kl(self) -> float:
        return float(self.kl.max())

    @property
    def top1_rate(self) -> float:
        return float(np.concatenate([s.top1_agree for s in self.stats]).mean())

    def scored(self, side: str) -> np.ndarray:
        """The NLL of every token perplexity scores (each window's second half)."""
        first = self.windows.first
        return np.concatenate([getattr(s, f"nll_{side}")[first:] for s in self.stats])

    def ppl(self, side: str) -> tuple[float, float]:
        return perplexity(self.scored(side))

    @property
    def first_over_tol(self) -> dict | None:
        """The earliest context position at which KL crosses tol, over all windows (a RoPE or
        long-context bug shows as a position, whatever the window)."""
        best = None
        for c, s in enumerate(self.stats):
            p = _first_over(s.kl, self.tol)
            if p is not None and (best is None or p < best["pos"]):
                best = {"pos": p, "chunk": c, "token_index": self.windows.start(c) + p, "kl": float(s.kl[p])}
        return best

    @property
    def by_position(self) -> dict:
        """Per context position, over the windows: mean and max KL."""
        kl = np.stack([s.kl for s in self.stats])
        return {"mean_kl": kl.mean(0), "max_kl": kl.max(0)}

    @property
    def has_layers(self) -> bool:
        return self.stats[0].layer_abs is not None

    @property
    def layer_list(self) -> list:
        if not self.has_layers:
            return []
        abs_ = np.concatenate([s.layer_abs for s in self.stats], axis=1)
        scale = np.max([s.layer_scale for s in self.stats], axis=0)
        return layer_diffs(abs_, scale, self.layer_tol)

    @property
    def layer_rel_by_position(self) -> np.ndarray:
        """[L+1, n_ctx]: per layer and context position, the largest max|Δ| over windows relative to
        the layer's scale (the picture's heat map)."""
        scale = np.maximum(np.max([s.layer_scale for s in self.stats], axis=0), 1e-30)
        return np.max([s.layer_abs for s in self.stats], axis=0) / scale[:, None]

    def chunk(self, c: int) -> dict:
        s, first = self.stats[c], self.windows.first
        return {"index": c, "start": self.windows.start(c), **_stats(s.kl),
                "top1_rate": float(s.top1_agree.mean()), "max_abs": float(s.max_abs.max()),
                "ppl_fuel": perplexity(s.nll_fuel[first:])[0], "ppl_oracle": perplexity(s.nll_oracle[first:])[0],
                "first_over_tol": _first_over(s.kl, self.tol)}

    def to_json(self) -> dict:
        w = self.windows
        (pf, ef), (po, eo) = self.ppl("fuel"), self.ppl("oracle")
        chunks = [{**self.chunk(c),
                   "positions": {"kl": _floats(s.kl), "top1_agree": s.top1_agree.astype(int).tolist(),
                                 "max_abs": _floats(s.max_abs), "nll_fuel": _floats(s.nll_fuel),
                                 "nll_oracle": _floats(s.nll_oracle)}}
                  for c, s in enumerate(self.stats)]
        layers = self.layer_list
        return {
            "mode": "text",
            "oracle": self.oracle,
            "path": self.path,
            "text": {"file": w.file, "bytes": w.n_bytes, "tokens": len(w.ids)},
            "ctx": w.ctx,
            "chunks_used": len(self.stats),
            "scored_from": w.first,
            "bos": w.bos,
            "summary": {**_stats(self.kl), "top1_rate": self.top1_rate, "max_abs": self.max_abs,
                        "positions": int(sum(len(s) for s in self.stats)),
                        "ppl_fuel": pf, "ppl_fuel_stderr": ef, "ppl_oracle": po, "ppl_oracle_stderr": eo,
                        "first_over_tol": self.first_over_tol},
            "by_position": {k: _floats(v) for k, v in self.by_position.items()},
            "chunks": chunks,
            "tol": self.tol,
            "atol": self.atol,
            "min_top1": self.min_top1,
            "layers": [asdict(lay) for lay in layers] if layers else None,
            "layer_rel_by_position": [_floats(r, 4) for r in self.layer_rel_by_position] if layers else None,
            "layer_oracle": self.layer_oracle,
            "layer_tol": self.layer_tol,
            "first_bad_layer": self.first_bad_layer,
            "speed": self.speed,
            "provenance": self.provenance,
            **self._verdict_json(),
        }
