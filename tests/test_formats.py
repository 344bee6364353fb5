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
from fuelcli.formats import FORMATS, dequantize, quantize, row_bytes
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
    from types import SimpleNamespace

    from fuelcli.backends.cpu import matmul, q16, rows

    return SimpleNamespace(dequant_row=rows.dequant_row, dot_row=rows.dot_row, matvec=rows.matvec,
                           tile_matmul=matmul.tile_matmul, quantize_x16=q16.quantize_x16,
                           dot_row_q16=q16.dot_row_q16, matvec_q16=q16.matvec_q16)


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
    from fuelcli.backends.cpu.matmul import ROWS_PER_TASK, matmul

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
    matmul(x[2:3], raw, FORMATS[fmt].code, out1, False)  # decode, f32 dot_row
    assert np.all(np.abs(out1 - ref[2:3]) <= tol[2:3])
    out1[:] = np.nan
    matmul(x[2:3], raw, FORMATS[fmt].code, out1)  # decode, int16 activations where available
    assert np.all(np.abs(out1 - ref[2:3]) <= Q16_REL_TOL * (np.abs(x[2:3]) @ np.abs(w).T))


# ----------------------------------------------------------------- int16-activation decode path

Q16_FMTS = ["q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k"]
# |x - xq*xs| <= xs/2 = amax/65534 per element, so |err| <= sum|w| * amax / 65534 (+ f32 sums):
# measured worst 1e-5 of sum|w*x| for normal x; heavy-tailed x with an outlier reaches ~1e-4
# (an outlier coarsens its block's step), and is checked against the rounding bound instead
Q16_REL_TOL = 1e-4


def _x_cases(K):
    rng = np.random.default_rng(7)
    normal = rng.standard_normal(K).astype(np.float32)
    heavy = rng.standard_t(2, K).astype(np.float32)  # outliers, as real activations have
    heavy[5] = 300.0
    normal[32:64] = 0.0  # an all-zero block (scale 0)
    return {"normal": normal, "heavy": heavy}


def test_quantize_x16(kernels):
    for x in _x_cases(512).values():
        xq = np.empty(512, np.int16)
        xs = np.empty(16, np.float32)
        xf = np.empty(16, np.float32)
        kernels.quantize_x16(x, xq, xs, xf)
        xb = x.reshape(16, 32).astype(np.float64)
        assert np.allclose(xs, np.abs(xb).max(1) / 32767, rtol=1e-6, atol=0)
        assert np.abs(xq).max() <= 32767
        err = np.abs(xq.reshape(16, 32) * xs[:, None].astype(np.float64) - xb)
        assert np.all(err <= xs[:, None] * (0.5 + 1e-3))
        assert np.allclose(xf, xb.sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", Q16_FMTS)
def test_dot_row_q16(kernels, fmt):
    f = FORMATS[fmt]
    ncols = 1024 if f.block_elems == 256 else 768
    raw = random_rows(fmt, 16, ncols, seed=60 + f.code)
    w = dequantize(as_tensor(fmt, raw, ncols)).astype(np.float64)
    mins = None
    if fmt in ("q4_1", "q4_k"):  # the per-block min term alone: all quants zeroed
        z = raw.copy().reshape(-1, f.block_bytes)
        z[:, 4 if fmt == "q4_1" else 16 :] = 0
        mins = dequantize(as_tensor(fmt, z.reshape(raw.shape), ncols)).astype(np.float64)
    xq = np.empty(ncols, np.int16)
    xs = np.empty(ncols // 32, np.float32)
    xf = np.empty(ncols // 32, np.float32)
    for name, x in _x_cases(ncols).items():
        kernels.quantize_x16(x, xq, xs, xf)
        got = np.array([kernels.dot_row_q16(f.code, raw[i], xq, xs, xf) for i in range(raw.shape[0])])
        mag = np.abs(w) @ np.abs(x)
        # against the int16 x it was given: only f32 scale products and sums differ (catches any
        # unpacking bug, which would be off by whole weights)
        # bug, which would be off by whole weights). The min terms of q4_1/q4_k use the f32 block
        # sums of x, so those parts of the reference take x itself.
        xd = (xq.reshape(-1, 32) * xs[:, None].astype(np.float64)).ravel()
        ref = w @ xd + (mins @ (x - xd) if mins is not None else 0.0)
        assert np.all(np.abs(got - ref) <= 1e-5 * mag), (fmt, name, np.max(np.abs(got - ref) / mag))
        # against the f32 x: within the rounding bound sum_j |w_j| * xs_b / 2 (+ f32 slack), and for
        # normal x within Q16_REL_TOL of sum|w*x|
        err = np.abs(got - w @ x)
        bound = np.abs(w) @ np.repeat(xs.astype(np.float64) / 2, 32)
        assert np.all(err <= bound + 1e-5 * mag), (fmt, name)
        rel = np.max(err / mag)
        print(f"q16 {fmt} {name}: max err / sum|w*x| = {rel:.2e}, / rounding bound = {np.max(err / bound):.2f}")
        if name == "normal":
            assert rel <= Q16_REL_TOL, (fmt, name, rel)
        out = np.empty(raw.shape[0], np.float32)
        kernels.matvec_q16(f.code, raw, x, out)
        assert np.array_equal(out, got.astype(np.float32))


def test_q16_fallbacks(tmp_path):
    """FUEL_NO_Q16=1 turns the path off in matmul; without AVX2 the row kernels emit portable IR
    instead of the x86 intrinsic and still agree with the AVX2 build."""
    import subprocess
    import sys

    code = """
import sys
import numpy as np
sys.path.insert(0, %(tests)r)
from test_formats import random_rows, Q16_FMTS
from fuelcli.formats import FORMATS
from fuelcli.backends.cpu import q16 as quant
assert not quant.Q16
assert not any(quant.q16_supported(FORMATS[f].code) for f in Q16_FMTS)
quant.HAVE_AVX2 = False  # read when the intrinsics are compiled
for fmt in Q16_FMTS:
    f = FORMATS[fmt]
    raw = random_rows(fmt, 5, 512, seed=1)
    x = np.random.default_rng(2).standard_normal(512).astype(np.float32)
    out = np.empty(5, np.float32)
    quant.matvec_q16(f.code, raw, x, out)
    print(fmt, *out.view(np.uint32))
"""
    env = dict(os.environ, FUEL_NO_Q16="1", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    tests = os.path.dirname(os.path.abspath(__file__))
    res = subprocess.run([sys.executable, "-c", code % {"tests": tests}], env=env, capture_output=True,
                         text=True, cwd=os.path.dirname(tests), timeout=600)
    assert res.returncode == 0, res.stderr
    from fuelcli.backends.cpu import q16 as quant

    lines = res.stdout.split("\n")
    for fmt, line in zip(Q16_FMTS, lines):
        f = FORMATS[fmt]
        raw = random_rows(fmt, 5, 512, seed=1)
        x = np.random.default_rng(2).standard_normal(512).astype(np.float32)
        out = np.empty(5, np.float32)
        quant.matvec_q16(f.code, raw, x, out)
        # same integer sums, same f32 operations: equal up to LLVM's choice of FMA contraction
        got = np.array(line.split()[1:], np.uint32).view(np.float32)
        assert line.split()[0] == fmt and np.allclose(got, out, rtol=1e-6, atol=1e-6 * np.abs(out).max())
