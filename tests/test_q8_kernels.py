"""8-bit activations (`--activations q8`, backends/cpu/quantize_q8.py, q8_tables.py): the quantize
kernels against a numpy transcription of llama.cpp's quantize_row_q8_K and (x86) quantize_row_q8_0,
bit for bit; every block format's kernels on them against the numpy decode times the dequantised
8-bit activations (the integer dot is exact, so only f32 rounding differs), on every instruction set
this machine runs; the one-plane decode kernels against the int16 kernels on the same values (the
same integers: bit for bit)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_CACHE_DIR", f"/tmp/numba_cache_fuel_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_formats import (ISAS, QUANT, _isa, as_tensor, decode_rows, matmul, quantize_for,  # noqa: E402
                          random_rows)

import llvmlite.binding as llb

from fuelcli.backends.cpu import llvm  # noqa: E402
from fuelcli.backends.cpu import matmul as M  # noqa: E402
from fuelcli.backends.cpu import q8_tables  # noqa: E402
from fuelcli.backends.cpu.activations import quantized  # noqa: E402
from fuelcli.backends.cpu.kernels_decode import q8_decode_isa, q8_decode_takes  # noqa: E402
from fuelcli.formats import FORMATS, dequantize  # noqa: E402


def _nearest(v):
    """ggml's nearest_int: round half to even through the f32 magic number."""
    v = np.asarray(v, np.float32)
    return ((v + np.float32(12582912.0)) - np.float32(12582912.0)).astype(np.int32)


def ref_q8_k(x):
    """llama.cpp's quantize_row_q8_K_ref on one row (len a multiple of 256): (q, d per 256 block)."""
    q, d = np.zeros(x.size, np.int32), np.zeros(x.size // 256, np.float32)
    for i, blk in enumerate(x.reshape(-1, 256)):
        amax, mx = np.float32(0), np.float32(0)
        for v in blk:  # the first value of the largest magnitude
            if abs(v) > amax:
                amax, mx = abs(v), v
        if amax == 0:
            continue
        iscale = np.float32(-127.0) / mx
        q[256 * i:256 * (i + 1)] = np.minimum(127, _nearest(iscale * blk))
        d[i] = np.float32(1.0) / iscale
    return q, d


def ref_q8_0(x):
    """llama.cpp's quantize_row_q8_0 (its AVX2 code) on one row: (q, d per 32 block, as f32 of its f16)."""
    blk = x.reshape(-1, 32)
    amax = np.abs(blk).max(-1)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
    return _nearest(blk * inv[:, None]).ravel(), d


REFS = {"q8_k": (ref_q8_k, 256), "q8_0": (ref_q8_0, 32)}


def _cases(K):
    rng = np.random.default_rng(11)
    normal = rng.standard_normal(K).astype(np.float32)
    heavy = rng.standard_t(2, K).astype(np.float32)
    heavy[5] = 300.0
    heavy[300] = -300.0  # the first of two equal magnitudes sets the sign (q8_k)
    heavy[301] = 300.0
    normal[32:64] = 0.0  # a zero 32-block
    normal[512:768] = 0.0  # a zero 256-block
    halves = (np.arange(K) % 7 - 3).astype(np.float32) * np.float32(0.5)  # few distinct values, signs equal in size
    ties = rng.standard_normal(K).astype(np.float32)  # q8_k: the first of the largest magnitude, by element
    ties[[70, 71, 200]] = -9.0, 9.0, 9.0  # first negative, then positive in its lane's block and a later one
    ties[[300, 301, 450]] = 9.0, -9.0, -9.0
    ties[[536, 578]] = -9.0, 9.0  # the earlier block at a later lane than the later block
    return {"normal": normal, "heavy": heavy, "halves": halves, "ties": ties}


# avxvnni's kernels (8 lanes, vpdpbusd on ymm) compiled for this host: on a CPU with AVX512-VNNI and
# AVX512-VL but no AVX-VNNI (Zen 4), LLVM encodes the same instructions as EVEX, which it runs; the
# VEX encoding an AVX-VNNI CPU runs is checked as assembly only (test_q8_tile_instructions)
VNNI_EVEX = "avxvnni-evex"
_EVEX_OK = (not llvm.supported("avxvnni") and llvm.supported("avx512vnni")
            and llvm.host_features().get("avx512vl", False))
TILE_ISAS = ISAS + [pytest.param(VNNI_EVEX, marks=pytest.mark.skipif(not _EVEX_OK, reason="no EVEX-only VNNI host"))]


def _tile_isa(name):
    if name == VNNI_EVEX:
        return llvm.ISAS["avxvnni"]._replace(cpu=llb.get_host_cpu_name(), features=llb.get_host_cpu_features().flatten())
    return _isa(name)


def _tables(isa_name, codes, kind=None):
    """(int16 kernel and core tables, q8 ones) for the formats `codes`; kind forces the activation blocks."""
    isa = _tile_isa(isa_name)
    kern, core = M.kernel_table(codes, isa), M.core_table(isa, 64)
    k8, c8 = kern.copy(), core.copy()
    q8_tables.apply(k8, c8, codes, isa)
    if kind is not None:
        from fuelcli.backends.cpu.quantize_q8 import addresses

        c8[M.C_QUANTIZE] = addresses(isa)[kind]
    return (kern, core), (k8, c8)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["q8_k", "q8_0"])
