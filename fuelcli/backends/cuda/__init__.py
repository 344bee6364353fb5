"""The numba.cuda backend (`--device cuda`): the same decoder as backends/cpu, its kernels written
for a GPU. Importing this package imports nothing from numba.cuda; `engine.CudaEngine` checks that
the CUDA packages, a driver and a GPU are there (runtime.require) before it loads any kernel.

    runtime.py          availability check (errors.MissingDependency, exit 4), launch shapes
    device_weights.py   the weights on the device, packed as stored, and their tables
    activations.py      device activations, allocated once per engine
    engine.py           CudaEngine: decode (matvec) and prefill (tiled matmul) forwards
    launcher.py         a decode step's launches prepared once (numba-cuda's dispatch bound the step)
    bandwidth.py        the GPU's read bandwidth, for fuel bench's roofline
    ptx.py              every kernel compiled to PTX without a GPU, and what its PTX does
    kernels/            unpack (one unit decoder per format), matvec, matmul, attention, moe, rows, probe
"""

import os as _os

import numpy as _np

# numba-cuda's low-occupancy warnings off (runtime._quiet_occupancy says why; this covers a config
# read after this import, that one a config read before it)
_os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

# numba-cuda 0.30 registers an overload of np.row_stack when it first compiles a kernel; NumPy 2.5
# removed that alias of vstack, and the lent GPU machine pairs the two (its compile then fails with
# "module 'numpy' has no attribute 'row_stack'"). Restore the alias: it is vstack by definition.
if not hasattr(_np, "row_stack"):
    _np.row_stack = _np.vstack
