"""Whether numba.cuda can run here, and the launch shapes for a GPU or the simulator.

`require()` returns the numba.cuda module or raises MissingDependency (exit 4) with one line naming
what is missing: the numba-cuda package, NVIDIA's CUDA Python bindings, a driver, a GPU or the
toolkit's NVVM compiler. NUMBA_ENABLE_CUDASIM=1 (set before numba.cuda is imported) runs every kernel
in numba's CUDA simulator instead: slow (Python per simulated thread), for tests; the simulator has no
warp shuffles, which tests/cuda_sim.py's speed_up() supplies (the decode products sum rows with them).
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

from ...errors import MissingDependency
from ...process.extras import pip_install

INSTALL = pip_install("cuda")


class Launch(NamedTuple):
    """Threads per block of each kernel family (powers of two: the block sums halve them)."""

    lanes: int  # decode matvec: threads sharing one row
    rows: int  # decode matvec: rows per block
    tile: int  # prefill matmul: a tile x tile block, each thread MT x MT outputs
    attn: int  # attention: keys per chunk (threads per (token, head) block)
    head: int  # QK-norm / RoPE: threads per head
    row: int  # row-wise kernels (RMSNorm, embedding, argmax, elementwise)


GPU = Launch(lanes=32, rows=8, tile=16, attn=128, head=64, row=256)
# The simulator runs each thread as a Python thread (~0.1 ms each plus ~1.5 us per array access):
# the same kernels with the fewest threads that still exercise every cross-thread reduction.
SIMULATOR = Launch(lanes=2, rows=2, tile=2, attn=4, head=4, row=4)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()).rstrip(" :") or type(e).__name__


def simulator() -> bool:
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


def _quiet_occupancy():
    """numba-cuda warns at every launch of a grid under 128 blocks; a decode step's attention (a block
    per head) and a small model's products are such grids by design. Its config module may have read
    the environment before fuel set NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS (backends/cuda/__init__.py)."""
    try:
        from numba.cuda.core import config
    except ImportError:  # numba's own CUDA target: its config is numba.core's
        from numba.core import config
    config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def require():
    """numba.cuda, usable: a driver, a GPU and NVVM (or the simulator)."""
    if importlib.util.find_spec("numba_cuda") is None:
        raise MissingDependency(f"--device cuda needs NVIDIA's numba-cuda and the CUDA toolkit wheels: {INSTALL}")
    try:
        from numba import cuda
    except ImportError as e:
        raise MissingDependency(f"--device cuda: numba.cuda does not import ({_one_line(e)}); {INSTALL}") from None
    _quiet_occupancy()
    if simulator():
        return cuda
    from numba.cuda.cudadrv.error import CudaSupportError, NvvmSupportError

    try:
        n = len(cuda.gpus)
    except CudaSupportError as e:
        raise MissingDependency(f"--device cuda: no usable NVIDIA driver ({_one_line(e)})") from None
    if n == 0:
        raise MissingDependency("--device cuda: the NVIDIA driver sees no GPU")
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except (NvvmSupportError, OSError) as e:
        raise MissingDependency(f"--device cuda: the CUDA toolkit's NVVM library is missing ({_one_line(e)}); "
                                f"{INSTALL}") from None
    return cuda
