"""Read bandwidth of the GPU, for `fuel bench --device cuda`'s memory roofline (the CPU's is
backends/cpu/bandwidth.py).

A decode step reads every weight once: tokens/s can be at most bandwidth / bytes per token.
`measure(nbytes)` reads a device buffer of about nbytes (capped at MAX_BYTES: far past any L2, so a
large model is measured against the GPU's memory and one that fits the L2 against the L2, as the
CPU's probe does with its caches) in 16-byte read-only loads, grid-stride, XOR-ed into one word per
thread so that no load can be dropped; each timed launch reads the buffer as many times as it takes
to read MIN_CALL_BYTES (a launch's start would otherwise be much of the time), best of several.
"""

from __future__ import annotations

import time

import numpy as np
from numba import cuda

from .kernels.probe import read_xor
from .runtime import simulator

MAX_BYTES = 1 << 30
MIN_CALL_BYTES = 4 << 30
THREADS = 256  # threads per block
BLOCKS_PER_SM = 8


def measure(nbytes: int, seconds: float = 0.3, blocks: int | None = None, threads: int = THREADS,
            min_call_bytes: int = MIN_CALL_BYTES) -> float:
    """Best read bandwidth (bytes/s) of the current GPU over a buffer of about nbytes (at least
    one 16-byte word per thread of the grid, at most MAX_BYTES)."""
    if blocks is None:
        blocks = cuda.get_current_device().MULTIPROCESSOR_COUNT * BLOCKS_PER_SM
    n4 = max(blocks * threads, min(int(nbytes), MAX_BYTES) // 16)
    buf = cuda.to_device(np.ones(4 * n4, np.uint32))
    out = cuda.device_array(blocks * threads, np.uint32)
    passes = max(1, min_call_bytes // (16 * n4))
    read_xor[blocks, threads](buf, n4, 1, out)  # compile, and the buffer's first touch
    cuda.synchronize()
    best, t_end = 0.0, time.perf_counter() + seconds
    while True:
        start, end = cuda.event(), cuda.event()
        t0 = time.perf_counter()
        start.record()
        read_xor[blocks, threads](buf, n4, passes, out)
        end.record()
        end.synchronize()
        took = time.perf_counter() - t0 if simulator() else cuda.event_elapsed_time(start, end) / 1e3
        best = max(best, passes * 16 * n4 / took)
        if time.perf_counter() >= t_end:
            return best
