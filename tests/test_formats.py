"""Weight formats: numpy dequantize == gguf.quants bit for bit; the CPU kernels (every instruction
set this machine runs) against the numpy decode."""

from __future__ import annotations

import os

# one numba cache per xdist worker: concurrent cache writers can crash (numba #4807)
os.environ.setdefault("NUMBA_CACHE_DIR", f"/tmp/numba_cache_fuel_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")

import gguf
import gguf.quants
import numpy as np
import pytest

from fuelcli.errors import InputError
from fuelcli.formats import BY_GGML_TYPE, FORMATS, GGML_TYPE_NAMES, dequantize, quantize, row_bytes
from fuelcli.weights.tensor import Tensor

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
    for off in f.f16_fields:  # random bytes there could be inf/NaN
        blocks[:, off : off + 2] = _finite_f16_bits(rng, blocks.shape[0]).view(np.uint8).reshape(-1, 2)
    if hasattr(f.layout, "e"):  # an E8M0 exponent (mxfp4): 2^-24 .. 2^16, as the f16 scales' range
        blocks[:, f.layout.e] = rng.integers(104, 145, blocks.shape[0])
    if fmt == "iq1_m":  # its f16 d is the top nibbles of its 4 scale words (d's bits 4k.. in word k)
        at = slice(f.layout.scales, f.layout.scales + 8)
        sc = np.ascontiguousarray(blocks[:, at]).view(np.uint16)
        d = _finite_f16_bits(rng, blocks.shape[0])[:, None] >> np.array([0, 4, 8, 12], np.uint16)
        blocks[:, at] = ((sc & 0x0FFF) | ((d & 15) << 12)).astype(np.uint16).view(np.uint8)
    return raw


def as_tensor(fmt, raw, ncols):
    return Tensor("w", fmt, raw.shape[:-1] + (ncols,), raw)


def test_table():
    assert sorted(f.code for f in FORMATS.values()) == list(range(len(FORMATS)))
    for f in FORMATS.values():  # ggml's type id, name and sizes, as the gguf package has them
        gt = gguf.GGMLQuantizationType(f.ggml_type)
        assert gt.name.lower() == f.name
        assert gguf.GGML_QUANT_SIZES[gt] == (f.block_elems, f.block_bytes)
    assert row_bytes("q4_k", 512) == 288
    with pytest.raises(InputError):
        row_bytes("q4_k", 896)
    unread = min(t for t in GGML_TYPE_NAMES if t not in BY_GGML_TYPE)  # a type fuel does not read (Q8_1)
    with pytest.raises(InputError):
        row_bytes(GGML_TYPE_NAMES[unread].lower(), 256)


def test_iq_grids_as_gguf_py():
    """iq_grids.py's tables (ggml-common.h's) against gguf-py's copies, which its decode reads (hex
    of 2-bit indices there): every entry's bytes. Negative control: two entries swapped differ."""
    from fuelcli.formats import iq_grids

    Q = gguf.quants
    for cls, name in ((Q.IQ3_XXS, "IQ3XXS_GRID"), (Q.IQ3_S, "IQ3S_GRID"), (Q.IQ2_XXS, "IQ2XXS_GRID"),
                      (Q.IQ2_XS, "IQ2XS_GRID"), (Q.IQ2_S, "IQ2S_GRID"), (Q.IQ1_S, "IQ1S_GRID")):
        cls.init_grid()
        want = cls.grid.reshape(cls.grid_shape).astype(np.int8)  # iq1s: -1, 0, 1
        entries = getattr(iq_grids, name)
        dtype = "<u4" if cls.grid_shape[1] == 4 else "<u8"
        got = np.array(entries, dtype).view(np.int8).reshape(cls.grid_shape)
        assert np.array_equal(got, want), name
        swapped = np.array(entries[1:2] + entries[0:1] + entries[2:], dtype).view(np.int8).reshape(cls.grid_shape)
        assert not np.array_equal(swapped, want)
    assert bytes(iq_grids.KSIGNS) == Q.IQ2_XXS.ksigns


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


def _every_e8m0(fmt):
    """A block of fmt per E8M0 exponent 0..255 (subnormal, huge and overflowing scales), random values."""
    f = FORMATS[fmt]
    raw = random_rows(fmt, 256, f.block_elems, seed=3)
    raw[:, f.layout.e] = np.arange(256)
    return raw


