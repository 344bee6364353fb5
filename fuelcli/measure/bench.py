"""llama-bench-style throughput: `pp<N>` (prefill N tokens in one batch) and `tg<N>` (N one-token decodes).

Many sequences (`--parallel 1,2,4`): `tg<N> xB` runs B sequences side by side, N steps of one forward
over one new token of each (the engine's slots; llama.cpp's batch of B sequence ids, transformers'
batch dimension). Its rate is the tokens of all B per second; "t/s/seq" divides by B.

What is timed and what is not:
  * token ids are random (a seeded numpy rng), drawn before the clock starts: no tokenizer, no sampling;
    a tg test feeds the next pre-drawn random id at every step (llama-bench does the same);
  * the KV cache is cleared before every run, then `depth` random tokens are prefilled *untimed*, so a
    test at depth D measures pp/tg after D cached tokens;
  * every (runner, test) pair gets one untimed warm-up run (JIT compilation, first touch of the weights'
    pages), then `repetitions` timed runs; with a peer runner the timed runs are interleaved per
    repetition (fuel, peer, fuel, peer, ...) so that both see the same machine load.

A sample is the seconds of one run; its rate is tokens / seconds. A test reports the mean and the sample
standard deviation (n - 1) of the rates, and with a peer the ratio fuel mean / peer mean.

Memory roofline (tg tests): a decode step reads every weight it uses once, and the KV cache up to its
position; `bytes_per_token` counts them (an MoE layer's experts at k of n). Read bandwidth is measured
before and after the tests over a working set of that size (backends/cpu/bandwidth.py, in a child
process, the test's threads; on a GPU backends/cuda/bandwidth.py, at most 1 GiB of device memory),
and the higher taken, so bytes per token x tok/s / bandwidth is the fraction of the roofline reached.

First token (`first_token_runs`, `fuel bench --first-token`): what a user waits for from typing
`fuel run` to the first token, in fresh processes: with an empty kernel cache (a fresh install: every
kernel compiles), with a warm one, and llama.cpp's load + first token in its own process, interleaved.

Peers (`--compare`): llama.cpp (GGUF only) and transformers (float32), each in a process of its own
(fuelcli/peers/): its threads never share fuel's process, and its crash is an error line (exit 5).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError
from ..families.schema import EXPERT_ROLES
from ..weights.build import layer_vectors


# ----------------------------------------------------------------------------------------------------
# what to run


@dataclass(frozen=True)
class TestSpec:
    __test__ = False  # not a pytest class
    kind: str  # "pp" | "tg"
    n_tokens: int
    depth: int = 0
    seqs: int = 1  # sequences decoding side by side (tg)

    @property
    def name(self) -> str:
        return (f"{self.kind}{self.n_tokens}" + (f" x{self.seqs}" if self.seqs > 1 else "")
                + (f" @ d{self.depth}" if self.depth else ""))

    @property
    def tokens(self) -> int:
        """Tokens one run processes (over all its sequences)."""
        return self.n_tokens * self.seqs


def parse_int_list(text: str, option: str) -> list[int]:
    """'64,512' -> [64, 512]; every value >= 0; duplicates dropped, order kept."""
    out = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise InputError(f"{option} takes comma-separated integers, got {text!r}") from None
        if v < 0:
            raise InputError(f"{option} values must be >= 0, got {v}")
        if v not in out:
            out.append(v)
    if not out:
        raise InputError(f"{option} needs at least one value, got {text!r}")
    return out


def make_tests(pp: list[int], tg: list[int], depths: list[int], seqs: list[int] = (1,)) -> list[TestSpec]:
    """llama-bench order: for each depth, every pp test then every tg test (at each width of seqs);
    0 means skip."""
    if any(b < 1 for b in seqs):
        raise InputError(f"--parallel values must be at least 1, got {min(seqs)}")
    tests = [t for d in depths for t in [TestSpec("pp", n, d) for n in pp if n > 0]
             + [TestSpec("tg", n, d, b) for n in tg if n > 0 for b in seqs]]
    if not tests:
        raise InputError("nothing to run: every -p and -n value is 0")
    return tests


def context_needed(tests: list[TestSpec]) -> int:
    """KV cache positions a sequence needs: depth + the test's tokens, + 1 spare (the largest over tests)."""
    return max(t.depth + t.n_tokens for t in tests) + 1


