"""Import first in every CUDA test module: numba.cuda then runs on the simulator, unless the
environment says NUMBA_ENABLE_CUDASIM=0 (examples/gpu-check.sh, on a machine with a GPU).

numba reads NUMBA_ENABLE_CUDASIM when numba.cuda is first imported. Other test modules import numba
(the CPU kernels) but never numba.cuda, so setting the variable here and reloading numba's config
is enough as long as no module imported numba.cuda before this one (checked).

`fast_device_calls()` is a test shim for the simulator's cost, not its semantics: the simulator
swaps the fake `cuda` module into a device function's module globals on every call (a lock and a
scan of the globals: ~60% of a simulated forward). It swaps each module once per kernel launch
instead, as the simulator already does for the kernel's own module; and it finds the line that
declares a shared array from the caller's frame, not from a formatted stack. It also closes the
simulator's race there (get, then set: two threads of a block could get two different "shared"
arrays), which the short GIL switch interval set below would otherwise expose. And kernels index
device arrays' numpy buffers directly instead of through the simulator's wrappers.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
assert "numba.cuda" not in sys.modules or os.environ["NUMBA_ENABLE_CUDASIM"] == "0", \
    "numba.cuda was imported before tests/cuda_sim.py set up the simulator"

from numba.core import config  # noqa: E402

config.reload_config()
SIMULATOR = bool(config.ENABLE_CUDASIM)


def fast_device_calls():
    if not SIMULATOR:
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

    # Shared arrays are keyed by the line that declares them; the simulator finds it with
    # traceback.extract_stack (source lines read, per thread and call: ~40% of what is left).
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

    # Kernel arguments reach the kernel as two wrapper layers over the device array's numpy
    # buffer, a few microseconds per element access; the buffer itself reads and writes the same
    # memory (indexing a FakeCUDAArray returns what indexing its buffer returns).
    K.FakeWithinKernelCUDAArray = lambda fake: fake._ary

    # The block manager busy-polls its threads to find when all wait in syncthreads (~70% of the
    # time left, and it holds the GIL the simulated threads need). A threading.Barrier does the
    # same without polling; a thread that fails breaks it, so the others stop instead of waiting.
    # (A kernel whose threads leave before a syncthreads the others reach would hang here, as it
    # may on a GPU; fuel's kernels have none.)
    def run_block(self, grid_point, *args):
        n = int(np.prod(self._block_dim))
        barrier = threading.Barrier(n)

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

    # A numba scalar type called in simulated code (float32(x)) goes through numba's typing to
    # end at the numpy constructor: the kernels' modules get the numpy types directly.
    import importlib
    import pkgutil

    import numba

    from fuelcli.backends.cuda import kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        g = vars(importlib.import_module(f"{kernels.__name__}.{info.name}"))
        for name, value in list(g.items()):
            if isinstance(value, numba.types.Number) and hasattr(np, name):
                g[name] = getattr(np, name)
    # The simulator's block manager polls its threads: a short GIL switch interval lets the
    # simulated threads and the poller hand over quickly (4x faster here).
    sys.setswitchinterval(1e-4)
