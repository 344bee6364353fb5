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

The memory roofline is roofline.py's; the first token first_token.py's; the peers (`--compare`)
bench_peers.py's; what to run bench_spec.py's; results and their rendering bench_results.py's and
bench_render.py's. Their names are this module's too: `fuel bench` reads them here.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

from ..errors import InputError
from .bench_peers import PeerRunner, check_peer, start_peer  # noqa: F401
from .bench_render import (CSV_FIELDS, RENDERERS, formats_text, human_bytes, human_count,  # noqa: F401
                           load_text, render_csv, render_json, render_json_obj, render_md)
from .bench_results import ModelInfo, Report, Series, TestResult, model_info, report_from_dict  # noqa: F401
from .bench_spec import TestSpec, context_needed, make_tests, parse_int_list, seqs_needed  # noqa: F401
from .first_token import first_token_runs, render_first_token_md, time_to_first_output  # noqa: F401
from .roofline import bytes_per_token, measure_bandwidth  # noqa: F401


# ----------------------------------------------------------------------------------------------------
# runners: reset + untimed depth fill (of each sequence), then one timed pp or tg run -> seconds;
# a tg run of B sequences gets ids [N, B]


class FuelRunner:
    def __init__(self, engine, name: str = "fuel"):
        self.engine, self.name = engine, name

    @property
    def backend(self) -> str:
        return self.engine.backend

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


# ----------------------------------------------------------------------------------------------------
# the loop


def run_bench(fuel, tests: list[TestSpec], repetitions: int, vocab_size: int, seed: int = 0,
              peer_factory: Callable[[], object] | None = None,
              on_step: Callable[[str], None] | None = None):
    """Warm up fuel on every test, then (if any) build the peer and warm it up, then the timed runs,
    interleaved per repetition. Returns (list of TestResult, peer runner or None).

    fuel: a runner, or a list of them (one engine per `--activations` kind: bench's comma list), each
    a row of every test, the first the others' baseline (TestResult.baseline); a repetition runs them
    in turn on the same ids, then the peer, so that every row sees the same machine load.

    on_step(description) is called after every run (warm-ups included): the progress bar's tick.
    """
    if repetitions < 1:
        raise InputError(f"-r must be at least 1, got {repetitions}")
    fuels = list(fuel) if isinstance(fuel, (list, tuple)) else [fuel]
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
    for runner in fuels:
        for spec, (d, x) in zip(tests, warm_ids):
            once(runner, spec, d, x)
            tick(f"{runner.name} warm-up {spec.name}")
    peer = None
    if peer_factory is not None:
        peer = peer_factory()
        tick(f"{peer.name} loaded")
        for spec, (d, x) in zip(tests, warm_ids):
            once(peer, spec, d, x)
            tick(f"{peer.name} warm-up {spec.name}")
    results = []
    for spec in tests:
        peer_runs = None if peer is None else Series(spec.tokens)
        rows = [TestResult(spec, Series(spec.tokens), peer_runs) for _ in fuels]
        if len(fuels) > 1:
            for runner, row in zip(fuels, rows):
                row.backend, row.baseline = runner.backend, rows[0].fuel
        for rep in range(repetitions):
            d, x = draw(spec.depth), draw(spec.tokens)
            for runner, row in zip(fuels, rows):
                row.fuel.seconds.append(once(runner, spec, d, x))
                tick(f"{runner.name} {spec.name} {rep + 1}/{repetitions}")
            if peer is not None:
                peer_runs.seconds.append(once(peer, spec, d, x))
                tick(f"{peer.name} {spec.name} {rep + 1}/{repetitions}")
        results += rows
    return results, peer


def steps_total(n_tests: int, repetitions: int, with_peer: bool, fuels: int = 1) -> int:
    per_runner = n_tests * (1 + repetitions)
    return per_runner * (fuels + with_peer) + (1 if with_peer else 0)


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
