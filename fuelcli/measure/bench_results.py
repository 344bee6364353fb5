"""`fuel bench`'s results: a test's timed runs per runner, the model measured, the whole report and
its JSON form."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field

from ..weights.build import layer_vectors
from .bench_spec import TestSpec


@dataclass
class Series:
    """The timed runs of one runner on one test."""

    n_tokens: int
    seconds: list = field(default_factory=list)

    @property
    def rates(self) -> list:
        return [self.n_tokens / s for s in self.seconds]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.rates)

    @property
    def std(self) -> float:
        r = self.rates
        return statistics.stdev(r) if len(r) > 1 else 0.0

    def to_dict(self) -> dict:
        return {"samples_s": self.seconds, "samples_ts": self.rates, "avg_ts": self.mean, "stddev_ts": self.std}


@dataclass
class TestResult:
    __test__ = False
    spec: TestSpec
    fuel: Series
    peer: Series | None = None
    bytes_per_token: int = 0  # tg tests: what one decode step reads (bytes_per_token), per token it makes
    # where bench ran several engines (`--activations int16,q8`): this row's backend, and the runs of
    # the first engine on the same test, which the row's rate is given against
    backend: str | None = None
    baseline: Series | None = None

    @property
    def ratio(self) -> float | None:
        return None if self.peer is None else self.fuel.mean / self.peer.mean

    @property
    def vs_baseline(self) -> float | None:
        return None if self.baseline is None else self.fuel.mean / self.baseline.mean

    def read_rate(self) -> float:
        """Bytes/s that fuel's mean decode rate reads."""
        return self.bytes_per_token * self.fuel.mean

    def to_dict(self, peer_name: str | None, bandwidth: float = 0.0) -> dict:
        d = {"test": self.spec.name, "kind": self.spec.kind, "n_tokens": self.spec.n_tokens,
             "depth": self.spec.depth, "seqs": self.spec.seqs, "fuel": self.fuel.to_dict()}
        if self.backend is not None:
            d["backend"], d["vs_baseline"] = self.backend, self.vs_baseline
        if self.peer is not None:
            d["peer"] = {"name": peer_name, **self.peer.to_dict()}
            d["ratio"] = self.ratio
        if self.bytes_per_token:
            d["bytes_per_token"] = self.bytes_per_token
            d["read_bytes_per_s"] = self.read_rate()
            if bandwidth:
                d["roofline_fraction"] = self.read_rate() / bandwidth
        return d


@dataclass
class ModelInfo:
    name: str
    path: str
    kind: str
    family: str
    size_bytes: int
    params: int
    formats: dict  # fmt -> number of matrices, most frequent first


@dataclass
class Report:
    model: ModelInfo
    threads: int
    repetitions: int
    seed: int
    n_ctx: int
    tests: list
    peak_rss_bytes: int = 0  # fuel's process (a peer runs in its own: peer["peak_rss_bytes"])
    kv_bytes: int = 0
    peer: dict | None = None  # {"name", "detail", "threads", "peak_rss_bytes"}
    backend: str = "cpu numba"
    bandwidth: dict | None = None  # {"bytes": working set, "threads" (None: a GPU), "bytes_per_s", "measured":
    # [before, after] the tests}: the roofline, the higher of the two
    load: dict | None = None  # {"cpus", "threads", "before", "after"}: the 1-minute load average around the run

    @property
    def peer_name(self) -> str | None:
        return None if self.peer is None else self.peer["name"]

    @property
    def bandwidth_bps(self) -> float:
        return self.bandwidth["bytes_per_s"] if self.bandwidth else 0.0

    def to_dict(self) -> dict:
        return {"model": asdict(self.model), "backend": self.backend, "threads": self.threads,
                "repetitions": self.repetitions, "seed": self.seed, "n_ctx": self.n_ctx,
                "kv_bytes": self.kv_bytes, "peak_rss_bytes": self.peak_rss_bytes, "peer": self.peer,
                "bandwidth": self.bandwidth, "load": self.load,
                "tests": [t.to_dict(self.peer_name, self.bandwidth_bps) for t in self.tests]}


def report_from_dict(d: dict) -> Report:
    """The inverse of Report.to_dict (a saved `-o json` report -> Report, e.g. to render it as md)."""
    tests, first = [], {}
    for t in d["tests"]:
        spec = TestSpec(t["kind"], t["n_tokens"], t["depth"], t.get("seqs", 1))
        peer = Series(spec.tokens, list(t["peer"]["samples_s"])) if "peer" in t else None
        row = TestResult(spec, Series(spec.tokens, list(t["fuel"]["samples_s"])), peer, t.get("bytes_per_token", 0),
                         t.get("backend"))
        if row.backend is not None:
            row.baseline = first.setdefault(spec.name, row.fuel)
        tests.append(row)
    return Report(ModelInfo(**d["model"]), d["threads"], d["repetitions"], d["seed"], d["n_ctx"], tests,
                  d["peak_rss_bytes"], d["kv_bytes"], d["peer"], d["backend"],
                  d.get("bandwidth"), d.get("load"))


def model_info(source, cfg, weights) -> ModelInfo:
    mats = weights.tensors()
    vecs = [weights.final_norm]
    for layer in weights.layers:
        vecs += layer_vectors(layer)
    size = sum(t.nbytes for t in mats) + sum(int(v.nbytes) for v in vecs)
    params = sum(t.numel for t in mats) + sum(int(v.size) for v in vecs)
    formats = dict(sorted(Counter(t.fmt for t in mats).items(), key=lambda kv: (-kv[1], kv[0])))
    return ModelInfo(source.name, str(source.path), source.kind, cfg.family, size, params, formats)
