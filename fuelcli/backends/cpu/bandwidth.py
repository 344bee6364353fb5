"""Read bandwidth of this machine over a working set, for `fuel bench`'s memory roofline.

A decode step reads every weight once (and the KV cache): tokens/s can be at most bandwidth /
bytes per token. `measure(nbytes, threads)` reads a buffer of nbytes with `threads` threads (a
vector-XOR kernel in IR, one slice per thread, several timed calls, best kept) and returns bytes/s.
A call reads its slice as many times as it takes to read MIN_CALL_BYTES in all: the start of a
parallel loop (and, on a busy machine, waiting for a descheduled thread) would otherwise be most of
the time of a small model's working set (a CI run measured 62 MB/s over 400 KB).
The working set is the model's, so a model that fits the last-level cache is measured against that
cache, one that does not against DRAM. Run it in its own process (`python -m
fuelcli.backends.cpu.bandwidth NBYTES THREADS`): the buffer would otherwise count in the caller's
peak memory.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from llvmlite import ir
from numba import njit

from .irgen import I64, Loop, Var, c64, func, ptr_to, splat_c, vec
from .llvm import args11, compile_module, host_isa
from .matmul import tasks

CHUNK = 256  # bytes per loop step: 4 vectors of 64
MIN_CALL_BYTES = 64 << 20  # bytes one timed call reads at least (a few ms at cache speed)


def _module(isa):
    """stream(task, base, bytes_per_task, out, passes): XOR of the task's slice, read `passes`
    times, into out[task] (so the loads cannot be dropped)."""
    mod = ir.Module(name=f"fuel_stream_{isa.name}")
    fn, bd = func(mod, "fuel_stream", 12)
    task, base, per, out_, passes = fn.args[:5]
    v = vec(I64, 8)
    p = ptr_to(bd, bd.add(base, bd.mul(task, per)), v)
    accs = [Var(bd, splat_c(I64, 0, 8)) for _ in range(4)]
    with Loop(bd, 0, passes):
        with Loop(bd, 0, bd.udiv(per, c64(CHUNK))) as i:
            for j in range(4):
                x = bd.load(bd.gep(p, [bd.add(bd.mul(i, c64(4)), c64(j))]), align=8)
                accs[j].set(bd.xor(accs[j].get(), x))
    acc = bd.xor(bd.xor(accs[0].get(), accs[1].get()), bd.xor(accs[2].get(), accs[3].get()))
    bd.store(acc, bd.gep(ptr_to(bd, out_, v), [task]), align=8)
    bd.ret_void()
    return mod


@njit(cache=True)
def _run(fn, n, base, per, out, passes):
    tasks(fn, n, args11(base, per, out, passes))


def measure(nbytes: int, threads: int, seconds: float = 0.5) -> float:
    """Best read bandwidth (bytes/s) of `threads` threads over a buffer of about nbytes."""
    import numba

    isa = host_isa()
    fn = compile_module("stream", lambda: (_module(isa), ["fuel_stream"]), isa)["fuel_stream"]
    numba.set_num_threads(threads)
    per = max(CHUNK, nbytes // threads // CHUNK * CHUNK)
    buf = np.ones(per * threads // 8, np.int64)  # written once: pages present before timing
    out = np.zeros((threads, 8), np.int64)
    passes = max(1, MIN_CALL_BYTES // buf.nbytes)
    _run(fn, threads, buf.ctypes.data, per, out.ctypes.data, 1)
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        _run(fn, threads, buf.ctypes.data, per, out.ctypes.data, passes)
        best = max(best, passes * buf.nbytes / (time.perf_counter() - t0))
    return best


if __name__ == "__main__":
    print(measure(int(sys.argv[1]), int(sys.argv[2])))
