"""Kernel launches prepared once and issued without numba-cuda's per-call dispatch: the decode step.

A decode step of an 8B model is about 160 launches whose arguments are the same at every step (the
weights, the activations and the KV cache are allocated once) but for the position and the token id.
numba-cuda's call path (`kernel[grid, block](*args)`) builds a launch configuration, types every
argument, looks the overload up and marshals each array into its kernel parameters again at every
call: on a data-centre GPU a decode step was bound by that, not by the GPU (80 tok/s, 8% of the
memory roofline, on a Llama-8B-shaped Q4_K file; docs/gpu.md). `Prepared` does it once, with
numba-cuda's own compile and marshalling, and then issues the launch the way numba-cuda's last line
does (cuda.core's `launch`); `set(i, value)` re-marshals one scalar argument (the position, the
token).

The simulator has no cuda.core launch: there, and with FUEL_CUDA_LAUNCH=numba (to compare), every
launch takes numba-cuda's ordinary path.
"""

from __future__ import annotations

import os

from .runtime import simulator


def _fast() -> bool:
    return not simulator() and os.environ.get("FUEL_CUDA_LAUNCH", "").strip().lower() != "numba"


class Prepared:
    """One launch of `kernel` (a numba-cuda dispatcher) on (grid, block) with `args`. The first call
    takes the ordinary path (it compiles the kernel for the arguments' types); later calls reuse the
    compiled kernel, its marshalled parameters and its launch configuration."""

    def __init__(self, kernel, grid, block, args):
        self.kernel, self.grid, self.block, self.args = kernel, grid, block, list(args)
        self.fast = _fast()
        self._issue = None  # (launch, stream, config, cu kernel, params, spans, compiled) once prepared

    def set(self, i: int, value) -> Prepared:
        """Argument i (a scalar) is `value` from the next call on."""
        self.args[i] = value
        if self._issue is not None:
            launch, stream, config, cu, params, spans, compiled = self._issue
            start, end = spans[i]
            part = []
            compiled._prepare_args(compiled.argument_types[i], value, stream, [], part)
            params[start:end] = part
        return self

    def __call__(self):
        if self._issue is not None:
            launch, stream, config, cu, params, _, _ = self._issue
            launch(stream, config, cu, *params)
            return
        self.kernel[self.grid, self.block](*self.args)
        if self.fast:
            self._prepare()

    def _prepare(self):
        """What numba-cuda's _Kernel.launch computes at every call, computed once (after a first
        ordinary launch compiled the kernel: compile() then only looks the overload up)."""
        from numba.cuda import dispatcher as nd
        from numba.cuda.cudadrv import driver
        from numba.cuda.errors import normalize_kernel_dimensions

        d = self.kernel
        compiled = d.compile(tuple(d.typeof_pyval(a) for a in self.args))
        stream = driver._to_core_stream(0)
        params, spans = [], []
        for ty, value in zip(compiled.argument_types, self.args):
            start, retr = len(params), []
            compiled._prepare_args(ty, value, stream, retr, params)
            if retr:  # a host array copied in and out at each launch: not what this is for
                return
            spans.append((start, len(params)))
        griddim, blockdim = normalize_kernel_dimensions(self.grid, self.block)
        coop = {"is_cooperative" if nd.CUDA_CORE_GE_1_0 else "cooperative_launch": compiled.cooperative}
        config = nd.LaunchConfig(grid=griddim, block=blockdim, shmem_size=0, **coop)
        cu = compiled._codelibrary.get_cufunc().kernel
        self._issue = (nd.launch, stream, config, cu, params, spans, compiled)