def test_mxfp4_every_exponent():
    """Every E8M0 byte, bit for bit as gguf-py (e < 2: subnormal scales; past 2^127 / 12: inf)."""
    raw = _every_e8m0("mxfp4")
    with np.errstate(over="ignore"):
        ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4)
        got = dequantize(as_tensor("mxfp4", raw, 32))
    assert np.isinf(ref).any() and ((ref != 0) & (np.abs(ref) < np.finfo(np.float32).tiny)).any()  # subnormals
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_dequantize_3d_experts():
    raw = random_rows("q4_k", 6, 256).reshape(2, 3, 144)
    got = dequantize(Tensor("e", "q4_k", (2, 3, 256), raw))
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)
    assert got.shape == (2, 3, 256) and np.array_equal(got, ref)


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_quantize_roundtrip(fmt):
    w = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    raw = quantize(fmt, w)
    assert raw.shape == (4, row_bytes(fmt, 64)) and raw.dtype == np.uint8
    back = dequantize(as_tensor(fmt, raw, 64))
    assert np.abs(back - w).max() <= {"f32": 0, "f16": 2e-3, "bf16": 2e-2}.get(fmt, 0.25)


# ----------------------------------------------------------------- CPU kernels, every ISA

from numba import njit  # noqa: E402

from fuelcli.backends.cpu import llvm  # noqa: E402
from fuelcli.backends.cpu import matmul as M  # noqa: E402
from fuelcli.backends.cpu.activations import quantized  # noqa: E402
from fuelcli.backends.cpu.core import Q_MAX  # noqa: E402
from fuelcli.backends.cpu.attention import MAX_SPLITS, part_stride  # noqa: E402
from fuelcli.backends.cpu.unpack import record  # noqa: E402

# the kernels' numba entry points are helpers only jitted code calls (jit.helper): jit them here


@njit(cache=True)
def quantize_rows(x, qx, core):
    M.quantize_rows(x, qx, core)


@njit(cache=True)
def quantize_for(x, qx, core, n_dec):
    M.quantize_for(x, qx, core, n_dec)


@njit(cache=True)
def matmul(x, qx, w_addr, n_rows, row_bytes, code, kern, out):
    M.matmul(x, qx, w_addr, n_rows, row_bytes, code, kern, out)


@njit(cache=True)
def decode_rows(x, qx, w_addr, n_rows, row_bytes, code, kern, core, out, n_dec, desc, ddesc):
    """x's first n_dec rows on the decode kernels (the forward's way: describe_product, batch)."""
    M.batch(desc, M.describe_product(desc, 0, x, qx, w_addr, n_rows, row_bytes, code, kern, core, M.ptr(out), n_dec,
                                     ddesc), core, x.shape[0] > n_dec)


@njit(cache=True)
def dequant_row(kern, code, row_addr, K, out):
    M.dequant_row(kern, code, row_addr, K, out)


@njit(cache=True)
def glu(gate, up, act, core):
    M.glu(gate, up, act, core)


@njit(cache=True)
def attention(q, k_cache, v_cache, pos0, window, n_heads, n_kv, out, part, core):
    M.attention(q, k_cache, v_cache, pos0, window, n_heads, n_kv, out, part, core)

ISAS = [pytest.param(n, marks=pytest.mark.skipif(not llvm.supported(n), reason=f"CPU lacks {n}")) for n in llvm.ISAS]
# without AVX-512 VNNI its kernels' logic (the planes decode, 16 lanes) still runs, its dots as portable IR
EMULATED = "avx512vnni-emulated"
ISAS += [EMULATED] * (not llvm.supported("avx512vnni"))


def _isa(name):
    return llvm.emulated("avx512vnni") if name == EMULATED else llvm.ISAS[name]
QUANT = [f for f in FORMATS if record(FORMATS[f].code).quant]
FLOATS = [f for f in FORMATS if f not in QUANT]
# int16 activations: |x - xq*xs| <= xs/2 = amax/65278 per element, so |err| <= sum|w| * amax / 65534 (+ f32
# sums): measured worst 1e-5 of sum|w*x| for normal x; heavy-tailed x with an outlier reaches ~1e-4 (an
# outlier coarsens its block's step) and is checked against the rounding bound instead
Q16_REL_TOL = 1e-4
F32_REL_TOL = 1e-5  # float formats: f32 products, only the summation order differs


def _kern(isa_name, fmts):
    isa = _isa(isa_name)
    return M.kernel_table([FORMATS[f].code for f in fmts], isa), M.core_table(isa, 64)


def _x_cases(K):
    rng = np.random.default_rng(7)
    normal = rng.standard_normal(K).astype(np.float32)
    heavy = rng.standard_t(2, K).astype(np.float32)  # outliers, as real activations have
    heavy[5] = 300.0
    normal[32:64] = 0.0  # an all-zero block (scale 0)
    return {"normal": normal, "heavy": heavy}


