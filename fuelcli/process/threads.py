"""Numba threading, set before numba is first imported (it reads these at import).

fuel makes one numba call per forward; inside it every matmul is a parallel region, ~140 of them in
a decode step of a 28-layer model. OpenMP's wait policy is left at its default, as llama.cpp and
torch run: a worker spins a little (libgomp: 300,000 polls, a few ms) before it sleeps, so the next
region starts without a wake-up. A passive wait (`OMP_WAIT_POLICY=passive`: every region wakes its
workers through the kernel) measured decode 1.3-1.9x slower on 2 cores (figures: docs/performance.md);
a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is honoured.
FUEL_THREADS sets the pool's thread count: a whole number up to llama.cpp's GGML_MAX_N_THREADS (a
million threads crash numba's pool; anything but a number makes numba warn and ignore it).
`-t/--threads` sets the count per command (set_threads), and says once where it is more than the
CPUs other processes leave free. Without either, a CPU engine runs each forward on the threads that
the CPUs other processes leave free allow (process/free_cpus.py).

The commands import numba here, without three optional probes fuel never needs (~50 ms of a warm
start): PyYAML, read only for a .numba_config.yaml in the working directory (probed when there is
none); SciPy, imported only to check that its version is at least 1.0; cffi, which lets jitted code
call cffi functions: numba's cffi support stays off in a fuel command's process.
"""

import os
import sys

from ..errors import InputError

MAX_THREADS = 512

_threads = os.environ.get("FUEL_THREADS", "").strip()
if _threads:
    if not (_threads.isascii() and _threads.isdigit() and 1 <= int(_threads) <= MAX_THREADS):
        raise InputError(f"FUEL_THREADS must be a whole number from 1 to {MAX_THREADS}, got {_threads!r}")
    os.environ["NUMBA_NUM_THREADS"] = _threads
_explicit = bool(_threads)  # a count the user chose (FUEL_THREADS, -t): engines never change it


def explicit() -> bool:
    """Whether the user chose the thread count (else a CPU engine follows the free CPUs)."""
    return _explicit


def pool_size() -> int:
    """The threads numba's pool holds: the most a forward runs on."""
    return _import_numba().config.NUMBA_NUM_THREADS


def use(n: int) -> None:
    """The calling thread's next forwards run on n threads (numba's count is per calling thread)."""
    numba = _import_numba()
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)


def set_threads(n: int | None) -> int:
    """Compute with n threads (None: numba's default, all cores or FUEL_THREADS); returns the count.

    Before numba is imported the pool itself is sized to n (so n may exceed the cores, as
    llama.cpp's -t allows); afterwards n must fit the pool numba already started.
    """
    global _explicit
    if n is not None and not 1 <= n <= MAX_THREADS:
        raise InputError(f"-t/--threads must be from 1 to {MAX_THREADS}, got {n}")
    _explicit = _explicit or n is not None
    if n is not None and "numba" not in sys.modules:
        os.environ["NUMBA_NUM_THREADS"] = str(n)
    probe = _free_cpus_probe() if n is not None and n > 1 and not _said_busy else None
    numba = _import_numba()  # the probe's first window spans this import (~0.4 s): seldom a wait

    if n is not None:
        if n > numba.config.NUMBA_NUM_THREADS:
            raise InputError(f"-t {n} exceeds numba's pool of {numba.config.NUMBA_NUM_THREADS} threads "
                             "(set FUEL_THREADS to enlarge it)")
        numba.set_num_threads(n)
        if probe is not None:
            _say_if_busy(n, probe)
    return numba.get_num_threads()


_said_busy = False  # the busy CPUs are said once a process


def _free_cpus_probe():
    """A reading of the CPUs other processes keep busy, started now (off where it cannot count them)."""
    from .free_cpus import FreeCpus

    probe = FreeCpus(os.cpu_count() or 1)
    return probe if probe.on else None


def _say_if_busy(n: int, probe) -> None:
    """One line on stderr where -t asks for more threads than other processes leave CPUs free: each
    parallel region waits for the thread that shares a busy core (decode fell to a twentieth)."""
    global _said_busy
    free = probe.threads()
    if free < probe.pool and n > free:
        _said_busy = True
        print(f"fuel: the CPUs are busy: other processes keep {probe.pool - free} of {probe.pool} busy; "
              f"-t {n} waits for them at every step (-t {free}, or no -t to follow the free CPUs, runs faster)",
              file=sys.stderr, flush=True)


def _import_numba():
    """numba, imported (once) without the probes the module docstring names."""
    if "numba" in sys.modules:
        return sys.modules["numba"]
    probes = ["scipy", "cffi"] + ([] if os.path.isfile(".numba_config.yaml") else ["yaml"])
    skipped = [m for m in probes if m not in sys.modules]
    for m in skipped:
        sys.modules[m] = None  # `import m` raises ImportError, which numba takes as "not installed"
    try:
        import numba
        import numba.core.typing.cffi_utils  # noqa: F401  (imported later otherwise, with cffi)
    finally:
        for m in skipped:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]
    return numba
