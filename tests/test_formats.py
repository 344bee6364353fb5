"""Weight formats: numpy dequantize == gguf.quants bit for bit; numba row kernels == numpy."""

from __future__ import annotations

import os

# one numba cache per xdist worker: concurrent cache writers can crash (numba #4807)
os.environ.setdefault("NUMBA_CACHE_DIR", f"/tmp/numba_cache_fuel_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")

import gguf
import gguf.quants
import numpy as np
import pytest

from fuelcli.errors import InputError
from fuelcli.weights.formats import FORMATS, dequantize, quantize, row_bytes
from fuelcli.weights.tensor import Tensor

# byte offsets of the f16 scales inside one block: random bytes there could be inf/NaN
SCALE_OFFSETS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q4_k": [0, 2], "q6_k": [208]}


def _finite_f16_bits(rng, n):
    h = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    h[(h & 0x7C00) == 0x7C00] &= 0xBFFF  # exponent all ones (inf/NaN) -> clear one exponent bit
    return h


def random_rows(fmt: str, rows: int, ncols: int, seed: int = 0) -> np.ndarray:
    """Random stored bytes (rows, row_bytes): every bit pattern except non-finite scales/values."""
    rng = np.random.default_rng(seed)
    f = FORMATS[fmt]
    rb = row_bytes(fmt, ncols)
    if fmt == "f32":
        return rng.standard_normal((rows, ncols)).astype(np.float32).view(np.uint8)
    if fmt == "bf16":
        w = rng.standard_normal((rows, ncols)).astype(np.float32)
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if fmt == "f16":
        return _finite_f16_bits(rng, rows * ncols).view(np.uint8).reshape(rows, rb)
    raw = rng.integers(0, 256, (rows, rb), dtype=np.uint8)
    blocks = raw.reshape(-1, f.block_bytes)
    for off in SCALE_OFFSETS[fmt]:
        blocks[:, off : off + 2] = _finite_f16_bits(rng, blocks.shape[0]).view(np.uint8).reshape(-1, 2)
    return raw


def as_tensor(fmt, raw, ncols):
    return Tensor("w", fmt, raw.shape[:-1] + (ncols,), raw)


def test_table():
    assert sorted(f.code for f in FORMATS.values()) == list(range(9))
    for name, gt in [("f32", 0), ("f16", 1), ("q4_0", 2), ("q4_1", 3), ("q5_0", 6), ("q8_0", 8),
                     ("q4_k", 12), ("q6_k", 14), ("bf16", 30)]:
        f = FORMATS[name]
        assert f.ggml_type == gt
        if f.block_elems > 1:  # same sizes as the gguf package
            assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(gt)] == (f.block_elems, f.block_bytes)
    assert row_bytes("q4_k", 512) == 288
    with pytest.raises(InputError):
        row_bytes("q4_k", 896)
    with pytest.raises(InputError):
        row_bytes("q3_k", 256)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dequantize_bit_exact_vs_gguf(fmt):
    f = FORMATS[fmt]
    ncols = 512
    raw = random_rows(fmt, 24, ncols, seed=f.code)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(f.ggml_type)).reshape(24, ncols)
    got = dequantize(as_tensor(fmt, raw, ncols))
    assert got.dtype == np.float32 and got.shape == (24, ncols)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_f16_every_bit_pattern():
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint8).reshape(1, -1)
    ref = raw.view(np.float16).astype(np.float32)
    assert np.array_equal(dequantize(as_tensor("f16", raw, 1 << 16)).view(np.uint32), ref.view(np.uint32))


def test_dequantize_3d_experts():
    raw = random_rows("q4_k", 6, 256).reshape(2, 3, 144)
    got = dequantize(Tensor("e", "q4_k", (2, 3, 256), raw))
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)
    assert got.shape == (2, 3, 256) and np.array_equal(got, ref)


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0"])
def test_quantize_roundtrip(fmt):
    w = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    raw = quantize(fmt, w)
    assert raw.shape == (4, row_bytes(fmt, 64)) and raw.dtype == np.uint8
    back = dequantize(as_tensor(fmt, raw, 64))
    assert np.abs(back - w).max() <= {"f32": 0, "f16": 2e-3, "bf16": 2e-2}.get(fmt, 0.25)


