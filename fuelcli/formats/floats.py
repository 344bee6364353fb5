"""Plain float formats: one element per "block", stored little-endian.

bf16 is the top half of an f32 (numpy has no bf16: widen the uint16 with << 16).
"""

from typing import NamedTuple

import numpy as np

from .base import Format


class FloatLayout(NamedTuple):
    code: int
    block_elems: int
    block_bytes: int


def _f32(b):
    return b.reshape(-1).view(np.float32).reshape(-1, 1).copy()


def _f16(b):
    return b.reshape(-1).view(np.float16).astype(np.float32).reshape(-1, 1)


def _bf16(b):
    return (b.reshape(-1).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1, 1)


F32 = Format("f32", 0, FloatLayout(code=0, block_elems=1, block_bytes=4), _f32)
F16 = Format("f16", 1, FloatLayout(code=1, block_elems=1, block_bytes=2), _f16)
BF16 = Format("bf16", 30, FloatLayout(code=2, block_elems=1, block_bytes=2), _bf16)