def seqs_needed(tests: list[TestSpec]) -> int:
    """Sequences the engine holds at once (its slots)."""
    return max(t.seqs for t in tests)


# ----------------------------------------------------------------------------------------------------
# runners: reset + untimed depth fill (of each sequence), then one timed pp or tg run -> seconds;
# a tg run of B sequences gets ids [N, B]


class FuelRunner:
    name = "fuel"

    def __init__(self, engine):
        self.engine = engine

    def prepare(self, depth_ids: np.ndarray, seqs: int = 1):
        e = self.engine
        e.reset()
        if len(depth_ids) and seqs == 1:
            e.prefill(depth_ids)
        elif len(depth_ids):
            for slot in range(seqs):
                for s in range(0, len(depth_ids), e.n_batch):
                    e.step([(slot, depth_ids[s:s + e.n_batch])])

    def pp(self, ids: np.ndarray) -> float:
        e = self.engine
        t0 = time.perf_counter()
        e.prefill(ids)
        return time.perf_counter() - t0

    def tg(self, ids: np.ndarray) -> float:
        if ids.ndim == 2:
            return self._tg_seqs(ids)
        decode = self.engine.decode
        toks = [int(t) for t in ids]
        t0 = time.perf_counter()
        for t in toks:
            decode(t)
        return time.perf_counter() - t0

    def _tg_seqs(self, ids: np.ndarray) -> float:
        step = self.engine.step
        batches = [[(b, [int(t)]) for b, t in enumerate(row)] for row in ids]
        t0 = time.perf_counter()
        for batch in batches:
            step(batch)
        return time.perf_counter() - t0


class PeerRunner:
    """A peer (fuelcli/peers/) in a process of its own: prepare, pp and tg run there and time only
    their own calls, so neither the messages nor fuel's thread pool are in its seconds."""

    def __init__(self, kind, threads: int, **kwargs):
        from ..peers.child import PeerProcess

        self.process = PeerProcess(kind, threads, **kwargs)
        info = self.process.info
        self.name, self.detail, self.threads = kind.name, info["detail"], info["threads"]

    def prepare(self, depth_ids: np.ndarray, seqs: int = 1):
        self.process.call("prepare", depth_ids, seqs)

    def pp(self, ids: np.ndarray) -> float:
        return self.process.call("pp", ids)

    def tg(self, ids: np.ndarray) -> float:
        return self.process.call("tg", ids)

    def peak_rss_bytes(self) -> int:
        return self.process.peak_rss_bytes()

    def close(self):
        self.process.close()


def start_peer(kind, source, threads: int, n_ctx: int, tests: list[TestSpec]) -> PeerRunner:
    """The peer's runner on the model: llama.cpp with a batch that holds the largest pp test (and,
    for tests of several sequences, a context that holds them)."""
    if kind.name == "llama.cpp":
        n_batch = max([512] + [t.n_tokens for t in tests if t.kind == "pp"])
        return PeerRunner(kind, threads, path=str(source.path), name=source.name, n_ctx=n_ctx, n_batch=n_batch,
                          seqs=seqs_needed(tests))
    return PeerRunner(kind, threads, path=str(source.path), source_kind=source.kind, name=source.name)


def check_peer(peer: str, source_kind: str):
    """--compare's peer, installed and able to read the model, before anything heavy loads."""
    from ..peers import require

    kind = require(peer, "--compare")
    if peer == "llama.cpp" and source_kind != "gguf":
        raise InputError("--compare llama.cpp needs a GGUF model (llama.cpp reads only GGUF); "
                         "use --compare transformers for a model directory")
    return kind


