"""The AMX prefill kernels (backends/cpu/amx.py) against float64 numpy, on every block format.

Each activation and each decoded weight is split into bf16 high and low parts and three tile products
are summed in f32, so a product keeps ~2^-17 of each factor. Measured worst error over these cases:
5.9e-6 of sum|w*x| (q4_1), against AMX_REL_TOL = 2e-5 (the int16 path's is 1e-4: test_formats.py).
The negative control drops the low activation plane (bf16 activations): its error is ~1e-3, ~50x the
tolerance (the test asks 20x).
"""

import numpy as np
import pytest
from numba import njit

from fuelcli.backends.cpu import amx, llvm
from fuelcli.backends.cpu import matmul as M
from fuelcli.backends.cpu.activations import quantized
from fuelcli.formats import FORMATS
from tests.test_formats import as_tensor, dequantize, matmul, quantize_rows, random_rows

pytestmark = pytest.mark.skipif(not amx.available(llvm.host_isa()), reason="no AMX (or FUEL_AMX=0) here")
AMX_REL_TOL = 2e-5
QUANT = [f for f in FORMATS if FORMATS[f].block_elems >= 32]


@njit(cache=True)
def split_rows(x, planes, core):
    M.split_rows(x, planes, core)


def _tables(fmt):
    isa = llvm.host_isa()
    return M.kernel_table([FORMATS[fmt].code], isa, True), M.core_table(isa, 64, True)


