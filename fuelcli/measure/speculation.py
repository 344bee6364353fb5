"""`fuel bench MODEL --lookup-decoding | --draft-model D`: speculative decoding's speed-up, measured.

Greedy decoding of -n tokens after a real prompt (the chat template applied, as `fuel run` does),
plain and speculative, alternating run by run in one process; with --compare llama.cpp also
llama.cpp's plain and prompt-lookup decoding (llama-cpp-python's `LlamaPromptLookupDecoding`, in a
process of its own). A rate is (tokens - 1) / the seconds from the first token to the last: the
decode steps alone, the prompt's prefill left out, on both sides alike. The speculative text must be
the plain one token for token (greedy); a run where it is not is reported, not hidden.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

LOOKUP_PRED_TOKENS = 10  # llama-cpp-python's LlamaPromptLookupDecoding default (num_pred_tokens)


def _fuel_greedy(engine, ids: list[int], n: int, eos_ids: set, spec) -> dict:
    from ..text.generate import Sampler, SamplerParams, Stats, sample_steps

    engine.rewind(0)
    sampler, stats = Sampler(SamplerParams(temp=0.0)), Stats()
    steps = spec.steps(engine, ids, n, sampler, eos_ids, stats) if spec else sample_steps(
        engine, ids, n, sampler, eos_ids, stats)
    t_first = None
    for _ in steps:
        t_first = t_first or time.perf_counter()
    seconds = time.perf_counter() - t_first if t_first else 0.0
    return {"tokens": list(stats.tokens), "seconds": seconds, "drafted": stats.drafted, "accepted": stats.accepted}


def runs(engine, ids: list[int], n: int, eos_ids: set, make_spec: Callable, method: str, repetitions: int,
         peer=None, tick: Callable[[str], None] = lambda d: None) -> dict:
    """Plain and speculative greedy decoding of n tokens after ids, interleaved, one untimed warm-up
    each; `make_spec()` a fresh Speculation per run (its draft length learns within a generation,
    as in `fuel run`); peer: a bench PeerRunner on llama.cpp, run plain and with prompt lookup."""
    sides = {"fuel": lambda: _fuel_greedy(engine, ids, n, eos_ids, None),
             f"fuel {method}": lambda: _fuel_greedy(engine, ids, n, eos_ids, make_spec())}
    if peer is not None:
        def llama(lookup):
            tokens, seconds = peer.process.call("greedy", np.asarray(ids, np.int64), n, lookup)
            return {"tokens": tokens, "seconds": seconds}

        sides["llama.cpp"] = lambda: llama(0)
        sides["llama.cpp lookup"] = lambda: llama(LOOKUP_PRED_TOKENS)
    out = {name: {"rates": [], "seconds": [], "drafted": 0, "accepted": 0} for name in sides}
    for rep in range(repetitions + 1):
        for name, run in sides.items():
            r = run()
            tick(f"{name} {'warm-up' if rep == 0 else f'{rep}/{repetitions}'}")
            s = out[name]
            s["tokens"] = r["tokens"]
            if rep == 0:
                continue
            s["seconds"].append(r["seconds"])
            s["rates"].append((len(r["tokens"]) - 1) / r["seconds"] if r["seconds"] > 0 else 0.0)
            s["drafted"] += r.get("drafted", 0)
            s["accepted"] += r.get("accepted", 0)
    for name, s in out.items():
        base = out["llama.cpp" if name.startswith("llama.cpp") else "fuel"]
        s["same_text"] = s["tokens"] == base["tokens"]
    for name, s in out.items():
        base = out["llama.cpp" if name.startswith("llama.cpp") else "fuel"]
        s["generated"] = len(s.pop("tokens"))
        s["mean"] = float(np.mean(s["rates"]))
        s["std"] = float(np.std(s["rates"], ddof=1)) if len(s["rates"]) > 1 else 0.0
        s["speedup"] = s["mean"] / float(np.mean(base["rates"])) if base["rates"] and np.mean(base["rates"]) else None
    return out


def render_md(rep: dict) -> str:
    lines = [f"model: {rep['model']} | prompt: {rep['prompt_tokens']} tokens ({rep['prompt']}) | "
             f"-n {rep['n']} greedy | threads: {rep['threads']} | r={rep['repetitions']}"]
    if rep.get("draft"):
        lines[0] += f" | draft: {rep['draft']}"
    if rep.get("peer"):
        lines.append(f"peer: {rep['peer']} (lookup: LlamaPromptLookupDecoding, num_pred_tokens "
                     f"{LOOKUP_PRED_TOKENS})")
    lines += ["", "| decoding | t/s | speed-up | accepted / drafted | same text as plain |",
              "| --- | ---: | ---: | ---: | --- |"]
    for name, s in rep["sides"].items():
        acc = f"{s['accepted']} / {s['drafted']} ({s['accepted'] / s['drafted']:.0%})" if s["drafted"] else ""
        sp = f"{s['speedup']:.2f}" if s["speedup"] is not None else ""
        lines.append(f"| {name} | {s['mean']:.2f} ± {s['std']:.2f} | {sp} | {acc} | "
                     f"{'yes' if s['same_text'] else 'NO'} |")
    return "\n".join(lines) + "\n"
