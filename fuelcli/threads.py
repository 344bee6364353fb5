"""Numba threading, set before numba is first imported (it reads these at import).

fuel makes one numba call per forward; inside it every matmul is a parallel region. With OpenMP's
default active wait, idle workers spin and steal the one real core here from the main thread, so
the wait policy is passive (numba's tbb or workqueue layers, when chosen, are unaffected).
FUEL_THREADS sets the thread count: a whole number up to llama.cpp's GGML_MAX_N_THREADS (a million
threads crash numba's pool; anything but a number makes numba warn and ignore it).
"""

import os

from .errors import InputError

MAX_THREADS = 512

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
_threads = os.environ.get("FUEL_THREADS", "").strip()
if _threads:
    if not (_threads.isascii() and _threads.isdigit() and 1 <= int(_threads) <= MAX_THREADS):
        raise InputError(f"FUEL_THREADS must be a whole number from 1 to {MAX_THREADS}, got {_threads!r}")
    os.environ["NUMBA_NUM_THREADS"] = _threads