# ----------------------------------------------------------------------------------------------------
# results


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

    @property
    def ratio(self) -> float | None:
        return None if self.peer is None else self.fuel.mean / self.peer.mean

    def read_rate(self) -> float:
        """Bytes/s that fuel's mean decode rate reads."""
        return self.bytes_per_token * self.fuel.mean

    def to_dict(self, peer_name: str | None, bandwidth: float = 0.0) -> dict:
        d = {"test": self.spec.name, "kind": self.spec.kind, "n_tokens": self.spec.n_tokens,
             "depth": self.spec.depth, "seqs": self.spec.seqs, "fuel": self.fuel.to_dict()}
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
    tests = []
    for t in d["tests"]:
        spec = TestSpec(t["kind"], t["n_tokens"], t["depth"], t.get("seqs", 1))
        peer = Series(spec.tokens, list(t["peer"]["samples_s"])) if "peer" in t else None
        tests.append(TestResult(spec, Series(spec.tokens, list(t["fuel"]["samples_s"])), peer,
                                t.get("bytes_per_token", 0)))
    return Report(ModelInfo(**d["model"]), d["threads"], d["repetitions"], d["seed"], d["n_ctx"], tests,
                  d["peak_rss_bytes"], d["kv_bytes"], d["peer"], d["backend"],
                  d.get("bandwidth"), d.get("load"))


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_text(load: dict) -> str:
    """How busy the machine was around the run: fuel's threads compete with whatever else is runnable
    (the figures of a busy machine are not a quiet one's). The load average counts the run's own
    threads too (fuel's and its peer's, taking turns): busy is other work of half the CPUs or more."""
    busy = max(load["before"], load["after"]) - load["threads"] >= load["cpus"] / 2
    return (f"load average {load['before']:.2f} before, {load['after']:.2f} after, on {load['cpus']} CPUs"
            + (" (a busy machine: other work shared the CPUs)" if busy else ""))


def model_info(source, cfg, weights) -> ModelInfo:
    mats = weights.tensors()
    vecs = [weights.final_norm]
    for layer in weights.layers:
        vecs += layer_vectors(layer)
    size = sum(t.nbytes for t in mats) + sum(int(v.nbytes) for v in vecs)
    params = sum(t.numel for t in mats) + sum(int(v.size) for v in vecs)
    formats = dict(sorted(Counter(t.fmt for t in mats).items(), key=lambda kv: (-kv[1], kv[0])))
    return ModelInfo(source.name, str(source.path), source.kind, cfg.family, size, params, formats)


# ----------------------------------------------------------------------------------------------------
# memory roofline


def bytes_per_token(cfg, weights, ctx: float, kv_value_bytes: int = 4, seqs: int = 1) -> int:
    """Bytes one decode step reads, per token it makes: every matrix it multiplies by (the embedding
    contributes one row unless it is also the output; MoE experts at k of n), norms and biases, read
    once for the step's `seqs` tokens, and each sequence's K and V of ctx cached positions
    (kv_value_bytes each: 4 for f32, 2 for f16)."""
    embed_row = 0 if weights.output is weights.embed else weights.embed.nbytes // weights.embed.shape[0]
    total = embed_row + int(weights.final_norm.nbytes)
    total += sum(t.nbytes for t in weights.tensors() if t is not weights.embed or t is weights.output)
    for layer in weights.layers:
        experts = [t for role in EXPERT_ROLES for t in getattr(layer, role)]
        if experts:  # only k of n experts are read
            total -= sum(t.nbytes for t in experts) * (1 - cfg.experts_per_tok / cfg.num_experts)
        total += sum(int(v.nbytes) for v in layer_vectors(layer))
    return int(total / seqs + 2 * cfg.num_layers * ctx * cfg.kv_dim * kv_value_bytes)