def _prepared(x, core):
    """x prepared for the block-format kernels (forward.prepare), in buffers of exactly its size."""
    qx = quantized(*x.shape)
    if x.shape[1] % 32 == 0:
        quantize_rows(x, qx, core)
    return qx


def _quantized(x, core):
    """(xq, xs, xf) of x: its int16 quantisation."""
    qx = _prepared(x, core)
    return qx.xq, qx.xs, qx.xf


def _matmul(x, raw, fmt, kern, core):
    out = np.full((x.shape[0], raw.shape[0]), np.nan, np.float32)
    matmul(x, _prepared(x, core), raw.ctypes.data, raw.shape[0], raw.shape[1], FORMATS[fmt].code, kern, out)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dequant_kernel_exact(isa, fmt):
    f = FORMATS[fmt]
    ncols = 512
    raw = random_rows(fmt, 4, ncols, seed=10 + f.code)
    ref = dequantize(as_tensor(fmt, raw, ncols))
    kern, _ = _kern(isa, [fmt])
    out = np.empty(ncols, np.float32)
    for i in range(raw.shape[0]):
        dequant_row(kern, f.code, raw[i].ctypes.data, ncols, out)
        assert np.array_equal(out.view(np.uint32), ref[i].view(np.uint32)), (fmt, i)


def test_dequant_kernel_mxfp4_every_exponent():
    """The CPU's exact decode of every E8M0 byte: the subnormal scales are not flushed to zero."""
    raw = _every_e8m0("mxfp4").reshape(1, -1)
    with np.errstate(over="ignore"):
        ref = dequantize(as_tensor("mxfp4", raw, 32 * 256))
    kern, _ = _kern(llvm.host_isa().name, ["mxfp4"])
    out = np.empty(32 * 256, np.float32)
    dequant_row(kern, FORMATS["mxfp4"].code, raw.ctypes.data, 32 * 256, out)
    assert ((out != 0) & (np.abs(out) < np.finfo(np.float32).tiny)).any()
    assert np.array_equal(out.view(np.uint32), ref.reshape(-1).view(np.uint32))


