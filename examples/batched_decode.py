"""Time one engine step of B decoding sequences (one new token each) against a one-sequence decode step.

    python examples/batched_decode.py MODEL [--widths 1,2,4,8] [--steps 8] [--repeats 5] [--threads N] [--cpu-time]

MODEL is anything `fuel run` takes (a GGUF path, a demo name). Each sequence holds a 32-token prompt
and is rewound to it before every timed run, so every step attends over the same context. Prints
per width the median step time (ms), the aggregate speed-up (B tokens per step against one token
per one-sequence decode step) and, with --json, one JSON object. --cpu-time times the process's CPU
time instead of the wall clock: with --threads 1 on a machine that other jobs share, it counts
only this process's work. Run it twice in one session with
PYTHONPATH pointing at two checkouts to compare them; the figures are only comparable in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

PROMPT = 32


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--widths", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=5, help="runs per width, the widths interleaved")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cpu-time", action="store_true", help="CPU time, not wall time (use with --threads 1)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from fuelcli.process import threads

    threads.set_threads(a.threads)
    import numpy as np

    from fuelcli.backends import make_engine
    from fuelcli.cli.doctor_report import cpu_name
    from fuelcli.assembly.loader import open_model

    clock = time.process_time if a.cpu_time else time.perf_counter
    widths = [int(w) for w in a.widths.split(",")]
    m = open_model(a.model)
    n_ctx = PROMPT + a.steps + 1
    one = make_engine(m.cfg, m.weights, n_ctx=n_ctx)
    many = make_engine(m.cfg, m.weights, n_ctx=n_ctx, slots=max(widths))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, m.cfg.vocab_size, PROMPT).tolist() for _ in range(max(widths))]
    one.prefill(prompts[0])
    for j, prompt in enumerate(prompts):
        many.step([(j, prompt)])

    def plain():
        one.rewind(PROMPT)
        t = clock()
        for i in range(a.steps):
            one.decode(100 + i)
        return (clock() - t) / a.steps

    def batched(B):
        for j in range(B):
            many.rewind(PROMPT, slot=j)
        t = clock()
        for i in range(a.steps):
            many.step([(j, [100 + i + j]) for j in range(B)])
        return (clock() - t) / a.steps

    plain()
    for B in widths:  # warm: compiles, pages in the weights
        batched(B)
    times = {"plain": []} | {B: [] for B in widths}
    for _ in range(a.repeats):
        times["plain"].append(plain())
        for B in widths:
            times[B].append(batched(B))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": os.path.basename(a.model), "cpu": cpu_name(), "clock": "cpu" if a.cpu_time else "wall",
              "plain_ms": 1e3 * med["plain"],
              "steps": {B: {"ms": 1e3 * med[B], "speedup": B * med["plain"] / med[B]} for B in widths}}
    if a.json:
        print(json.dumps(result))
        return
    print(f"{result['model']} on {result['cpu']}: one-sequence decode step {result['plain_ms']:.1f} ms")
    for B, r in result["steps"].items():
        print(f"  B={B}: step {r['ms']:.1f} ms, aggregate {r['speedup']:.2f}x")


if __name__ == "__main__":
    main()
