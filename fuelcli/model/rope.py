"""Rotary position embeddings: inverse frequencies for each scaling type, and cos/sin tables.

HF layout ("rotate half", NEOX): dimension i pairs with i + head_dim/2, both rotated by inv_freq[i].
Types: default; linear (every frequency / factor); llama3 (three bands by wavelength); yarn (a ramp
between interpolated and original frequencies by rotations per original context, cos and sin times
an attention factor); factors (each frequency divided by its own factor: a GGUF `rope_freqs`
tensor, llama.cpp's form of llama3 scaling); longrope (Phi-3: per-frequency factors, the long ones
for a table past the original context, the short ones otherwise, cos and sin times an attention
factor). transformers picks LongRoPE's factors by the sequence so far, llama.cpp by the context
size: a full-prefix forward (the reference) picks by its length, an engine by its context.
proportional (Gemma 4's global layers): the first partial_rotary_factor of the frequencies are the
default ones of the whole head_dim, the rest 0 (those pairs not rotated), all / factor.
"""

import math
from dataclasses import dataclass

import numpy as np

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    type: str = "default"  # a SUPPORTED_ROPE_TYPES entry, or "factors"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position: int = 8192  # llama3, yarn, longrope
    beta_fast: float = 32.0  # yarn: rotations bounding the ramp
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: the ramp's bounds rounded to whole dimensions
    attention_factor: float = 1.0  # yarn, longrope: cos and sin are multiplied by it
    factors: tuple = ()  # factors, longrope (the short ones): one divisor per frequency
    long_factors: tuple = ()  # longrope: the divisors past the original context
    partial_rotary_factor: float = 1.0  # proportional: the share of the frequencies that rotate


def powers(head_dim: int, theta: float) -> np.ndarray:
    """theta ** (2i/d) as transformers: exponents in float32, the power in float32. It is taken in
    float64 and rounded once (the correctly rounded float32 result): torch's vectorised float32 pow
    is within 1 ulp of it, and which way its last bit falls depends on the CPU's vector width, so
    no float32 formula matches torch's bits on every machine."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)


def base_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """1 / theta ** (2i/d) in float32, as transformers."""
    return (np.float32(1.0) / powers(head_dim, theta)).astype(np.float32)


def llama3_bands(rope: RopeConfig, base: np.ndarray) -> np.ndarray:
    """Per frequency: 'kept' (short wavelengths), 'divided' (long) or 'smoothed' (between); the
    wavelengths in float32 as transformers compares them."""
    wavelen = np.float32(2 * math.pi) / base
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    return np.where(wavelen < high_wavelen, "kept", np.where(wavelen > low_wavelen, "divided", "smoothed"))


def yarn_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """transformers' _compute_yarn_parameters: dimensions below the ramp keep their frequency
    (extrapolation), those above are divided by factor (interpolation), linearly between."""
    def dim_of(rotations):  # the dimension that turns `rotations` times over the original context
        return head_dim * math.log(rope.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)
    power = powers(head_dim, rope.theta)
    extrapolated = np.float32(1.0) / power
    interpolated = np.float32(1.0) / (np.float32(rope.factor) * power)
    return (interpolated * (1 - keep) + extrapolated * keep).astype(np.float32)


def inv_freq(rope: RopeConfig, head_dim: int, n_positions: int | None = None) -> np.ndarray:
    """The inverse frequencies of a table of n_positions (LongRoPE's choice; None: the short ones)."""
    base = base_inv_freq(head_dim, rope.theta)
    if rope.type == "default":
        return base
    if rope.type == "linear":
        return (base / np.float32(rope.factor)).astype(np.float32)
    if rope.type == "yarn":
        return yarn_inv_freq(rope, head_dim)
    if rope.type == "proportional":  # transformers: int(p * head_dim // 2) rotated, the rest 0
        rotated = int(rope.partial_rotary_factor * head_dim // 2)
        base[rotated:] = 0
        return (base / np.float32(rope.factor)).astype(np.float32)
    if rope.type == "factors":
        return (base / np.asarray(rope.factors, np.float32)).astype(np.float32)
    if rope.type == "longrope":  # transformers: 1 / (factor * theta ** (2i/d))
        long = n_positions is not None and n_positions > rope.original_max_position
        factors = np.asarray(rope.long_factors if long else rope.factors, np.float32)
        return (np.float32(1.0) / (factors * powers(head_dim, rope.theta))).astype(np.float32)
    # llama3: keep high frequencies, divide low ones by factor, interpolate between
    bands = llama3_bands(rope, base)
    divided = base / np.float32(rope.factor)
    span = rope.high_freq_factor - rope.low_freq_factor  # 0: no smoothed band (a hard cut), nothing to divide
    smooth = (rope.original_max_position / (np.float32(2 * math.pi) / base) - rope.low_freq_factor) / (span or 1.0)
    smoothed = (1 - smooth) * base / np.float32(rope.factor) + smooth * base  # transformers' order
    return np.where(bands == "kept", base, np.where(bands == "divided", divided, smoothed)).astype(np.float32)


def cos_sin(rope: RopeConfig, head_dim: int, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables [n_positions, head_dim/2] in f32, the angle computed in f32 like transformers (and
    both times the attention factor, as transformers scales them)."""
    freqs = np.arange(n_positions, dtype=np.float32)[:, None] * inv_freq(rope, head_dim, n_positions)[None, :]
    cos, sin = np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
    if rope.attention_factor != 1.0:
        f = np.float32(rope.attention_factor)
        cos, sin = (cos * f).astype(np.float32), (sin * f).astype(np.float32)
    return cos, sin


def cos_sin_tables(ropes: list, head_dim: int, n_positions: int, rotary_dim: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cos_sin of each RoPE stacked: [len(ropes) (at least 1), n_positions, head_dim/2]; with a
    rotary_dim (RoPE over part of each head) its rotary_dim/2 frequencies, the rest zero."""
    dims = rotary_dim or head_dim
    pairs = [cos_sin(r, dims, n_positions) for r in ropes] or [cos_sin(RopeConfig(), dims, n_positions)]
    pad = ((0, 0), (0, (head_dim - dims) // 2))
    return (np.stack([np.pad(c, pad) for c, _ in pairs]).astype(np.float32),
            np.stack([np.pad(s, pad) for _, s in pairs]).astype(np.float32))
