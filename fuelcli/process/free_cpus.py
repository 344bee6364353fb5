"""A thread count that follows the CPUs other processes leave free (for the default thread count only).

A forward's parallel regions wait for all of their threads at every barrier. When another process
keeps one of the cores busy, the thread that shares its core runs a fraction of the time and every
region waits for it: on a 2-core machine with one busy process, decode at the default 2 threads fell
to a twentieth of its speed, while 1 thread kept half of it. Before each forward `FreeCpus.threads()`
returns the pool's size less the cores other processes kept busy over the last WINDOW seconds (the
busy time of every CPU in /proc/stat less this process's own CPU time, rounded), at least 1; it
reads /proc/stat at most once a WINDOW (a file read of microseconds). The first forward, a prompt's
prefill, is the one that most needs the right count: its decision looks back at least FIRST seconds,
waiting out what is left of them after the engine was built (a prefill of 512 tokens on 2 threads
beside a busy process ran at 9 tok/s, on 1 thread at 547). Where /proc/stat does not
count exactly the CPUs this process may run on (a container on a larger host, a CPU mask) it stays
off and returns the pool's size. An explicit -t/--threads or FUEL_THREADS is never changed.
"""

from __future__ import annotations

import os
import time

WINDOW = 0.3  # seconds of history a decision looks at
FIRST = 0.1  # seconds the first decision looks back at least: /proc/stat counts in 10 ms ticks a CPU


def read_proc_stat() -> tuple[int, float] | None:
    """(CPUs counted, seconds of their busy time: all but idle and iowait; steal counts as busy),
    or None without a readable /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    lines = text.splitlines()
    if not lines or not lines[0].startswith("cpu "):
        return None
    ticks = [int(v) for v in lines[0].split()[1:9]]
    if len(ticks) < 5:
        return None
    cpus = sum(1 for ln in lines[1:] if ln.startswith("cpu") and ln[3:4].isdigit())
    return cpus, (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


class FreeCpus:
    """threads(): the pool's size less the cores others kept busy over the last window."""

    def __init__(self, pool: int, stat=read_proc_stat, own=time.process_time, clock=time.monotonic,
                 sleep=time.sleep):
        self.pool, self._stat, self._own, self._clock, self._sleep = pool, stat, own, clock, sleep
        self._first = True
        first = stat()
        self.on = first is not None and first[0] == _usable_cpus() == (os.cpu_count() or 0) and pool > 1
        self.n = pool
        self._last = (clock(), first[1], own()) if self.on else None

    def threads(self) -> int:
        if not self.on:
            return self.pool
        now = self._clock()
        t0, busy0, own0 = self._last
        if self._first:
            self._first = False
            if now - t0 < FIRST:
                self._sleep(FIRST - (now - t0))
                now = self._clock()
        elif now - t0 < WINDOW:
            return self.n
        if now <= t0:
            return self.n
        stat = self._stat()
        if stat is None:
            return self.n
        own = self._own()
        others = (stat[1] - busy0 - (own - own0)) / (now - t0)
        self.n = max(1, min(self.pool, self.pool - round(others)))
        self._last = (now, stat[1], own)
        return self.n