def test_dequant_kernel_f16_every_bit_pattern():
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.uint8)
    out = np.empty(1 << 16, np.float32)
    kern, _ = _kern(llvm.host_isa().name, ["f16"])
    dequant_row(kern, FORMATS["f16"].code, raw.ctypes.data, 1 << 16, out)
    assert np.array_equal(out.view(np.uint32), raw.view(np.float16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_rows(isa):
    _, core = _kern(isa, [])
    cases = _x_cases(512)
    x = np.stack([cases["normal"], cases["heavy"]])
    xq, xs, xf = _quantized(x, core)
    xb = x.reshape(2, 16, 32).astype(np.float64)
    xs, xf, xq = xs.reshape(2, 16), xf.reshape(2, 16), xq.reshape(2, 16, 32)
    assert np.allclose(xs, np.abs(xb).max(-1) / Q_MAX, rtol=1e-6, atol=0)
    assert np.abs(xq.astype(np.int32)).max() == Q_MAX
    err = np.abs(xq * xs[..., None].astype(np.float64) - xb)
    assert np.all(err <= xs[..., None] * (0.5 + 1e-3))
    assert np.allclose(xf, xb.sum(-1), rtol=1e-5, atol=1e-5)
    # round half to even, as np.rint: the block max maps to exactly Q_MAX, halves go to even
    t = np.zeros((1, 32), np.float32)
    t[0, :4] = [Q_MAX, 0.5, 1.5, -2.5]
    q, s, _ = _quantized(t, core)
    assert s[0] == np.float32(1.0) and list(q[:4]) == [Q_MAX, 0, 2, -2]


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_one_token_layout(isa):
    """One token also gets the layout its decode kernels read: on an ISA with the int8 planes,
    xq = 256 * hi + lo with both int8, then both planes again in the K-quants' layout (each
    256-element block's 4-element pieces transposed: unit u, lane i holds elements 16i + 4u ..
    16i + 4u + 3) for each full 256-element block of K; elsewhere xq as words, each 32-block's even
    elements then its odd ones. Every row gets the 16-element sums of xq (q2_k's prefill reads
    them). Negative controls: more rows, no layout written; K = 288, the K-quant layout of its first
    256 elements only."""
    _, core = _kern(isa, [])
    x = np.stack(list(_x_cases(512).values()))
    x[1, 64:96] = -x[1, 64:96].max()  # a block whose most negative value is its largest magnitude
    qx = _prepared(x[1:], core)
    xq = qx.xq.astype(np.int32)
    assert xq.min() == -Q_MAX
    if llvm.planes_isa(_isa(isa)):
        hi, lo = qx.xp[:512].astype(np.int32), qx.xp[512:1024].astype(np.int32)
        assert np.array_equal(256 * hi + lo, xq)
        k_layout = lambda plane: plane.reshape(-1, 16, 4, 4).transpose(0, 2, 1, 3).ravel()  # noqa: E731
        assert np.array_equal(qx.xp[1024:1536], k_layout(qx.xp[:512]))
        assert np.array_equal(qx.xp[1536:2048], k_layout(qx.xp[512:1024]))
        assert not np.array_equal(qx.xp[1024:1536], qx.xp[:512])
        short = _prepared(x[1:, :288], core)
        sp = short.xp.astype(np.int32)
        assert np.array_equal(256 * sp[:288] + sp[288:576], short.xq.astype(np.int32))
        for p in range(2):  # hi, lo: the first block's K-quant layout, then nothing
            at = 576 + 288 * p
            assert np.array_equal(short.xp[at:at + 256], k_layout(short.xp[288 * p:288 * p + 256]))
            assert not short.xp[at + 256:at + 288].any()
        assert not short.xp[1152:].any()
    else:
        words = qx.xp[:1024].view(np.int16).reshape(-1, 2, 16)
        blocks = xq.reshape(-1, 16, 2)
        assert np.array_equal(words[:, 0], blocks[..., 0]) and np.array_equal(words[:, 1], blocks[..., 1])
    assert np.array_equal(qx.xz, xq.reshape(-1, 16).sum(-1).astype(np.float32))
    many = _prepared(x, core)
    assert not many.xp.any()
    assert np.array_equal(many.xz, many.xq.astype(np.int32).reshape(-1, 16).sum(-1).astype(np.float32))


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_rows_non_finite(isa):
    """A block with inf or NaN gets a NaN scale, so a product with it is NaN, not a finite guess."""
    _, core = _kern(isa, [])
    x = np.ones((1, 96), np.float32)
    x[0, 3], x[0, 40] = np.nan, np.inf
    _, xs, _ = _quantized(x, core)
    assert np.isnan(xs[0]) and np.isnan(xs[1]) and xs[2] == np.float32(1 / Q_MAX)


def _check_q16(got, w, x, xq_xs, mins, name, fmt):
    """got: int16-path dot products of rows w (f64, dequantised) with x; xq_xs: x as quantised."""
    mag = np.abs(w) @ np.abs(x)
    ref = w @ xq_xs + (mins @ (x - xq_xs) if mins is not None else 0.0)
    # against the int16 x it was given: only f32 scale products and sums differ (catches any
    # unpacking bug, which would be off by whole weights). The min terms of q4_1/q4_k use the f32
    # block sums of x, so those parts of the reference take x itself.
    assert np.all(np.abs(got - ref) <= 1e-5 * mag), (fmt, name, np.max(np.abs(got - ref) / mag))
    err = np.abs(got - w @ x)
    return err / mag


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", QUANT)
def test_decode_int16(isa, fmt):
    """One token (the decode kernels): int16 activations against the numpy decode."""
    f = FORMATS[fmt]
    # K-quants: 4 blocks; 32-element formats: 29 blocks, three of the words kernels' chunks of 8
    # (unpack.WORD_CHUNK), one of 4 and one more
    ncols = 1024 if f.block_elems == 256 else 928
    raw = random_rows(fmt, 40, ncols, seed=60 + f.code)  # 40 rows: several tasks, a partial one
    w = dequantize(as_tensor(fmt, raw, ncols)).astype(np.float64)
    mins = None
    if record(f.code).has_min:  # the per-block min term alone: all quants (qh, qs: the block's end) zeroed
        z = raw.copy().reshape(-1, f.block_bytes)
        z[:, min(getattr(f.layout, n) for n in ("qh", "qs") if hasattr(f.layout, n)):] = 0
        mins = dequantize(as_tensor(fmt, z.reshape(raw.shape), ncols)).astype(np.float64)
    kern, core = _kern(isa, [fmt])
    for name, x in _x_cases(ncols).items():
        got = _matmul(x[None], raw, fmt, kern, core)[0].astype(np.float64)
        xq, xs, _ = _quantized(x[None], core)
        xd = (xq.reshape(-1, 32) * xs[:, None].astype(np.float64)).ravel()
        rel = _check_q16(got, w, x, xd, mins, name, fmt)
        # against the f32 x: within the rounding bound sum_j |w_j| * xs_b / 2 (+ f32 slack), and for
        # normal x within Q16_REL_TOL of sum|w*x|
        bound = np.abs(w) @ np.repeat(xs.astype(np.float64) / 2, 32)
        assert np.all(np.abs(got - w @ x) <= bound + 1e-5 * (np.abs(w) @ np.abs(x))), (fmt, name)
        print(f"{isa} decode {fmt} {name}: max err / sum|w*x| = {rel.max():.2e}")
        if name == "normal":
            assert rel.max() <= Q16_REL_TOL, (fmt, name, rel.max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", QUANT)
def test_prefill_int16(isa, fmt):
    """Many tokens (the panel kernels): every token-tile remainder, a partial last lane group and a
    partial last task, several k chunks and a partial one; same bounds as one token."""
    from fuelcli.backends.cpu.kernels_prefill import KC, TASK_ROWS

    f = FORMATS[fmt]
    ncols = KC * 2 + max(f.block_elems, 64)  # two full chunks of k and a partial one
    nrows = TASK_ROWS + 21
    raw = random_rows(fmt, nrows, ncols, seed=40 + f.code)
    w = dequantize(as_tensor(fmt, raw, ncols)).astype(np.float64)
    kern, core = _kern(isa, [fmt])
    rng = np.random.default_rng(5)
    for T in (2, 13, 30):
        x = rng.standard_normal((T, ncols)).astype(np.float32)
        x[1, 40] = 200.0  # an outlier block
        got = _matmul(x, raw, fmt, kern, core).astype(np.float64)
        assert not np.isnan(got).any()
        xq, xs, _ = _quantized(x, core)
        xd = (xq.reshape(-1, 32) * xs[:, None].astype(np.float64)).reshape(T, ncols)
        bound = np.repeat(xs.reshape(T, -1).astype(np.float64) / 2, 32, axis=1) @ np.abs(w).T
        mag = np.abs(x) @ np.abs(w).T
        err = np.abs(got - x @ w.T)
        assert np.all(err <= bound + 1e-5 * mag), (fmt, T)
        if not record(f.code).has_min:  # exact integer part: only f32 rounding from the int16 x
            assert np.all(np.abs(got - xd @ w.T) <= 1e-5 * mag), (fmt, T)
        normal = np.ones(T, bool)
        normal[1] = False
        assert (err / mag)[normal].max() <= Q16_REL_TOL, (fmt, T)
        # one token at a time through the decode kernel: the same integers, the same answer
        one = _matmul(x[3:4] if T > 3 else x[:1], raw, fmt, kern, core).astype(np.float64)
        assert np.allclose(one, got[3:4] if T > 3 else got[:1], rtol=0, atol=1e-5 * mag.max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_wide_decode_is_one_token_decode(isa, fmt):
    """The B-wide decode kernels (a weight row unpacked once for kernels.DECODE_WIDTHS tokens) give
    each token the one-token kernel's result bit for bit: 2 and 4 tokens, 7 as 4 + 2 + 1 (a float
    format: 2 + 2 + 2 + 1) interleaved, against the same tokens each on the one-token kernel; 41
    rows (a partial task, an odd row for the planes kernels' pairs), the words kernels' chunks of
    8, 4 and 1 blocks, a float row's last K % 32 elements. Negative control: the same tokens on the
    tile kernels (their sums in another order) differ in the last bits, so equality is not what
    any correct kernel gives."""
    from fuelcli.backends.cpu.kernels_decode import DECODE_WIDTHS, wide_widths

    f = FORMATS[fmt]
    ncols = 1024 if f.block_elems == 256 else 928 if f.block_elems == 32 else 301
    nrows = 41
    raw = np.ascontiguousarray(random_rows(fmt, nrows, ncols, seed=80 + f.code))
    one, core = _kern(isa, [fmt])
    wide = one.copy()
    M.add_wide(wide, [f.code], _isa(isa))
    assert [B for i, B in enumerate(DECODE_WIDTHS) if wide[f.code, M.K_WIDE + i]] == list(wide_widths(f.code))
    assert not one[f.code, M.K_WIDE:].any()
    cases = _x_cases(ncols)
    rng = np.random.default_rng(9)
    x = np.stack([cases["normal"], cases["heavy"]] + [rng.standard_normal(ncols).astype(np.float32) for _ in range(5)])
    desc, ddesc = np.zeros((M.DESC_ROWS, M.DESC_COLS), np.int64), np.zeros((len(x), M.DESC_COLS), np.int64)

    def decode(kern, n):
        qx = quantized(n, ncols, tokens=n)
        if record(f.code).quant:
            quantize_for(x[:n], qx, core, n)
        out = np.full((n, nrows), np.nan, np.float32)
        decode_rows(x[:n], qx, raw.ctypes.data, nrows, raw.shape[1], f.code, kern, core, out, n, desc, ddesc)
        return out

    for n in (2, 4, 7):
        ref = decode(one, n)
        assert not np.isnan(ref).any()
        assert np.array_equal(decode(wide, n).view(np.uint32), ref.view(np.uint32)), (fmt, n)
    tiled = _matmul(x, raw, fmt, one, core)
    assert not np.array_equal(tiled, ref)
    assert np.allclose(tiled, ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FLOATS)
def test_float_formats(isa, fmt):
    """Float weights: f32 FMAs on the decoded rows, one token and many, K not a multiple of a vector."""
    f = FORMATS[fmt]
    kern, core = _kern(isa, [fmt])
    rng = np.random.default_rng(f.code)
    # (301, 77, 29): k chunks ending in an element past a multiple of 4, a last task of 13 rows (two
    # groups of 8, partly valid), token tiles of 6 and a remainder of 5
    for ncols, nrows, T in ((300, 70, 1), (300, 70, 29), (301, 77, 29), (64, 5, 3), (1000, 17, 1)):
        raw = random_rows(fmt, nrows, ncols, seed=f.code)
        w = dequantize(as_tensor(fmt, raw, ncols)).astype(np.float64)
        x = rng.standard_normal((T, ncols)).astype(np.float32)
        got = _matmul(x, raw, fmt, kern, core)
        assert np.all(np.abs(got - x @ w.T) <= F32_REL_TOL * (np.abs(x) @ np.abs(w).T)), (fmt, ncols, T)


@pytest.mark.parametrize("fmt", FLOATS)
def test_float_prefill_assembly(fmt):
    """The AVX2 f32 tile (inline assembly, 16 rows at a time) gives the IR tile's sums bit for bit:
    15 rows take the IR tile (rows past the matrix), 16 the assembly; its second group of 8 rows
    gives what its first gives for the same weights. Negative control: the same float32 products
    summed in another order (numpy's) differ in the last bits, so equality is not trivial."""
    if not llvm.supported("avx2"):
        pytest.skip("CPU lacks avx2")
    kern, core = _kern("avx2", [fmt])
    rng = np.random.default_rng(11)
    raw = random_rows(fmt, 16, 301, seed=3)
    x = rng.standard_normal((12, 301)).astype(np.float32)
    asm = _matmul(x, raw, fmt, kern, core)
    assert np.array_equal(asm[:, :15], _matmul(x, np.ascontiguousarray(raw[:15]), fmt, kern, core))
    swapped = _matmul(x, np.ascontiguousarray(np.concatenate([raw[8:], raw[:8]])), fmt, kern, core)
    assert np.array_equal(swapped[:, 8:], asm[:, :8])
    w = dequantize(as_tensor(fmt, raw, 301)).astype(np.float32)
    other_order = x @ w.T  # float32 too, summed in BLAS's order
    assert not np.array_equal(other_order, asm)
    assert np.all(np.abs(other_order - asm) <= F32_REL_TOL * (np.abs(x) @ np.abs(w).T))


def _silu64(g):
    return g / (1 + np.exp(-g))


def _gelu_tanh64(g):
    """0.5 g (1 + tanh y) written as g * sigmoid(2y): the same function, without float64's
    cancellation in 1 + tanh y deep in the negative tail."""
    y = np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)
    with np.errstate(over="ignore"):
        return g / (1 + np.exp(-2 * y))


GLU_ACTS = {M.ACT_SILU: _silu64, M.ACT_GELU_TANH: _gelu_tanh64}


@pytest.mark.parametrize("act", list(GLU_ACTS))
@pytest.mark.parametrize("isa", ISAS)
def test_glu(isa, act):
    """act(gate) * up against float64: within 1e-6 relative, plus for gelu_tanh float32's rounding of
    the exponential's argument 2y, 6e-8 |2y| relative (measured up to 1.2e-5 relative at 2y ~ -40,
    values of 1e-17); the other activation's reference is far off (negative control)."""
    _, core = _kern(isa, [])
    rng = np.random.default_rng(0)
    for n in (128, 100):  # a vector tail
        g = (rng.standard_normal((3, n)) * 8).astype(np.float32)
        g[0, :4] = [-100.0, 100.0, 0.0, -0.0]
        u = rng.standard_normal((3, n)).astype(np.float32)
        g64 = g.astype(np.float64)
        ref, other = GLU_ACTS[act](g64) * u, GLU_ACTS[1 - act](g64) * u
        arg = np.abs(2 * np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64 ** 3)) if act == M.ACT_GELU_TANH else 0
        glu(g, u, act, core)
        assert np.all(np.abs(g - ref) <= (1e-6 + 1e-7 * arg) * np.abs(ref) + 1e-30)
        assert not np.allclose(g, other, rtol=1e-3, atol=1e-3)


@njit(cache=True)
def clamped_glu(gate, up, limit_bits, alpha_bits, core):
    M.clamped_glu(gate, up, limit_bits, alpha_bits, core)


def _f32_bits(x):
    return int(np.float32(x).view(np.int32))


@pytest.mark.parametrize("isa", ISAS)
def test_clamped_glu(isa):
    """gpt-oss's clamped SwiGLU, (clip(up, ±limit) + 1) · g · sigmoid(alpha g) with g = min(gate,
    limit), against float64 within 1e-6 relative plus, as test_glu's, float32's rounding of the
    exponential's argument alpha g, 6e-8 |alpha g| relative (values on both sides of both clamps); a
    NaN gate or up gives NaN (torch's min and clamp keep it). Negative control: without the clamps it
    is far off."""
    _, core = _kern(isa, [])
    rng = np.random.default_rng(3)
    limit, alpha = 7.0, 1.702
    for n in (128, 100):  # a vector tail
        g = (rng.standard_normal((3, n)) * 8).astype(np.float32)
        u = (rng.standard_normal((3, n)) * 8).astype(np.float32)
        g[0, :3], u[1, :2] = [-100.0, 100.0, np.nan], [np.nan, -50.0]
        g64, u64 = g.astype(np.float64), u.astype(np.float64)
        gl = np.minimum(g64, limit)
        ref = (np.clip(u64, -limit, limit) + 1) * gl / (1 + np.exp(-float(np.float32(alpha)) * gl))
        unclamped = (u64 + 1) * g64 / (1 + np.exp(-alpha * g64))
        clamped_glu(g, u, _f32_bits(limit), _f32_bits(alpha), core)
        nan = np.isnan(ref)
        assert nan.sum() == 2 and np.isnan(g[nan]).all()
        arg = np.abs(alpha * gl[~nan])
        assert np.all(np.abs(g[~nan] - ref[~nan]) <= (1e-6 + 1e-7 * arg) * np.abs(ref[~nan]) + 1e-30)
        assert not np.allclose(g[~nan], unclamped[~nan], rtol=1e-3, atol=1e-3)


def _attention_ref(q, k, v, pos0, window, nh, nkv):
    T, hd = q.shape[0], k.shape[-1]
    out = np.zeros((T, nh * hd))
    for t in range(T):
        p = pos0 + t
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(nh):
            kk, vv = k[lo:p + 1, h // (nh // nkv)].astype(np.float64), v[lo:p + 1, h // (nh // nkv)].astype(np.float64)
            s = kk @ q[t, h * hd:(h + 1) * hd] / np.sqrt(hd)
            e = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = e @ vv / e.sum()
    return out


def _key_blocks(k):
    """K [n_ctx, nkv, hd] in the CPU cache's layout: blocks of KEY_BLOCK positions, d-major."""
    from fuelcli.backends.cpu.attention import KEY_BLOCK

    n, nkv, hd = k.shape
    nb = -(-n // KEY_BLOCK)
    padded = np.zeros((nb * KEY_BLOCK, nkv, hd), np.float32)
    padded[:n] = k
    return np.ascontiguousarray(padded.reshape(nb, KEY_BLOCK, nkv, hd).transpose(0, 2, 3, 1))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("hd", [64, 128, 24])
def test_attention(isa, hd):
    """Causal and windowed, GQA, a query at the cache's last position (no row past it is read),
    key counts that are not a multiple of the vector."""

    core = M.core_table(_isa(isa), hd)
    rng = np.random.default_rng(hd)
    nh, nkv, n_ctx = 6, 2, 300
    k = rng.standard_normal((n_ctx, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((n_ctx, nkv, hd)).astype(np.float32)
    part = np.full(MAX_SPLITS * nh * part_stride(hd), np.nan, np.float32)
    # (1, 299, 0) and (1, 250, 40): a decode step deep enough to run in key runs (matmul.attention_splits)
    for T, pos0, window in ((1, 0, 0), (1, 49, 0), (17, 33, 0), (20, 5, 7), (3, 40, 19), (1, 299, 0), (1, 250, 40)):
        q = (rng.standard_normal((T, nh * hd)) * 3).astype(np.float32)
        out = np.full((T, nh * hd), np.nan, np.float32)
        attention(q, _key_blocks(k), v, pos0, window, nh, nkv, out, part, core)
        ref = _attention_ref(q, k, v, pos0, window, nh, nkv)
        assert np.allclose(out, ref, rtol=1e-5, atol=1e-5), (T, pos0, window, np.abs(out - ref).max())


def test_isa_choice(monkeypatch):
    """FUEL_ISA picks an instruction set the host runs; an unknown or unsupported one is an error."""
    from fuelcli.errors import InputError

    monkeypatch.setenv("FUEL_ISA", "generic")
    assert llvm.host_isa().name == "generic"
    monkeypatch.setenv("FUEL_ISA", "sse9")
    with pytest.raises(InputError, match="FUEL_ISA"):
        llvm.host_isa()
    missing = [n for n in llvm.ISAS if not llvm.supported(n)]
    if missing:
        monkeypatch.setenv("FUEL_ISA", missing[0])
        with pytest.raises(InputError, match="lacks"):
            llvm.host_isa()
    monkeypatch.delenv("FUEL_ISA")
    assert llvm.host_isa().name == next(n for n in llvm.ISAS if llvm.supported(n))


@pytest.mark.parametrize("isa", ["avx512vnni", "avxvnni", "avx2"])
def test_isa_instructions(isa):
    """The prefill micro-kernel uses the instruction its ISA is named for."""
    from fuelcli.backends.cpu.kernels import driver_module

    want = {"avx512vnni": "vpdpwssd", "avxvnni": "vpdpwssd", "avx2": "vpmaddwd"}[isa]
    asm = llvm.assembly(driver_module("quant", llvm.ISAS[isa])[0], llvm.ISAS[isa])
    assert want in asm
    if isa == "avx512vnni":
        assert "zmm" in asm
    else:
        assert "zmm" not in asm and "ymm" in asm


def test_emulated_isa_instructions():
    """The emulated avx512vnni (EMULATED above) runs the planes decode kernels with portable dots:
    the real one's module has vpdpbusd, the emulated one's (on a host without it) none."""
    from fuelcli.backends.cpu.kernels import format_module

    real, emu = llvm.ISAS["avx512vnni"], llvm.emulated("avx512vnni")
    code = FORMATS["q4_0"].code
    assert "vpdpbusd" in llvm.assembly(format_module(code, real)[0], real)
    if not llvm.supported("avx512vnni"):
        assert "vpdpbusd" not in llvm.assembly(format_module(code, emu)[0], emu)


def test_kernel_cache(tmp_path, monkeypatch):
    """A module compiles once: a second process loads the object file; other IR is another file."""
    import subprocess
    import sys

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    code = ("from fuelcli.backends.cpu import kernels, llvm; import time; t = time.time(); "
            "kernels.addresses(4, llvm.ISAS['generic']); print(len(list(llvm.cache_dir().glob('*.o'))))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout.strip() == runs[1].stdout.strip() == "2"  # the q4_0 module and its driver
    from fuelcli.backends.cpu import kernels

    assert kernels.cached([4], llvm.ISAS["generic"])
    assert not kernels.cached([5], llvm.ISAS["generic"])


@pytest.mark.parametrize("isa", [pytest.param(n, marks=pytest.mark.skipif(not llvm.supported(n), reason=f"CPU lacks {n}"))
                                 for n in ("avx512vnni", "avxvnni", "avx2")])
@pytest.mark.parametrize("fmt", FLOATS)
def test_float_prefill_sequential_fma(isa, fmt):
    """Every float tile shape (tile_shape's, its remainders, AVX2's assembly) sums each output as one
    chain of FMAs over k in order, so the result is exactly numpy's chain (f64 products of f32 values
    are exact; one f64 add and the rounding to f32 stand in for the FMA's rounding). Rows 77 and
    29 tokens leave partial groups and token tiles on every ISA. Negative control: the same products
    each rounded to f32 before its add (a chain without FMA) differ."""
    kern, core = _kern(isa, [fmt])
    rng = np.random.default_rng(5)
    raw = random_rows(fmt, 77, 301, seed=4)
    x = rng.standard_normal((29, 301)).astype(np.float32)
    got = _matmul(x, raw, fmt, kern, core)
    w = dequantize(as_tensor(fmt, raw, 301)).astype(np.float32).astype(np.float64)
    acc, unfused = np.zeros((29, 77), np.float32), np.zeros((29, 77), np.float32)
    for k in range(301):
        product = x[:, k, None].astype(np.float64) * w[None, :, k]
        acc = (product + acc).astype(np.float32)
        unfused = unfused + product.astype(np.float32)
    assert np.array_equal(got.view(np.uint32), acc.view(np.uint32)), (isa, fmt, int((got != acc).sum()))
    assert not np.array_equal(unfused, got)