def test_quantize_as_llama_cpp(isa, kind):
    """The values and scales llama.cpp's quantiser gives, bit for bit; each 32-block's xs (q8_k:
    its 256-block's d), xf = d * sum(q), xz the 16-element sums of q, and the one-token decode
    layout: the int8 planes' high one 0 and the low one q (its K-quant layout after), or q as words."""
    ref, _ = REFS[kind]
    K = 1024
    _, (_, core) = _tables(isa, [], kind)
    cases = _cases(K)
    x = np.stack(list(cases.values()))
    for n_dec in (0, 1):  # n_dec 1: the first row also gets its decode layout
        qx = quantized(len(x), K, tokens=1)
        quantize_for(x, qx, core, n_dec)
        for r, name in enumerate(cases):
            q, d = ref(x[r])
            got = qx.xq[r * K:(r + 1) * K].astype(np.int32)
            assert np.array_equal(got, q), (kind, name)
            xs = qx.xs[r * K // 32:(r + 1) * K // 32]
            assert np.array_equal(xs.view(np.uint32), np.repeat(d, len(xs) // len(d)).view(np.uint32)), (kind, name)
            sums = q.reshape(-1, 32).sum(-1).astype(np.float32)
            assert np.array_equal(qx.xf[r * K // 32:(r + 1) * K // 32], xs * sums), (kind, name)
            assert np.array_equal(qx.xz[r * K // 16:(r + 1) * K // 16], q.reshape(-1, 16).sum(-1).astype(np.float32))
        if n_dec:
            q = qx.xq[:K].astype(np.int32)
            if llvm.planes_isa(_isa(isa)):
                assert not qx.xp[:K].any() and np.array_equal(qx.xp[K:2 * K].astype(np.int32), q)
                k_layout = q.astype(np.int8).reshape(-1, 16, 4, 4).transpose(0, 2, 1, 3).ravel()
                assert np.array_equal(qx.xp[3 * K:4 * K], k_layout) and not qx.xp[2 * K:3 * K].any()
            else:  # the words, then (an ISA with q8 decode kernels) the low plane, plain and on the K-quant layout
                words = qx.xp[:2 * K].view(np.int16).reshape(-1, 2, 16).astype(np.int32)
                assert np.array_equal(words, q.reshape(-1, 16, 2).transpose(0, 2, 1))
                k_layout = q.astype(np.int8).reshape(-1, 16, 4, 4).transpose(0, 2, 1, 3).ravel()
                low = q8_decode_isa(_isa(isa))
                if low:
                    assert np.array_equal(qx.xp[2 * K:3 * K], q) and np.array_equal(qx.xp[3 * K:4 * K], k_layout)
                else:
                    assert not qx.xp[2 * K:4 * K].any()
        else:
            assert not qx.xp.any()
    assert np.abs(qx.xq.astype(np.int32)).max() == 127


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_q8_non_finite(isa):
    """A 32-block with inf or NaN gets a NaN scale (as int16), the other blocks of its 256 their d."""
    _, (_, core) = _tables(isa, [], "q8_k")
    x = np.ones((1, 256), np.float32)
    x[0, 3], x[0, 40] = np.nan, np.inf
    qx = quantized(1, 256)
    quantize_for(x, qx, core, 0)
    assert np.isnan(qx.xs[0]) and np.isnan(qx.xs[1]) and not np.isnan(qx.xs[2:8]).any()


def _dequantised(fmt, raw, ncols):
    return dequantize(as_tensor(fmt, raw, ncols)).astype(np.float64)


def _x8(qx, T, K):
    """The 8-bit activations as the kernels were given them: q * d, f64."""
    return (qx.xq[:T * K].reshape(-1, 32) * qx.xs[:T * K // 32, None].astype(np.float64)).reshape(T, K)


def _planes_reference():
    """The ISA whose q8 decode kernels the others' must equal: avx512vnni, emulated on a host without it."""
    return "avx512vnni" if llvm.supported("avx512vnni") else "avx512vnni-emulated"


@pytest.mark.parametrize("isa", TILE_ISAS)
@pytest.mark.parametrize("fmt", QUANT)
def test_decode_q8(isa, fmt):
    """One token and 2, 4 and 7 at once (the B-wide kernels): against the numpy decode times the 8-bit
    x (only f32 rounding differs: the integer dot is exact); on avx512vnni bit for bit the int16
    kernels' result on the same values (the one-plane kernels: the same integers and sums); on
    avxvnni and avx2, where a format has q8 decode kernels (kernels_decode.Q8_DECODE), bit for bit
    avx512vnni's (the same IR on ymm halves), which the int16 words kernels on the same values are
    not (they sum in another order: the comparison discriminates); the B-wide kernels give each
    token the one-token kernel's bits. Negative control: the int16 path on x itself differs by
    about 8 bits' rounding."""
    f = FORMATS[fmt]
    ncols = 1024 if f.block_elems == 256 else 928
    nrows = 41
    raw = np.ascontiguousarray(random_rows(fmt, nrows, ncols, seed=90 + f.code))
    w = _dequantised(fmt, raw, ncols)
    (kern, core), (k8, c8) = _tables(isa, [f.code])
    wide = k8.copy()
    M.add_wide(wide, [f.code], _tile_isa(isa))
    q8_tables.apply_wide(wide, [f.code], _tile_isa(isa))
    cases = _cases(ncols)
    rng = np.random.default_rng(3)
    x = np.stack([cases["normal"], cases["heavy"]] + [rng.standard_normal(ncols).astype(np.float32) for _ in range(5)])
    desc, ddesc = np.zeros((M.DESC_ROWS, M.DESC_COLS), np.int64), np.zeros((len(x), M.DESC_COLS), np.int64)

    def decode(kern, core, n):
        qx = quantized(n, ncols, tokens=n)
        quantize_for(x[:n], qx, core, n)
        out = np.full((n, nrows), np.nan, np.float32)
        decode_rows(x[:n], qx, raw.ctypes.data, nrows, raw.shape[1], f.code, kern, core, out, n, desc, ddesc)
        return out, qx

    got, qx = decode(k8, c8, 7)
    mag = np.abs(x) @ np.abs(w).T
    assert np.all(np.abs(got - _x8(qx, 7, ncols) @ w.T) <= 1e-5 * mag), fmt
    same, _ = decode(kern, c8, 7)
    if llvm.planes_isa(_tile_isa(isa)):
        assert np.array_equal(same.view(np.uint32), got.view(np.uint32)), fmt
    elif q8_decode_takes(_tile_isa(isa), f.code):
        _, (kr, cr) = _tables(_planes_reference(), [f.code])
        assert np.array_equal(decode(kr, cr, 7)[0].view(np.uint32), got.view(np.uint32)), fmt
        assert not np.array_equal(same.view(np.uint32), got.view(np.uint32)), fmt
    for n in (2, 4, 7):
        assert np.array_equal(decode(wide, c8, n)[0].view(np.uint32), got[:n].view(np.uint32)), (fmt, n)
    int16, _ = decode(kern, core, 7)
    rel8, rel16 = (np.abs(o - x @ w.T).max() / mag.max() for o in (got, int16))
    assert rel8 > 20 * rel16, (fmt, rel8, rel16)


@pytest.mark.parametrize("isa", TILE_ISAS)
@pytest.mark.parametrize("fmt", QUANT)
def test_prefill_q8(isa, fmt):
    """Many tokens (the tile kernels: the 8-bit tiles of kernels_prefill_q8 on the ISAs that have
    them, else the int16 tiles) on the 8-bit values, against the numpy decode times
    them: every token-tile remainder, a partial last group of rows and task, several chunks of k
    and a partial one. Negative control: against x itself the same tolerance fails."""
    from fuelcli.backends.cpu import kernels as K
    from fuelcli.backends.cpu import kernels_prefill_q8_ksum as ksum
    from fuelcli.backends.cpu.kernels_prefill import KC, TASK_ROWS
    from fuelcli.backends.cpu.kernels_prefill_q8 import takes

    f = FORMATS[fmt]
    ncols = KC * 2 + 256
    nrows = TASK_ROWS + 21
    raw = random_rows(fmt, nrows, ncols, seed=50 + f.code)
    w = _dequantised(fmt, raw, ncols)
    (kern, _), (k8, c8) = _tables(isa, [f.code])
    tiles_q8 = takes(_tile_isa(isa), f.code)
    assert (k8[f.code, M.K_PREFILL] != kern[f.code, M.K_PREFILL]) == tiles_q8
    if ksum.takes(_tile_isa(isa), f.code):  # q8_k activations: the super-block tiles
        assert k8[f.code, M.K_PREFILL] == K.q8_prefill_addresses(f.code, _tile_isa(isa), True)[0]
    rng = np.random.default_rng(5)
    for T in (2, 13, 30):
        x = rng.standard_normal((T, ncols)).astype(np.float32)
        x[1, 40] = 200.0
        qx = quantized(*x.shape)
        out = np.full((T, nrows), np.nan, np.float32)
        quantize_for(x, qx, c8, 0)
        matmul(x, qx, raw.ctypes.data, nrows, raw.shape[1], f.code, k8, out)
        mag = np.abs(x) @ np.abs(w).T
        assert np.all(np.abs(out - _x8(qx, T, ncols) @ w.T) <= 1e-5 * mag), (fmt, T)
        # negative control: the exact x (not its 8-bit values) misses that tolerance
        assert not np.all(np.abs(out - x.astype(np.float64) @ w.T) <= 1e-5 * mag), (fmt, T)
        if tiles_q8:  # the int16 tiles on the same values: the same integers, sums in another order
            same = np.full((T, nrows), np.nan, np.float32)
            matmul(x, qx, raw.ctypes.data, nrows, raw.shape[1], f.code, kern, same)
            assert np.allclose(same, out, rtol=0, atol=1e-5 * mag.max()), (fmt, T)


SUPER_BLOCKS = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s",
                "iq1_s", "iq1_m"]  # the formats of kernels_prefill_q8_ksum's tiles


def test_super_block_formats():
    """The K- and i-quants (every 256-element block format but the ternary ones) take the
    super-block tiles on avx512vnni and avxvnni (CpuFormat.ksum); nothing takes them on avx2."""
    from fuelcli.backends.cpu.kernels_prefill_q8_ksum import takes

    for name in ("avx512vnni", "avxvnni"):
        assert {f for f in QUANT if takes(llvm.ISAS[name], FORMATS[f].code)} == set(SUPER_BLOCKS), name
    assert not any(takes(llvm.ISAS["avx2"], FORMATS[f].code) for f in QUANT)


@pytest.mark.parametrize("isa", TILE_ISAS)
@pytest.mark.parametrize("fmt", SUPER_BLOCKS)
def test_prefill_q8_super_blocks_on_q8_0(isa, fmt):
    """A K- or i-quant beside a 32-element format (q8_0 activations: a scale per 32-block) keeps
    kernels_prefill_q8's tiles, not the super-block ones (kernels_prefill_q8_ksum, which take one
    activation scale a super-block), and its results are the 8-bit values' dot as in
    test_prefill_q8. Negative control: the super-block tiles on these activations miss it."""
    from fuelcli.backends.cpu import kernels as K
    from fuelcli.backends.cpu.kernels_prefill_q8_ksum import takes

    f = FORMATS[fmt]
    ncols, nrows, T = 768, 40, 7
    raw = random_rows(fmt, nrows, ncols, seed=60 + f.code)
    w = _dequantised(fmt, raw, ncols)
    codes = [f.code, FORMATS["q8_0"].code]
    _, (k8, c8) = _tables(isa, codes)
    assert q8_tables.block_kind(codes) == "q8_0"
    tisa = _tile_isa(isa)
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((T, ncols)) * np.repeat(rng.uniform(0.1, 10, ncols // 32), 32)).astype(np.float32)
    qx = quantized(*x.shape)
    quantize_for(x, qx, c8, 0)
    mag = np.abs(x) @ np.abs(w).T
    want = _x8(qx, T, ncols) @ w.T
    out = np.full((T, nrows), np.nan, np.float32)
    matmul(x, qx, raw.ctypes.data, nrows, raw.shape[1], f.code, k8, out)
    assert np.all(np.abs(out - want) <= 1e-5 * mag), fmt
    if takes(tisa, f.code):
        ks = k8.copy()
        ks[f.code, M.K_PREFILL], ks[f.code, M.K_UNPACK] = K.q8_prefill_addresses(f.code, tisa, True)
        matmul(x, qx, raw.ctypes.data, nrows, raw.shape[1], f.code, ks, out)
        assert not np.all(np.abs(out - want) <= 1e-5 * mag), fmt


@pytest.mark.parametrize("isa", TILE_ISAS)
@pytest.mark.parametrize("fmt", ["q4_k", "q5_k"])
def test_ksum_lanes_unpack(isa, fmt):
    """The super-block panel of a format with a lanes emitter (a group's rows decoded at once from
    their transposed dwords) is bit for bit the per-row unpack's (the format's Block decode), on
    every slot the tiles read: each 32-block's quads, integer scale and min, each super-block's d
    and its weight-sum slot; a partial last group of rows, the second super-block of the rows.
    Negative control: the first super-block's panel differs from it."""
    import ctypes

    from llvmlite import ir

    from fuelcli.backends.cpu import kernels_prefill_q8_ksum as ks
    from fuelcli.backends.cpu.irgen import G
    from fuelcli.backends.cpu.kernels_prefill import KC, TASK_ROWS

    tisa = _tile_isa(isa)
    f = FORMATS[fmt]
    if not ks.takes(tisa, f.code):
        pytest.skip(f"{isa} has no super-block tiles")
    L, P, nb = tisa.lanes, ks.per_block(ks.kind_of(f.code)), KC // G
    mod = ir.Module(name=f"lanes_{fmt}")
    ks._unpack(tisa, mod, f.code, f"rows_{fmt}")
    ks._unpack_lanes(tisa, mod, f.code, f"lanes_{fmt}")
    got = llvm.compile_module(f"test-lanes-{fmt}", lambda: (mod, [f"rows_{fmt}", f"lanes_{fmt}"]), tisa)
    n_rows = TASK_ROWS - 5
    raw = np.ascontiguousarray(random_rows(fmt, n_rows, 2 * KC, seed=70 + f.code))
    groups = TASK_ROWS // L

    def run(name, k0):
        panel = _aligned(groups * nb * P * L, np.int32).reshape(groups, nb, P, L)  # the kernels' aligned stores
        scales, mins = (_aligned(groups * nb * L, np.float32).reshape(groups, nb, L) for _ in range(2))
        panel[:], scales[:], mins[:] = 0x5A5A5A5A, 7.0, 7.0
        fn = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 8)(got[name])
        fn(raw.ctypes.data, raw.shape[1], n_rows, k0, KC, panel.ctypes.data, scales.ctypes.data, mins.ctypes.data)
        valid = (np.arange(groups)[:, None] * L + np.arange(L)) < n_rows
        pick = lambda a: np.moveaxis(a, -1, 1)[valid]  # noqa: E731  (rows < n_rows)
        return pick(panel[:, :, :P - 1]), pick(panel[:, ::8, P - 1]), pick(scales[:, ::8]), pick(mins)

    want = run(f"rows_{fmt}", KC)
    for a, b in zip(run(f"lanes_{fmt}", KC), want):
        assert np.array_equal(a.view(np.int32), b.view(np.int32)), fmt
    assert not all(np.array_equal(a, b) for a, b in zip(run(f"lanes_{fmt}", 0), want))


EXTREMES = {"q6_k": 4096, "iq4_xs": 4064}  # the formats' largest |w * sc|: Q6_K (q - 32) * sc = -32 * -128,
# IQ4_XS KVALUES[0] * (ls - 32) = -127 * -32


@pytest.mark.parametrize("isa", TILE_ISAS)
@pytest.mark.parametrize("fmt", EXTREMES)
def test_ksum_extremes(isa, fmt):
    """The super-block tiles' int32 sums at their largest (kernels_prefill_q8_ksum's bound), rows of
    d 1 and every weight times its integer scale at the format's largest, against x = +-127: Q6_K's
    every q 0 (w = -32) and scale -128, IQ4_XS's every index 0 (-127) and ls 0 (-32). Each
    super-block sums 256 * 127 * 4096 = 1.33e8 (IQ4_XS 256 * 127 * 4064 = 1.32e8) exactly (a
    multiple of 2^12, 2^13: exact in f32 as well), so the result is the exact product. Negative
    control: 17 such super-blocks summed in int32 would wrap (the bound holds per super-block,
    which is why the sums convert there)."""
    from fuelcli.backends.cpu.kernels_prefill_q8_ksum import takes

    f = FORMATS[fmt]
    if not takes(_tile_isa(isa), f.code):
        pytest.skip(f"{isa} has no super-block tiles")
    nrows, ncols, T = 16, 512, 6
    L = f.layout
    blocks = np.zeros((nrows * ncols // 256, f.block_bytes), np.uint8)
    if fmt == "q6_k":
        blocks[:, L.scales:L.scales + 16] = np.uint8(0x80)  # int8 -128
    blocks[:, L.d:L.d + 2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    raw = blocks.reshape(nrows, -1)
    w = _dequantised(fmt, raw, ncols)
    big = EXTREMES[fmt]
    assert np.all(w == big)
    _, (k8, c8) = _tables(isa, [f.code])
    x = np.where(np.arange(T)[:, None] % 2 == 0, 1.0, -1.0).astype(np.float32) * np.ones((T, ncols), np.float32)
    qx = quantized(T, ncols)
    quantize_for(x, qx, c8, 0)
    q = qx.xq[:T * ncols].reshape(T, ncols).astype(np.int64)
    assert np.all(np.abs(q) == 127)
    out = np.full((T, nrows), np.nan, np.float32)
    matmul(x, qx, raw.ctypes.data, nrows, raw.shape[1], f.code, k8, out)
    per_super = (q.reshape(T, -1, 256) * big).sum(-1)
    assert np.all(np.abs(per_super) == 256 * 127 * big)
    want = (per_super.astype(np.float64) * qx.xs[:T * ncols // 32:8].reshape(T, -1)).sum(-1)
    assert np.array_equal(out, np.repeat(want[:, None], nrows, 1).astype(np.float32))
    assert 17 * 256 * 127 * big > 2 ** 31 - 1 > 16 * 256 * 127 * big


def test_block_kind():
    """q8_k where every block format of the model has 256-element blocks, else q8_0 (float formats
    take f32 x either way)."""
    c = lambda *names: [FORMATS[n].code for n in names]  # noqa: E731
    assert q8_tables.block_kind(c("q4_k", "q6_k", "f32")) == "q8_k"
    assert q8_tables.block_kind(c("q4_k", "q8_0")) == "q8_0"
    assert q8_tables.block_kind(c("f16")) == "q8_0"


@pytest.mark.parametrize("isa", ["avx512vnni", "avxvnni", "avx2"])
def test_q8_tile_instructions(isa):
    """The q8 tiles use the instruction their ISA is named for, compiled for that ISA's CPU (avxvnni's
    is Alder Lake's VEX `{vex} vpdpbusd` on ymm, which no Zen 4 runs: checked here as assembly only);
    avx2's assembly tile sums runs of int16 pair sums (vpaddw) for Q4_K and Q4_0, and leaves Q8_0 and
    IQ4_XS (|w| up to 128) and Q6_K (runs of 2) to the int16 tiles."""
    from fuelcli.backends.cpu.kernels import q8_prefill_module
    from fuelcli.backends.cpu.kernels_prefill_q8 import driver_of, takes

    target = llvm.ISAS[isa]
    fmts = ("q4_k", "q4_0") if isa == "avx2" else ("q8_0", "q4_k")
    asm = {f: llvm.assembly(q8_prefill_module(driver_of(FORMATS[f].code, target), target)[0], target)
           for f in fmts}
    if isa == "avx2":
        assert all("vpmaddubsw" in a and "vpmaddwd" in a and "vpdpbusd" not in a for a in asm.values())
        assert all("vpaddw" in a.split("#APP")[1].split("#NO_APP")[0] for a in asm.values())
        assert not any(takes(target, FORMATS[f].code) for f in ("q8_0", "iq4_xs", "q6_k"))
    else:  # and the K-quants' super-block tiles: the sub-block sums times their integer scales, vpmulld
        from fuelcli.backends.cpu.kernels import q8_ksum_module

        asm["ksum16"] = llvm.assembly(q8_ksum_module("ksum16", target)[0], target)
        assert "vpmulld" in asm["ksum16"]
        assert all("vpdpbusd" in a and "vpmaddubsw" not in a for a in asm.values())
        assert all(("zmm" in a) == (isa == "avx512vnni") for a in asm.values())
        assert all(("{vex}\tvpdpbusd" in a) == (isa == "avxvnni") for a in asm.values())


@pytest.mark.parametrize("isa", ["avxvnni", "avx2"])
def test_q8_decode_instructions(isa):
    """The q8 decode kernels of the ISAs without the int8 planes, compiled for their CPUs: avxvnni's
    are Alder Lake's VEX `{vex} vpdpbusd` on ymm (no Zen 4 runs it: assembly only), avx2's
    vpmaddubsw then vpmaddwd; neither touches a zmm register. Formats with unit bytes past
    AVX2_UNIT_MAX (Q4_K: 240) have none on avx2."""
    from fuelcli.backends.cpu.kernels import q8_module
    from fuelcli.backends.cpu.kernels_decode import Q8_DECODE

    target = llvm.ISAS[isa]
    assert Q8_DECODE[isa], isa
    for name in sorted(Q8_DECODE[isa])[:2]:
        asm = llvm.assembly(q8_module(FORMATS[name].code, target, (1, 2))[0], target)
        assert "zmm" not in asm, name
        if isa == "avx2":
            assert "vpmaddubsw" in asm and "vpmaddwd" in asm and "vpdpbusd" not in asm, name
        else:
            assert "{vex}\tvpdpbusd" in asm and "vpmaddubsw" not in asm, name
    assert not q8_decode_takes(llvm.ISAS["avx2"], FORMATS["q4_k"].code)


@pytest.mark.skipif(not llvm.supported("avx2"), reason="CPU lacks avx2")
def test_unit_max():
    """kernels_decode.UNIT_MAX is each format's largest planes unit byte (every step the decode
    kernels take: full chunks, and a 32-element format's pairs and single blocks), on every bit
    pattern of random rows: what bounds avx2's vpmaddubsw pair sums (AVX2_UNIT_MAX). Negative
    control: at Q4_0's 240 (16 * q, its high nibbles in place), a pair of products with x = 127
    passes 32767 and vpmaddubsw saturates (why Q4_0 keeps the words kernels on avx2)."""
    import ctypes

    from llvmlite import ir

    from fuelcli.backends.cpu import emit as E
    from fuelcli.backends.cpu import unpack as U
    from fuelcli.backends.cpu.irgen import F32T, I8, Loop, c64, func, ptr_to, splat_c, vec
    from fuelcli.backends.cpu.kernels_decode import AVX2_UNIT_MAX, UNIT_MAX

    isa = llvm.ISAS["avx2"]
    seen = {}
    for name in QUANT:
        code = FORMATS[name].code
        BL = U.record(code).layout
        chunk = E.PLANES_CHUNK // BL.block_elems
        steps = sorted({chunk, min(2, chunk), 1})
        mod = ir.Module(name=f"units_{name}")
        fn, bd = func(mod, f"units_{name}", 3)
        w, nb, o = fn.args[:3]
        row, out = ptr_to(bd, w, I8), ptr_to(bd, o, vec(I8, E.PLANES_UNIT))
        for si, n in enumerate(steps):  # step si's units of chunk c at out[(si * nb / chunk + c) * 4 + u]
            with Loop(bd, 0, nb, chunk) as b0:
                blk = U.planes_blocks(code, bd, [row], b0, n, splat_c(F32T, 1.0, n * BL.block_elems // 32))
                c = bd.add(bd.udiv(b0, c64(chunk)), bd.mul(c64(si), bd.udiv(nb, c64(chunk))))
                for u, unit in enumerate(blk.units[0]):
                    bd.store(unit, bd.gep(out, [bd.add(bd.mul(c, c64(4)), c64(u))]), align=1)
        bd.ret_void()
        (addr,) = llvm.compile_module(f"test-units-{name}", lambda m=mod, n=name: (m, [f"units_{n}"]), isa).values()
        ncols = 256 * 32
        raw = np.ascontiguousarray(random_rows(name, 1, ncols, seed=7))
        units = np.zeros(len(steps) * ncols // 256 * 4 * E.PLANES_UNIT, np.uint8)
        ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 3)(addr)(raw.ctypes.data, ncols // BL.block_elems,
                                                            units.ctypes.data)
        seen[name] = int(units.max())
    assert seen == UNIT_MAX
    assert 2 * 127 * AVX2_UNIT_MAX <= 32767 < 2 * 127 * (AVX2_UNIT_MAX + 1)
    u = np.full((1, 2), UNIT_MAX["q4_0"], np.int64)
    assert _maddubs(u, np.full((1, 2), 127))[0] == 32767 < 2 * 127 * UNIT_MAX["q4_0"]


def _aligned(n, dtype):
    buf = np.zeros(n + 64, dtype)
    o = (-buf.ctypes.data % 64) // buf.itemsize
    return buf[o:o + n]


@pytest.mark.skipif(not llvm.supported("avx2"), reason="CPU lacks avx2")
def test_w_max():
    """kernels_prefill_q8.W_MAX is each format's largest |w| on its q8 panel (the avx2 unpack, on
    every bit pattern of random rows), and the formats it leaves out reach past 64 (their pair sums
    of x + 128 could saturate vpmaddubsw: the sign trick)."""
    import ctypes

    from fuelcli.backends.cpu import kernels as K
    from fuelcli.backends.cpu.kernels_prefill import KC, TASK_ROWS
    from fuelcli.backends.cpu.kernels_prefill_q8 import QUADS, W_MAX, kind_of, per_block

    isa = llvm.ISAS["avx2"]
    seen = {}
    for name in QUANT:
        code = FORMATS[name].code
        raw = np.ascontiguousarray(random_rows(name, TASK_ROWS, KC, seed=7))
        P = per_block(kind_of(code))
        panel = _aligned(TASK_ROWS * KC // 32 * P, np.int32)
        sc, mn = _aligned(TASK_ROWS * KC // 32 * 2, np.float32), _aligned(TASK_ROWS * KC // 32 * 2, np.float32)
        (unpack,) = K._compiled("q8prefill", code, isa)
        ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 8)(unpack)(raw.ctypes.data, raw.shape[1], TASK_ROWS, 0, KC,
                                                              panel.ctypes.data, sc.ctypes.data, mn.ctypes.data)
        seen[name] = int(np.abs(panel.reshape(-1, P, 8)[:, :QUADS].view(np.int8).astype(np.int32)).max())
    assert {n: v for n, v in seen.items() if n in W_MAX} == {n: W_MAX[n] for n in seen if n in W_MAX}
    assert all(v > 64 for n, v in seen.items() if n not in W_MAX), seen


def _extreme_rows(fmt, nrows, ncols):
    """Rows of scale 1 whose every weight is the format's most negative: Q8_0 -128, Q5_0 -16, Q4_0 -8."""
    f = FORMATS[fmt]
    blocks = np.zeros((nrows * ncols // f.block_elems, f.block_bytes), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    if fmt == "q8_0":
        blocks[:, f.layout.qs:] = 0x80
    return blocks.reshape(nrows, -1)


def _maddubs(u, s):
    """vpmaddubsw on int arrays (..., 2k): pair sums saturated to int16."""
    p = u[..., 0::2].astype(np.int64) * s[..., 0::2] + u[..., 1::2].astype(np.int64) * s[..., 1::2]
    return np.clip(p, -32768, 32767)


@pytest.mark.skipif(not llvm.supported("avx2"), reason="CPU lacks avx2")
@pytest.mark.parametrize("fmt", ["q8_0", "q5_0", "q4_0"])
def test_avx2_saturation(fmt):
    """The avx2 q8 prefill where vpmaddubsw's int16 pair sums would be largest: every weight the
    format's most negative, x at +-127. Q5_0 (x + 128 = 255 against -16: runs of 4 quads reach
    -32640), Q4_0 (-8: runs of 8); Q8_0 (-128) on the int16 tiles. Against the integer dot,
    exactly (the sums are integers, the scales powers of two but x's). Negative controls, on the
    same integers: x + 128 against Q8_0's weights saturates (why it keeps the int16 tiles), and a
    run twice as long overflows int16."""
    from fuelcli.backends.cpu.kernels_prefill_q8 import run_of, takes

    f = FORMATS[fmt]
    nrows, ncols, T = 16, 512, 6
    raw = _extreme_rows(fmt, nrows, ncols)
    w = _dequantised(fmt, raw, ncols)
    assert np.all(w == {"q8_0": -128, "q5_0": -16, "q4_0": -8}[fmt])
    (kern, _), (k8, c8) = _tables("avx2", [f.code])
    assert (k8[f.code, M.K_PREFILL] != kern[f.code, M.K_PREFILL]) == (fmt != "q8_0") == takes(_isa("avx2"), f.code)
    x = np.where(np.arange(T)[:, None] % 2 == 0, 1.0, -1.0).astype(np.float32) * np.ones((T, ncols), np.float32)
    qx = quantized(T, ncols)
    quantize_for(x, qx, c8, 0)
    q = qx.xq[:T * ncols].reshape(T, ncols).astype(np.int64)
    assert np.all(np.abs(q) == 127)
    out = np.full((T, nrows), np.nan, np.float32)
    matmul(x, qx, raw.ctypes.data, nrows, raw.shape[1], f.code, k8, out)
    want = _x8(qx, T, ncols) @ w.T
    assert np.array_equal(out, want.astype(np.float32)), fmt
    wi = w[0].astype(np.int64)
    exact = (q * wi).sum(-1)
    u = (q + 128).reshape(T, -1, 4)
    if fmt == "q8_0":  # x + 128 against w: the tokens of x = +127 (255 * -128 twice) saturate
        naive = _maddubs(u, np.broadcast_to(wi.reshape(-1, 4), u.shape)).sum((-1, -2)) - 128 * wi.sum()
        assert np.all(np.abs(naive - exact)[0::2] > 0.4 * np.abs(exact)[0::2])
    else:  # a run of twice the quads, summed as int16 (vpaddw wraps)
        run = run_of(f.code)
        pairs = _maddubs(u, np.broadcast_to(wi.reshape(-1, 4), u.shape))  # (T, quads, 2 int16 lanes)
        runs = pairs.reshape(T, -1, 2 * run, 2).sum(2)  # each lane's sum over 2 * run quads
        wrapped = ((runs + 32768) % 65536 - 32768).sum((-1, -2)) - 128 * wi.sum()
        assert np.any(wrapped != exact)


def test_kernels_cached_counts_q8(tmp_path):
    """engine.kernels_cached (`fuel run`'s "compiling" notice) counts the q8 modules with
    `--activations q8`: in a fresh cache, after the int16 kernels of a Q4_0 model compiled, int16 is
    warm and q8 cold (the negative control) until the q8 tables compile; on avx2, whose q8 path has
    tiles of its own (FUEL_ISA picks it)."""
    import subprocess

    code = ("from fuelcli.backends.cpu import engine as E, kernels, llvm, q8_tables, matmul as M\n"
            "E._forward_cached = lambda: True\n"
            "class T: format = type('F', (), {'code': 4})()\n"
            "class W:\n    def tensors(self): return [T()]\n"
            "isa = llvm.host_isa(); kernels.addresses(4, isa)\n"
            "before = (E.kernels_cached(W()), E.kernels_cached(W(), 'q8'))\n"
            "q8_tables.apply(M.kernel_table([4], isa), M.core_table(isa, 64), [4], isa)\n"
            "print(isa.name, before, E.kernels_cached(W(), 'q8'))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "FUEL_ISA": "avx2"}
    if not llvm.supported("avx2"):
        pytest.skip("CPU lacks avx2")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "avx2 (True, False) True", r.stdout


def test_q8_cached_counts_decode_modules(tmp_path):
    """q8_tables.cached (what engine.kernels_cached asks with `--activations q8`) counts the q8
    decode module of a format that has one on avxvnni (compiled here for Alder Lake, not run): warm
    after q8_tables.apply, cold again without that module's object file (the negative control),
    and a format without one (Q4_0 on avx2) needs none."""
    import subprocess

    code = ("from pathlib import Path\n"
            "from fuelcli.backends.cpu import llvm, q8_tables, matmul as M\n"
            "from fuelcli.backends.cpu.kernels_decode import q8_decode_takes\n"
            "from fuelcli.formats import FORMATS\n"
            "isa = llvm.ISAS['avxvnni']; c = FORMATS['q4_k'].code\n"
            "assert q8_decode_takes(isa, c)\n"
            "q8_tables.apply(M.kernel_table([c], isa), M.core_table(isa, 64), [c], isa)\n"
            "warm = q8_tables.cached([c], isa)\n"
            "for p in (Path(llvm.cache_dir())).glob(f'avxvnni-q8-{c}-*.o'): p.unlink()\n"
            "avx2, c0 = llvm.ISAS['avx2'], FORMATS['q4_0'].code\n"
            "print(warm, q8_tables.cached([c], isa), q8_decode_takes(avx2, c0))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "True False False", r.stdout
