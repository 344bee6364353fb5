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
    # float64 then float32, as transformers computes int64 arange -> float then divides in f32
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def llama3_bands(rope: RopeConfig, inv_freq: np.ndarray) -> np.ndarray:
    """Per frequency: 'kept' (short wavelengths), 'divided' (long) or 'smoothed' (between)."""
    wavelen = 2 * math.pi / inv_freq.astype(np.float64)
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
    wavelen = 2 * math.pi / base
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    scaled = np.where(wavelen > low_wavelen, base / rope.factor, base)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(between, smoothed, scaled).astype(np.float32)


def cos_sin(rope: RopeConfig, head_dim: int, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables [n_positions, head_dim/2] in f32, the angle computed in f32 like transformers."""
    freqs = np.arange(n_positions, dtype=np.float32)[:, None] * inv_freq(rope, head_dim)[None, :]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
