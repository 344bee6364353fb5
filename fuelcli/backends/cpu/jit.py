"""numba options shared by the CPU backend, and when its on-disk cache is stale.

error_model="numpy": a float division by zero gives inf/NaN as in numpy instead of raising
ZeroDivisionError (non-finite weights must not kill the engine; callers check the logits), and the
divisions need no zero test. cache=True: compiled code is kept on disk for later starts.

FAST takes every fast-math liberty but two: `nnan` and `ninf` would let LLVM assume no NaN or inf
exists, so a NaN weight could vanish on one path and reach the logits on another (measured: a NaN
Q8_0 scale gave finite logits on decode, NaN on prefill). Without them NaN and inf propagate as
IEEE says, on every path, and the logits check (model/finite.py) sees them.

numba checks a cached function against its own source file only, but the forward's cached code
holds every helper it calls (matmul.py, ...) and the kernels' calling conventions: after an edit
of those files (or an upgrade that keeps forward.py's time and size) it would run stale code that
calls kernels with the wrong arguments. So every function defined in fuel's source tree (fuelcli/
and its tests) is cached against a digest of the backend and format sources as well.
"""

import hashlib
import os
import sys
from pathlib import Path

from numba.core import caching


def _import_arraymath_without_blas_probe():
    """numba.np.arraymath, imported when numba's CPU target first loads (a cached forward too),
    probes for BLAS by importing scipy.linalg: 0.2 s of a 1.3 s warm start where scipy is installed.
    The answer only picks BLAS or a loop for np.correlate / np.convolve, which fuel never compiles
    (np.dot and np.linalg look for BLAS again when compiled), so the probe is made to fail at once."""
    probe = "scipy.linalg.cython_blas"
    if "numba.np.arraymath" in sys.modules or probe in sys.modules:
        return
    sys.modules[probe] = None  # `import` of it raises ImportError without loading scipy.linalg
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get(probe, 0) is None:
            del sys.modules[probe]


_import_arraymath_without_blas_probe()

FAST = dict(cache=True, fastmath={"reassoc", "contract", "arcp", "nsz", "afn"}, error_model="numpy")
PARALLEL = dict(FAST, parallel=True)
OWN_FLAGS = dict(fastmath=FAST["fastmath"], error_model="numpy")  # a helper's or an overload's: FAST's liberties


def load_cached(dispatcher, sig) -> bool:
    """Loads a dispatcher's compiled code for `sig` from numba's disk cache as Dispatcher.compile
    does, less one step: before any cache load numba refreshes its CPU target, importing and
    installing every typing and lowering registry it has (~0.1 s of a 1 s warm start), which code
    loaded ready-made never consults; it needs only numba's runtime (NRT) started. False when the
    cache has no entry, or numba's internals are not where this expects them: the caller compiles
    (a later compile refreshes the target then)."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.runtime import rtsys

    try:
        ctx = dispatcher.targetctx
        with global_compiler_lock:
            if tuple(sig) in dispatcher.overloads:
                return True
            rtsys.initialize(ctx)
            cres = dispatcher._cache._load_overload(sig, ctx)
            if cres is None or cres.objectmode:
                return False
            dispatcher._cache_hits[sig] += 1
            ctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
            dispatcher.add_overload(cres)
        return True
    except Exception:
        return False


def compile_elsewhere(dispatcher, sig) -> bool:
    """Compiles a cached dispatcher's code for `sig` into numba's disk cache in a child process,
    then loads it here (load_cached). numba keeps what a compile built for the life of the process:
    the Qwen3-30B-A3B-shape forward's compile left 370 MB on this process's heap (malloc_trim gave
    back 20 MB), which a loaded forward's 28 MB replaces. False when the child failed or left
    nothing to load (or there is no disk cache to leave it in): the caller compiles here, as before."""
    import pickle
    import subprocess

    if type(getattr(dispatcher, "_cache", None)).__name__ != "FunctionCache":
        return False
    job = pickle.dumps((dispatcher.py_func.__module__, dispatcher.py_func.__qualname__, tuple(sig)))
    code = f"import sys; sys.path.insert(0, {str(_ROOT)!r}); from {__name__} import compile_job; compile_job()"
    try:
        subprocess.run([sys.executable, "-c", code], input=job, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    return load_cached(dispatcher, sig)


def compile_job() -> None:
    """The child of compile_elsewhere: (module, name, signature) pickled on stdin, compiled into the cache."""
    import importlib
    import pickle

    module, name, sig = pickle.loads(sys.stdin.buffer.read())
    getattr(importlib.import_module(module), name).compile(sig)


def helper(fastmath=True):
    """A function only jitted code calls: no CPython wrapper and no cache entry of its own, its code
    linked into its callers'. numba still compiles it (machine code too) once per argument types
    and per caller flags, ~0.1 s each on a first run: helpers take few distinct types, and trivial
    ones are intrinsics (llvm.py)."""
    from numba.extending import register_jitable

    return register_jitable(**OWN_FLAGS if fastmath else dict(OWN_FLAGS, fastmath=False))


_ROOT = Path(__file__).resolve().parents[3]  # the directory holding the fuelcli package
_STAMPED = [Path(__file__).parent, Path(__file__).parents[2] / "formats"]


def _tree_digest() -> str:
    h = hashlib.sha256()
    for d in _STAMPED:
        for f in sorted(d.glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


SOURCE_DIGEST = _tree_digest()  # also keys the IR kernels' object cache (llvm.py)


def _in_tree(py_file) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(_ROOT)
    except (OSError, ValueError):
        return False


def _stamped(base):
    class Locator(base):
        def get_source_stamp(self):
            return (super().get_source_stamp(), SOURCE_DIGEST)

        @classmethod
        def from_function(cls, py_func, py_file):
            return super().from_function(py_func, py_file) if _in_tree(py_file) else None

    Locator.__name__ = Locator.__qualname__ = "Fuel" + base.__name__
    return Locator


def _install():
    try:
        bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
        classes = caching.CacheImpl._locator_classes
    except AttributeError:  # another numba layout: keep its own checks
        return
    if not any(c.__name__.startswith("Fuel") for c in classes):
        classes[:0] = [_stamped(b) for b in bases]


if not os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES"):
    _install()