# ----------------------------------------------------------------- numba kernels


@pytest.fixture(scope="module")
def kernels():
    from fuelcli.kernels import quant

    return quant


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dequant_row_exact(kernels, fmt):
    f = FORMATS[fmt]
    ncols = 512
    raw = random_rows(fmt, 4, ncols, seed=10 + f.code)
    ref = dequantize(as_tensor(fmt, raw, ncols))
    out = np.empty(ncols, np.float32)
    for i in range(raw.shape[0]):
        kernels.dequant_row(f.code, raw[i], out)
        assert np.array_equal(out.view(np.uint32), ref[i].view(np.uint32)), (fmt, i)


def test_dequant_row_f16_every_bit_pattern(kernels):
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint8)
    out = np.empty(1 << 16, np.float32)
    kernels.dequant_row(FORMATS["f16"].code, raw, out)
    assert np.array_equal(out.view(np.uint32), raw.view(np.float16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dot_row_and_matvec(kernels, fmt):
    f = FORMATS[fmt]
    ncols = 768
    raw = random_rows(fmt, 8, ncols, seed=20 + f.code)
    w = dequantize(as_tensor(fmt, raw, ncols)).astype(np.float64)
    x = np.random.default_rng(3).standard_normal(ncols).astype(np.float32)
    ref = w @ x
    # relative to the magnitude of the terms: the sum itself may cancel
    tol = 1e-5 * (np.abs(w) @ np.abs(x))
    got = np.array([kernels.dot_row(f.code, raw[i], x) for i in range(raw.shape[0])])
    assert np.all(np.abs(got - ref) <= tol), (fmt, np.max(np.abs(got - ref) / tol))
    out = np.empty(raw.shape[0], np.float32)
    kernels.matvec(f.code, raw, x, out)
    assert np.all(np.abs(out - ref) <= tol)


@pytest.mark.parametrize("T", [1, 2, 5])
def test_tile_matmul(kernels, T):
    """The prefill micro-kernel: every row/token remainder (rows 0..6 of a 4-row block, odd T)."""
    K = 96
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, K)).astype(np.float32)
    tile = rng.standard_normal((8, K)).astype(np.float32)
    for nrows in range(8):
        out = np.full((T, 3 + nrows), np.nan, np.float32)
        kernels.tile_matmul(tile, nrows, x, out, 3)
        ref = x.astype(np.float64) @ tile[:nrows].astype(np.float64).T
        tol = 1e-5 * (np.abs(x) @ np.abs(tile[:nrows]).T)
        assert np.all(np.abs(out[:, 3:] - ref) <= tol)
        assert np.isnan(out[:, :3]).all()  # columns before n0 untouched


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q5_0", "q4_k", "q6_k"])
def test_matmul_prefill_and_decode(fmt):
    from fuelcli.kernels.cpu import ROWS_PER_TASK, matmul

    ncols, nrows = 512, 2 * ROWS_PER_TASK + 3  # a partial last task
    raw = random_rows(fmt, nrows, ncols, seed=40 + FORMATS[fmt].code)
    w = dequantize(as_tensor(fmt, raw, ncols)).astype(np.float64)
    x = np.random.default_rng(5).standard_normal((7, ncols)).astype(np.float32)
    ref = x @ w.T
    tol = 1e-5 * (np.abs(x) @ np.abs(w).T)
    out = np.empty((7, nrows), np.float32)
    matmul(x, raw, FORMATS[fmt].code, out)
    assert np.all(np.abs(out - ref) <= tol)
    out1 = np.empty((1, nrows), np.float32)
    matmul(x[2:3], raw, FORMATS[fmt].code, out1)
    assert np.all(np.abs(out1 - ref[2:3]) <= tol[2:3])