def measure_bandwidth(nbytes: int, threads: int) -> float:
    """Read bandwidth (bytes/s) over a working set of nbytes with `threads` threads, in a child
    process (its buffer stays out of this process's peak memory)."""
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-m", "fuelcli.backends.cpu.bandwidth", str(int(nbytes)), str(threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"bandwidth measurement failed: {r.stderr.strip()[-500:]}")
    return float(r.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------
# the loop


def run_bench(fuel, tests: list[TestSpec], repetitions: int, vocab_size: int, seed: int = 0,
              peer_factory: Callable[[], object] | None = None,
              on_step: Callable[[str], None] | None = None):
    """Warm up fuel on every test, then (if any) build the peer and warm it up, then the timed runs,
    interleaved per repetition. Returns (list of TestResult, peer runner or None).

    on_step(description) is called after every run (warm-ups included): the progress bar's tick.
    """
    if repetitions < 1:
        raise InputError(f"-r must be at least 1, got {repetitions}")
    rng = np.random.default_rng(seed)
    tick = on_step or (lambda desc: None)

    def draw(n):
        return rng.integers(0, vocab_size, size=n, dtype=np.int64)

    def once(runner, spec: TestSpec, depth_ids, ids) -> float:
        if spec.seqs > 1:
            runner.prepare(depth_ids, spec.seqs)
            return runner.tg(ids.reshape(spec.n_tokens, spec.seqs))
        runner.prepare(depth_ids)
        return runner.pp(ids) if spec.kind == "pp" else runner.tg(ids)

    # the same ids for every runner in one repetition; fresh ids per repetition
    warm_ids = [(draw(t.depth), draw(t.tokens)) for t in tests]
    for spec, (d, x) in zip(tests, warm_ids):
        once(fuel, spec, d, x)
        tick(f"fuel warm-up {spec.name}")
    peer = None
    if peer_factory is not None:
        peer = peer_factory()
        tick(f"{peer.name} loaded")
        for spec, (d, x) in zip(tests, warm_ids):
            once(peer, spec, d, x)
            tick(f"{peer.name} warm-up {spec.name}")
    results = []
    for spec in tests:
        res = TestResult(spec, Series(spec.tokens), None if peer is None else Series(spec.tokens))
        for rep in range(repetitions):
            d, x = draw(spec.depth), draw(spec.tokens)
            res.fuel.seconds.append(once(fuel, spec, d, x))
            tick(f"fuel {spec.name} {rep + 1}/{repetitions}")
            if peer is not None:
                res.peer.seconds.append(once(peer, spec, d, x))
                tick(f"{peer.name} {spec.name} {rep + 1}/{repetitions}")
        results.append(res)
    return results, peer


def steps_total(n_tests: int, repetitions: int, with_peer: bool) -> int:
    per_runner = n_tests * (1 + repetitions)
    return per_runner * (2 if with_peer else 1) + (1 if with_peer else 0)


# ----------------------------------------------------------------------------------------------------
# rendering


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def formats_text(formats: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in formats.items())


def _ts(s: Series) -> str:
    return f"{s.mean:.2f} ± {s.std:.2f}"


def render_md(rep: Report) -> str:
    m, peer = rep.model, rep.peer_name
    cols = ["model", "size", "params", "backend", "threads", "test", "t/s"]
    align = ["---", "---:", "---:", "---", "---:", "---:", "---:"]
    per_seq = any(t.spec.seqs > 1 for t in rep.tests)
    if per_seq:
        cols.append("t/s/seq")
        align.append("---:")
    if peer:
        cols += [f"{peer} t/s", f"fuel/{peer}"]
        align += ["---:", "---:"]
    roof = rep.bandwidth_bps > 0
    if roof:
        cols += ["read GB/s", "roofline"]
        align += ["---:", "---:"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join(align) + " |"]
    for t in rep.tests:
        row = [m.name, human_bytes(m.size_bytes), human_count(m.params), rep.backend, str(rep.threads),
               t.spec.name, _ts(t.fuel)]
        if per_seq:
            row.append(f"{t.fuel.mean / t.spec.seqs:.2f}")
        if peer:
            row += [_ts(t.peer), f"{t.ratio:.2f}"]
        if roof:
            row += [f"{t.read_rate() / 1e9:.2f}", f"{t.read_rate() / rep.bandwidth_bps:.0%}"] if t.bytes_per_token \
                else ["", ""]
        lines.append("| " + " | ".join(row) + " |")
    notes = [f"formats: {formats_text(m.formats)}", f"r={rep.repetitions}, seed {rep.seed}, n_ctx {rep.n_ctx}",
             f"KV cache {human_bytes(rep.kv_bytes)}", f"peak RSS {human_bytes(rep.peak_rss_bytes)}"]
    if peer:
        notes.append(f"peer: {rep.peer['detail']}, threads {rep.peer['threads']}, in its own process"
                     + (f" (peak RSS {human_bytes(rep.peer['peak_rss_bytes'])})" if rep.peer.get("peak_rss_bytes")
                        else ""))
    if rep.load:
        notes.append(load_text(rep.load))
    if roof:
        b = rep.bandwidth
        both = b.get("measured")
        notes.append(f"roofline: read bandwidth {b['bytes_per_s'] / 1e9:.2f} GB/s over {human_bytes(b['bytes'])} "
                     + (f"with {b['threads']} threads" if b['threads'] else "on the GPU")
                     + (" (the higher of {:.2f} / {:.2f} before / after the tests{})".format(
                         *(v / 1e9 for v in both), "; it moved during the run" if max(both) > 1.2 * min(both) else "")
                        if both else "")
                     + " (a tg test reads its bytes per token x t/s)")
    return "\n".join(lines) + "\n\n" + "; ".join(notes) + "\n"


CSV_FIELDS = ["model", "model_kind", "family", "size_bytes", "params", "formats", "backend", "threads",
              "repetitions", "peak_rss_bytes", "test", "kind", "n_tokens", "depth", "avg_ts", "stddev_ts",
              "samples_ts", "seqs", "peer", "peer_avg_ts", "peer_stddev_ts", "peer_samples_ts", "ratio", "bytes_per_token",
              "roofline_fraction"]


def render_csv(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    m = rep.model
    for t in rep.tests:
        row = dict(model=m.name, model_kind=m.kind, family=m.family, size_bytes=m.size_bytes, params=m.params,
                   formats=formats_text(m.formats), backend=rep.backend, threads=rep.threads,
                   repetitions=rep.repetitions, peak_rss_bytes=rep.peak_rss_bytes, test=t.spec.name,
                   kind=t.spec.kind, n_tokens=t.spec.n_tokens, depth=t.spec.depth, seqs=t.spec.seqs,
                   avg_ts=repr(t.fuel.mean),
                   stddev_ts=repr(t.fuel.std), samples_ts=";".join(repr(r) for r in t.fuel.rates))
        if t.peer is not None:
            row.update(peer=rep.peer_name, peer_avg_ts=repr(t.peer.mean), peer_stddev_ts=repr(t.peer.std),
                       peer_samples_ts=";".join(repr(r) for r in t.peer.rates), ratio=repr(t.ratio))
        if t.bytes_per_token:
            row.update(bytes_per_token=t.bytes_per_token,
                       roofline_fraction=repr(t.read_rate() / rep.bandwidth_bps) if rep.bandwidth_bps else "")
        w.writerow(row)
    return buf.getvalue()


def render_json(rep: Report) -> str:
    def clean(x):  # NaN/inf are not JSON
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(rep.to_dict()), indent=2) + "\n"


RENDERERS = {"md": render_md, "json": render_json, "csv": render_csv}


# ----------------------------------------------------------------------------------------------------
# first token: fresh processes, the user's wait


def time_to_first_output(cmd: list, env: dict, peer=None) -> float:
    """Seconds from starting `cmd` to its first byte on stdout (or its exit). A failing fuel is a bug
    (RuntimeError); a failing peer (its PeerKind) is PeerFailed, one line naming it and the signal."""
    import subprocess

    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = p.stdout.read(1)
    dt = time.perf_counter() - t0
    rest, err = p.communicate()
    if p.returncode != 0 or not (first + rest):
        if peer is not None:
            from ..errors import PeerFailed
            from ..peers.child import describe_exit

            raise PeerFailed(f"the {peer.name} peer ({peer.package}) {describe_exit(p.returncode)} before its "
                             f"first token; {peer.crash}")
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))}... failed ({p.returncode}): {err.decode()[-500:]}")
    return dt


