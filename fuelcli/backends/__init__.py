"""Backends: `make_engine` is the one way the commands get an engine (base.Engine).

    cpu   numba njit kernels over the weights as stored (backends/cpu)
    cuda  numba.cuda kernels over the weights uploaded as stored (backends/cuda; pip install 'fuel[cuda]')

The device comes from the argument, else FUEL_DEVICE, else "cpu".
"""

from __future__ import annotations

import os

from .. import threads  # noqa: F401  (numba's threading environment, before numba is imported)
from ..errors import InputError
from .base import Engine

DEVICES = ("cpu", "cuda")


def resolve_device(device: str | None) -> str:
    device = (device or os.environ.get("FUEL_DEVICE") or "cpu").strip().lower()
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r} (FUEL_DEVICE or --device); supported: {', '.join(DEVICES)}")
    return device


def make_engine(cfg, weights, n_ctx: int | None = None, device: str | None = None) -> Engine:
    """An engine for the model on the device, with a KV cache of n_ctx positions (default: the model's)."""
    device = resolve_device(device)
    if device == "cuda":
        from .cuda.engine import CudaEngine

        return CudaEngine(cfg, weights, n_ctx)
    from .cpu.engine import CpuEngine

    return CpuEngine(cfg, weights, n_ctx)
