"""Backends: `make_engine` is the one way the commands get an engine (base.Engine).

    cpu   numba njit kernels over the weights as stored (backends/cpu)
    cuda  numba.cuda kernels over the weights uploaded as stored (backends/cuda; pip install 'fuel-llm[cuda]')

The device comes from the argument, else FUEL_DEVICE, else "cpu"; the KV cache holds float32
values, or float16 with cache_type "f16" (CPU only; kv_cache.CACHE_TYPES).
"""

from __future__ import annotations

import os

from ..process import threads  # noqa: F401  (numba's threading environment, before numba is imported)
from ..errors import InputError
from ..model.block import features
from .base import Engine
from .kv_cache import CACHE_TYPES

DEVICES = ("cpu", "cuda")


def resolve_device(device: str | None) -> str:
    device = (device or os.environ.get("FUEL_DEVICE") or "cpu").strip().lower()
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r} (FUEL_DEVICE or --device); supported: {', '.join(DEVICES)}")
    return device


ACTIVATIONS = ("int16", "q8")  # cpu/q8_tables.py


def resolve_activations(activations: str | None, device: str = "cpu") -> str:
    """The argument, else FUEL_ACTIVATIONS, else int16; q8 on the CPU only."""
    kind = (activations or os.environ.get("FUEL_ACTIVATIONS") or "int16").strip().lower()
    if kind not in ACTIVATIONS:
        raise InputError(f"unknown activations {kind!r} (--activations or FUEL_ACTIVATIONS); supported: "
                         f"{', '.join(ACTIVATIONS)}")
    if device == "cuda" and kind != "int16":
        raise InputError(f"--activations {kind}: the cuda backend has no 8-bit activation kernels; use --device cpu")
    return kind


def check_cache_type(cache_type: str, device: str) -> str:
    if cache_type not in CACHE_TYPES:
        raise InputError(f"unknown KV cache type {cache_type!r} (--cache-type); supported: {', '.join(CACHE_TYPES)}")
    if device == "cuda" and cache_type != "f32":
        raise InputError(f"--cache-type {cache_type}: the cuda backend keeps its KV cache in f32 only")
    return cache_type


# of the block features (block.features), what the CUDA engine runs and what the CPU engine does
# not yet; the reference forward runs them all
CUDA_FEATURES = frozenset()
CPU_MISSING = frozenset()


def check_features(cfg, device: str):
    """One line naming the first block feature of the model the device's engine does not run."""
    found = features(cfg)
    missing = {k: v for k, v in found.items() if (k not in CUDA_FEATURES if device == "cuda" else k in CPU_MISSING)}
    if missing:
        name, layer = next(iter(missing.items()))
        instead = "only the reference forward runs it so far (fuel logits --path reference)" if name in CPU_MISSING \
            else "use --device cpu"
        raise InputError(f"the {device} backend does not run {name} (layer {layer} of this {cfg.family} model); "
                         f"{instead}")


def make_engine(cfg, weights, n_ctx: int | None = None, device: str | None = None, cache_type: str = "f32",
                slots: int = 1, activations: str | None = None) -> Engine:
    """An engine for the model on the device, with a KV cache of n_ctx positions (default: the model's)
    of cache_type values for each of `slots` sequences (base.Engine.step), its matrix inputs
    quantised as `activations` (resolve_activations)."""
    device = resolve_device(device)
    check_cache_type(cache_type, device)
    activations = resolve_activations(activations, device)
    check_features(cfg, device)
    if device == "cuda":
        if slots != 1:
            raise InputError(f"the cuda backend runs one sequence at a time, not {slots} (--parallel); use --device cpu")
        from .cuda.engine import CudaEngine

        return CudaEngine(cfg, weights, n_ctx)
    from .cpu.engine import CpuEngine

    return CpuEngine(cfg, weights, n_ctx, cache_type=cache_type, slots=slots, activations=activations)
