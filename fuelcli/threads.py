"""Numba threading, set before numba is first imported (it reads these at import).

fuel makes one numba call per forward; inside it every matmul is a parallel region. With OpenMP's
default active wait, idle workers spin and steal the one real core here from the main thread, so
the wait policy is passive (numba's tbb or workqueue layers, when chosen, are unaffected).
FUEL_THREADS sets the thread count; `-t/--threads` sets it per command (set_threads).
"""

import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
if "FUEL_THREADS" in os.environ:
    os.environ["NUMBA_NUM_THREADS"] = os.environ["FUEL_THREADS"]


def set_threads(n: int | None) -> int:
    """Compute with n threads (None: numba's default, all cores or FUEL_THREADS); returns the count.

    Before numba is imported the pool itself is sized to n (so n may exceed the cores, as
    llama.cpp's -t allows); afterwards n must fit the pool numba already started.
    """
    from .errors import InputError

    if n is not None and n < 1:
        raise InputError(f"-t/--threads must be at least 1, got {n}")
    if n is not None and "numba" not in sys.modules:
        os.environ["NUMBA_NUM_THREADS"] = str(n)
    import numba

    if n is not None:
        if n > numba.config.NUMBA_NUM_THREADS:
            raise InputError(f"-t {n} exceeds numba's pool of {numba.config.NUMBA_NUM_THREADS} threads "
                             "(set FUEL_THREADS to enlarge it)")
        numba.set_num_threads(n)
    return numba.get_num_threads()
