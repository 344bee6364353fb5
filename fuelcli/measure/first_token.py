"""First token (`fuel bench --first-token`): what a user waits for from typing `fuel run` to the first
token, in fresh processes: with an empty kernel cache (a fresh install: every kernel compiles), with
a warm one, and llama.cpp's load + first token in its own process, interleaved."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable


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