def _planes(x, core, garbage=0x7FC0):
    """The split of x, with NaN bits in the padding rows a tile reads past T (they must not matter)."""
    T, K = x.shape
    planes = np.full(2 * (-(-T // amx.TILE) * amx.TILE) * (-(-K // 32) * 32), garbage, np.int16)
    split_rows(x, planes, core)
    return planes


def _matmul(x, planes, raw, fmt, kern):
    out = np.full((x.shape[0], raw.shape[0]), np.nan, np.float32)
    qx = quantized(1, 32)._replace(xq=planes)
    matmul(x, qx, raw.ctypes.data, raw.shape[0], raw.shape[1], FORMATS[fmt].code, kern, out)
    return out


def _cases(fmt):
    """(K, rows, tokens): chunks of k and a partial one; a partial last task, quad and lane group, an
    empty second quad; token tails of every kind (from amx.AMX_MIN_TOKENS: fewer take the vector
    kernels)."""
    kca, t0 = amx.KCA, amx.AMX_MIN_TOKENS
    k = kca * 2 + max(FORMATS[fmt].block_elems, 64)
    return [(k, amx.ROWS + 21, t0 + 30), (kca, 64, t0), (512, 85, t0 + 49), (256, amx.ROWS + 2, t0 + 17)]


@pytest.mark.parametrize("fmt", QUANT)
def test_amx_prefill(fmt):
    kern, core = _tables(fmt)
    rng = np.random.default_rng(FORMATS[fmt].code)
    for K, rows, T in _cases(fmt):
        raw = random_rows(fmt, rows, K, seed=FORMATS[fmt].code + K)
        w = dequantize(as_tensor(fmt, raw, K)).astype(np.float64)
        x = rng.standard_normal((T, K)).astype(np.float32)
        x[1, 7] = 300.0  # an outlier: each element is split on its own, so it coarsens nothing else
        got = _matmul(x, _planes(x, core), raw, fmt, kern).astype(np.float64)
        rel = np.abs(got - x @ w.T) / (np.abs(x) @ np.abs(w).T)
        print(f"amx {fmt} K={K} rows={rows} T={T}: max err / sum|w*x| = {rel.max():.2e}")
        assert rel.max() <= AMX_REL_TOL, (fmt, K, rows, T)


def test_amx_low_plane_matters():
    """Negative control: bf16 activations alone (the low plane zeroed) miss the tolerance."""
    fmt, K, rows, T = "q8_0", 512, 64, amx.AMX_MIN_TOKENS
    kern, core = _tables(fmt)
    raw = random_rows(fmt, rows, K, seed=3)
    w = dequantize(as_tensor(fmt, raw, K)).astype(np.float64)
    x = np.random.default_rng(3).standard_normal((T, K)).astype(np.float32)
    planes = _planes(x, core)
    planes[planes.size // 2:] = 0
    got = _matmul(x, planes, raw, fmt, kern).astype(np.float64)
    rel = np.abs(got - x @ w.T) / (np.abs(x) @ np.abs(w).T)
    assert rel.max() > 20 * AMX_REL_TOL, rel.max()


def test_float_formats_keep_f32_products():
    """f32/f16/bf16 weights never take the AMX path (its ~2^-17 per product is the block formats'
    precision, not float weights'): their prefill is the vector driver, fed x itself."""
    isa = llvm.host_isa()
    codes = [FORMATS[f].code for f in ("f32", "f16", "bf16", "q8_0")]
    kern, vec = M.kernel_table(codes, isa, True), M.kernel_table(codes, isa, False)
    for code in codes[:3]:
        assert kern[code, M.K_AMX_PREFILL] == 0 and (kern[code] == vec[code]).all()
    q8 = codes[3]
    assert kern[q8, M.K_AMX_PREFILL] != 0 and (kern[q8, :M.K_AMX_PREFILL] == vec[q8, :M.K_AMX_PREFILL]).all()


def test_short_inputs_take_the_vector_kernels():
    """Below AMX_MIN_TOKENS a block format's prefill is the int16 vector path (matmul_task), whose
    result differs from the AMX one by its int16 rounding; from AMX_MIN_TOKENS on it is the tiles'."""
    fmt, K, rows = "q8_0", 512, 64
    kern, core = _tables(fmt)
    raw = random_rows(fmt, rows, K, seed=4)
    x = np.random.default_rng(4).standard_normal((amx.AMX_MIN_TOKENS, K)).astype(np.float32)
    short = x[:amx.AMX_MIN_TOKENS - 1]
    qx = quantized(*x.shape)
    quantize_rows(short, qx, core)
    out = np.empty((short.shape[0], rows), np.float32)
    matmul(short, qx, raw.ctypes.data, rows, raw.shape[1], FORMATS[fmt].code, kern, out)
    vec = M.kernel_table([FORMATS[fmt].code], llvm.host_isa(), False)
    ref = np.empty_like(out)
    matmul(short, qx, raw.ctypes.data, rows, raw.shape[1], FORMATS[fmt].code, vec, ref)
    assert np.array_equal(out, ref)
    tiles = _matmul(x, _planes(x, core), raw, fmt, kern)
    assert not np.array_equal(tiles[:-1], ref)


def test_split_planes():
    """The high and low parts rebuild x within 2^-17 of each element, zeros past K, in tile order."""
    _, core = _tables("f32")
    T, K = 19, 70
    x = np.random.default_rng(0).standard_normal((T, K)).astype(np.float32) * np.float32(1e3)
    planes = _planes(x, core, garbage=0)
    Tp, Kp = 32, 96

    def plane(p):  # [t/16][k/32][t%16][32] -> [Tp, Kp] as f32
        bits = planes[p * Tp * Kp:(p + 1) * Tp * Kp].view(np.uint16).reshape(Tp // 16, Kp // 32, 16, 32)
        return (bits.transpose(0, 2, 1, 3).reshape(Tp, Kp).astype(np.uint32) << 16).view(np.float32)

    hi, lo = plane(0), plane(1)
    assert np.all(hi[:T, K:] == 0) and np.all(lo[:T, K:] == 0)
    whole = hi[:T, :K].astype(np.float64) + lo[:T, :K]
    assert np.all(np.abs(whole - x) <= 2.0 ** -17 * np.abs(x))
    assert np.all(np.abs(hi[:T, :K] - x) <= 2.0 ** -8 * np.abs(x))  # the high part alone is bf16


def test_amx_nonfinite_reaches_its_token_only():
    """A NaN or inf activation makes its token's outputs NaN (inf - inf in the split), no other's."""
    fmt, K, rows, T = "q4_k", 256, 64, amx.AMX_MIN_TOKENS + 20
    kern, core = _tables(fmt)
    raw = random_rows(fmt, rows, K, seed=9)
    x = np.random.default_rng(9).standard_normal((T, K)).astype(np.float32)
    x[2, 5], x[T - 3, 100] = np.nan, np.inf
    got = _matmul(x, _planes(x, core), raw, fmt, kern)
    assert np.isnan(got[[2, T - 3]]).all()
    assert np.isfinite(np.delete(got, [2, T - 3], axis=0)).all()
