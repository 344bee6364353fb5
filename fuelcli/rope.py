"""Rotary position embeddings: inverse frequencies for each scaling type, and cos/sin tables.

HF layout ("rotate half", NEOX): dimension i pairs with i + head_dim/2, both rotated by inv_freq[i].
"""

import math
from dataclasses import dataclass

import numpy as np

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


def base_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """As transformers: exponents 2i/d in float32, theta ** e in float32, 1 / that in float32. The
    power is taken in float64 and rounded once (the correctly rounded float32 result): torch's
    vectorised float32 pow is within 1 ulp of it, and which way its last bit falls depends on the
    CPU's vector width, so no float32 formula matches torch's bits on every machine."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    power = (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) / power).astype(np.float32)


def llama3_bands(rope: RopeConfig, base: np.ndarray) -> np.ndarray:
    """Per frequency: 'kept' (short wavelengths), 'divided' (long) or 'smoothed' (between); the
    wavelengths in float32 as transformers compares them."""
    wavelen = np.float32(2 * math.pi) / base
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    return np.where(wavelen < high_wavelen, "kept", np.where(wavelen > low_wavelen, "divided", "smoothed"))


def inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    base = base_inv_freq(head_dim, rope.theta)
    if rope.type == "default":
        return base
    if rope.type == "linear":
        return (base / np.float32(rope.factor)).astype(np.float32)
    # llama3: keep high frequencies, divide low ones by factor, interpolate between
    bands = llama3_bands(rope, base)
    divided = base / np.float32(rope.factor)
    span = rope.high_freq_factor - rope.low_freq_factor  # 0: no smoothed band (a hard cut), nothing to divide
    smooth = (rope.original_max_position / (np.float32(2 * math.pi) / base) - rope.low_freq_factor) / (span or 1.0)
    smoothed = (1 - smooth) * base / np.float32(rope.factor) + smooth * base  # transformers' order
    return np.where(bands == "kept", base, np.where(bands == "divided", divided, smoothed)).astype(np.float32)


def cos_sin(rope: RopeConfig, head_dim: int, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables [n_positions, head_dim/2] in f32, the angle computed in f32 like transformers."""
    freqs = np.arange(n_positions, dtype=np.float32)[:, None] * inv_freq(rope, head_dim)[None, :]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
