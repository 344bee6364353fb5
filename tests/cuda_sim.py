"""Import first in every CUDA test module: numba.cuda then runs on the simulator, unless the
environment says NUMBA_ENABLE_CUDASIM=0 (examples/gpu-check.sh, on a machine with a GPU).

numba reads NUMBA_ENABLE_CUDASIM when numba.cuda is first imported. Other test modules import numba
(the CPU kernels) but never numba.cuda, so setting the variable here and reloading numba's config
is enough as long as no module imported numba.cuda before this one (checked).

`speed_up()` patches the simulator's cost, not its semantics (a simulated forward: ~10x faster):
  - a device function call swapped the fake `cuda` module into its module's globals under a lock
    on every call; now once per kernel launch, as the simulator does for the kernel's own module;
  - a shared array's declaring line was found with traceback.extract_stack; now from the caller's
    frame. This also closes a race there (get, then set: two threads of a block could get two
    different "shared" arrays; seen as rare wrong logits in a loaded pytest run);
  - kernels index device arrays' numpy buffers, not two wrapper layers over them;
  - syncthreads is a threading.Barrier instead of a manager thread busy-polling the block;
  - numba scalar types called in kernels (float32(x)) are the numpy types they end at.
It also gives the simulator the warp shuffle it lacks (numba #8433): `cuda.shfl_down_sync` on an
exchange shared by the block, the lanes of a warp being linear thread ids 32w..32w+31, as on a GPU.
Every thread of the block must call it (fuel's kernels do: a row's lanes are summed uniformly).
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
assert "numba.cuda" not in sys.modules or os.environ["NUMBA_ENABLE_CUDASIM"] == "0", \
    "numba.cuda was imported before tests/cuda_sim.py set up the simulator"

import importlib.util  # noqa: E402

import pytest  # noqa: E402
from numba.core import config  # noqa: E402

config.reload_config()
SIMULATOR = bool(config.ENABLE_CUDASIM)
# fuel's CUDA backend is NVIDIA's numba-cuda (the test extra installs it); without it, skip
HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
needs_numba_cuda = pytest.mark.skipif(not HAVE_NUMBA_CUDA,
                                      reason="numba-cuda is not installed (pip install 'fuel-llm[cuda]')")


def speed_up():
    if not SIMULATOR or not HAVE_NUMBA_CUDA:
        return
    from numba.cuda.simulator import kernel as K

    if getattr(K.FakeCUDAKernel, "_fuel_fast", False):
        return
    call = K.FakeCUDAKernel.__call__
    lock = threading.Lock()
    swapped = []  # (module globals, original cuda) swapped during the current launch

    def fast_call(self, *args):
        if not self._device:
            try:
                return call(self, *args)
            finally:
                with lock:
                    for g, orig in swapped:
                        g["cuda"] = orig
                    swapped.clear()
        ctx = K._get_kernel_context()
        g = self.fn.__globals__
        if ctx is None or "cuda" not in g:
            return call(self, *args)
        if g["cuda"] is not ctx:
            with lock:
                if g["cuda"] is not ctx:
                    swapped.append((g, g["cuda"]))
                    g["cuda"] = ctx
        return self.fn(*args)

    K.FakeCUDAKernel.__call__ = fast_call
    K.FakeCUDAKernel._fuel_fast = True

    # shared arrays are keyed by their declaring line
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared.array

    def shared_array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return shared(self, shape, dtype, alignment)
        f = sys._getframe(1)
        caller = (f.f_code.co_filename, f.f_lineno)
        res = self._allocations.get(caller)
        if res is None:  # setdefault is atomic: threads that race here still share one array
            if isinstance(dtype, kernelapi.types.Type):
                dtype = kernelapi.numpy_support.as_dtype(dtype)
            res = self._allocations.setdefault(caller, kernelapi.np.empty(shape, dtype))
        return res

    kernelapi.FakeCUDAShared.array = shared_array

    # indexing a FakeCUDAArray returns what indexing its buffer returns; writes go to the buffer
    K.FakeWithinKernelCUDAArray = lambda fake: fake._ary

    # A thread that fails breaks the barrier, so the others stop instead of waiting. (A kernel whose
    # threads leave before a syncthreads the others reach would hang here, as it may on a GPU;
    # fuel's kernels have none.)
    def run_block(self, grid_point, *args):
        n = int(np.prod(self._block_dim))
        barrier = threading.Barrier(n)
        barrier._fuel_xchg = {}  # the block's shuffle exchange (shfl_down_sync)

        def target():
            try:
                self._f(*args)
            except BaseException:
                barrier.abort()
                raise

        threads = [K.BlockThread(target, self, grid_point, p, self._debug) for p in np.ndindex(*self._block_dim)]
        for t in threads:
            t.syncthreads = barrier.wait
            t.start()
        for t in threads:
            t.join()
        failed = [t for t in threads if t.exception]
        first = next((t for t in failed if not isinstance(t.exception[0], threading.BrokenBarrierError)), None)
        if failed:
            t = first or failed[0]
            raise t.exception[0].with_traceback(t.exception[1])

    K.BlockManager.run = run_block

    def shfl_down_sync(mask, value, delta):
        """Lane i gets lane i + delta's value (its own when that is past its warp)."""
        t = threading.current_thread()
        i = t.thread_id
        xchg = t.syncthreads.__self__._fuel_xchg  # one dict per block, on its barrier
        xchg[i] = value
        t.syncthreads()
        src = i + delta
        got = xchg.get(src, value) if (i % 32) + delta < 32 else value
        t.syncthreads()
        return got

    kernelapi.FakeCUDAModule.shfl_down_sync = staticmethod(shfl_down_sync)

    import importlib
    import pkgutil

    import numba

    from fuelcli.backends.cuda import kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        g = vars(importlib.import_module(f"{kernels.__name__}.{info.name}"))
        for name, value in list(g.items()):
            if isinstance(value, numba.types.Number) and hasattr(np, name):
                g[name] = getattr(np, name)
