"""Numba threading, set before numba is first imported (it reads these at import).

fuel makes one numba call per forward; inside it every matmul is a parallel region. With OpenMP's
default active wait, idle workers spin and steal the one real core here from the main thread, so
the wait policy is passive (numba's tbb or workqueue layers, when chosen, are unaffected).
FUEL_THREADS sets the thread count.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
if "FUEL_THREADS" in os.environ:
    os.environ["NUMBA_NUM_THREADS"] = os.environ["FUEL_THREADS"]
