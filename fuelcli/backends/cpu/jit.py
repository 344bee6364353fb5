"""numba options shared by every CPU kernel.

error_model="numpy": a float division by zero gives inf/NaN as in numpy instead of raising
ZeroDivisionError (non-finite weights must not kill the engine; callers check the logits), and the
divisions need no zero test. cache=True: compiled code is kept on disk for later starts.

FAST takes every fast-math liberty but two: `nnan` and `ninf` would let LLVM assume no NaN or inf
exists, so a NaN weight could vanish on one path and reach the logits on another (measured: a NaN
Q8_0 scale gave finite logits on decode, NaN on prefill). Without them NaN and inf propagate as
IEEE says, on every path, and the logits check (finite.py) sees them.
"""

EXACT = dict(cache=True, fastmath=False, error_model="numpy")  # bit-exact decodes: no reassociation, no FMA
FAST = dict(cache=True, fastmath={"reassoc", "contract", "arcp", "nsz", "afn"}, error_model="numpy")
PARALLEL = dict(FAST, parallel=True)