def first_token_runs(model: str, source, prompt: str, repetitions: int, threads: int, llama,
                     tick: Callable[[str], None]) -> dict:
    """`fuel run MODEL PROMPT -n 1` in fresh processes: `cold` with an empty kernel cache (a fresh
    install compiles every kernel), `warm` with the cache the warm-up filled; with llama (its PeerKind) also
    llama.cpp's load + first token (llama-cpp-python, same prompt through the chat template, same
    threads). Interleaved per repetition; one untimed warm-up each (files in the page cache)."""
    import shutil
    import sys
    import tempfile

    # Both sides run with this process's OpenMP settings (process/threads.py: the default wait unless the
    # user chose one), as the pp/tg tests do. Both import
    # their Python modules from .pyc files, as after a pip install: PYTHONDONTWRITEBYTECODE in this
    # environment would have every start compile fuel's sources anew (~0.1 s here), so the children
    # write and read theirs under a prefix of their own, filled by the warm-ups.
    warm_dir = tempfile.mkdtemp(prefix="fuel-first-token-")
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base.update(FUEL_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads),
                PYTHONPYCACHEPREFIX=os.path.join(warm_dir, "pycache"))
    fuel = [sys.executable, "-m", "fuelcli", "run", model, prompt, "-n", "1", "--temp", "0", "--quiet"]
    series = {"fuel_cold": [], "fuel_warm": []}
    if llama:
        series["llama.cpp"] = []
        from ..peers.llama_cpp import FIRST_TOKEN

        peer = [sys.executable, "-c", FIRST_TOKEN, str(source.path), str(threads), prompt]
    try:
        time_to_first_output(fuel, dict(base, NUMBA_CACHE_DIR=warm_dir))
        tick("fuel warm-up (fills the kernel cache)")
        if llama:
            time_to_first_output(peer, base, llama)
            tick("llama.cpp warm-up")
        for rep in range(repetitions):
            cold_dir = tempfile.mkdtemp(prefix="fuel-first-token-cold-")
            try:
                series["fuel_cold"].append(time_to_first_output(fuel, dict(base, NUMBA_CACHE_DIR=cold_dir)))
            finally:
                shutil.rmtree(cold_dir, ignore_errors=True)
            tick(f"fuel, empty cache {rep + 1}/{repetitions}")
            series["fuel_warm"].append(time_to_first_output(fuel, dict(base, NUMBA_CACHE_DIR=warm_dir)))
            tick(f"fuel, warm cache {rep + 1}/{repetitions}")
            if llama:
                series["llama.cpp"].append(time_to_first_output(peer, base, llama))
                tick(f"llama.cpp {rep + 1}/{repetitions}")
    finally:
        shutil.rmtree(warm_dir, ignore_errors=True)
    out = {"model": source.name, "path": str(source.path), "prompt": prompt, "threads": threads,
           "repetitions": repetitions, "seconds": series}
    if llama:
        from importlib.metadata import version

        out["peer"] = f"llama-cpp-python {version('llama-cpp-python')}"
    return out


def render_first_token_md(rep: dict) -> str:
    s = rep["seconds"]
    peer = "llama.cpp" in s
    cols = ["model", "threads", "fuel run, first token", "s"] + (["llama.cpp load + first token s", "fuel/llama.cpp"]
                                                               if peer else [])
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join(["---", "---:", "---", "---:"] +
                                                               (["---:", "---:"] if peer else [])) + " |"]

    def ms(v):
        return f"{statistics.fmean(v):.2f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.2f}"

    for key, label in (("fuel_cold", "empty kernel cache (fresh install)"), ("fuel_warm", "warm kernel cache")):
        row = [rep["model"], str(rep["threads"]), label, ms(s[key])]
        if peer:
            row += [ms(s["llama.cpp"]), f"{statistics.fmean(s[key]) / statistics.fmean(s['llama.cpp']):.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    note = f"seconds from starting the process to its first token; r={rep['repetitions']}, interleaved"
    if peer:
        note += f"; peer: {rep['peer']}"
    return "\n".join(lines) + "\n\n" + note + "\n"


def render_json_obj(obj: dict) -> str:
    return json.dumps(obj, indent=2) + "\n"
