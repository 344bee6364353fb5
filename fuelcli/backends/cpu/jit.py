"""numba options shared by every CPU kernel.

error_model="numpy": a float division by zero gives inf/NaN as in numpy instead of raising
ZeroDivisionError (non-finite weights must not kill the engine; callers check the logits), and the
divisions need no zero test. cache=True: compiled code is kept on disk for later starts.
"""

EXACT = dict(cache=True, fastmath=False, error_model="numpy")  # bit-exact decodes: no reassociation, no FMA
FAST = dict(cache=True, fastmath=True, error_model="numpy")
PARALLEL = dict(FAST, parallel=True)


def helper(fastmath=True):
    """A function only jitted code calls: typed and compiled inside its caller's library, not as a
    dispatcher of its own (no CPython wrapper, no machine code or cache entry of its own: each
    separate njit function costs a first run a few tenths of a second)."""
    from numba.extending import register_jitable

    return register_jitable(fastmath=fastmath, error_model="numpy")
