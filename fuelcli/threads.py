"""Numba threading, set before numba is first imported (it reads these at import).

Calling a parallel numba function wakes its thread pool; with OpenMP's default active wait that
costs milliseconds here. fuel makes one call per forward, and the workqueue layer with passive
OpenMP wait keeps both cheap. FUEL_THREADS overrides the thread count.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
if "FUEL_THREADS" in os.environ:
    os.environ["NUMBA_NUM_THREADS"] = os.environ["FUEL_THREADS"]
