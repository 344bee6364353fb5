"""CUDA kernels against the CPU kernels, per weight format, at small sizes: on numba's CUDA simulator
here and in CI (tests/cuda_sim.py), on the GPU under NUMBA_ENABLE_CUDASIM=0 (examples/gpu-check.sh).

Every format of the registry is parametrized, so a format added to fuelcli/formats without a CUDA
unit decoder fails here. Tolerances: decoded rows equal the format's numpy decode (formats/, the
exact decode checked against gguf-py) bit for bit on the simulator (same float operations, same
order); a GPU may fuse d * q + m into one FMA, one rounding of |d * q| + |m| apart. Dot products and
matmuls sum in another order than a float64 dot of the decoded rows: within 1e-5 of sum |w * x|
(measured: below 1e-6).
"""

import cuda_sim  # noqa: I001  (first: sets up the simulator before numba.cuda is imported)

import numpy as np
import pytest
from test_formats import random_rows

from fuelcli.backends.cuda.runtime import GPU, SIMULATOR
from fuelcli.formats import FORMATS, dequantize_bytes

if cuda_sim.HAVE_NUMBA_CUDA:
    from numba import cuda

cuda_sim.speed_up()
pytestmark = cuda_sim.needs_numba_cuda

LAUNCHES = {"simulator shape": SIMULATOR, "gpu shape": GPU}
REL = 1e-5


def ncols(fmt: str) -> int:
    return max(256, FORMATS[fmt].block_elems)


def upload(raw: np.ndarray, fmt: str):
    """A one-matrix weight buffer and table, as device_weights.py lays them out."""
    flat = np.ascontiguousarray(raw).reshape(-1)
    w8 = cuda.to_device(np.concatenate([flat, np.zeros(-len(flat) % 256 + 256, np.uint8)]))
    mats = cuda.to_device(np.array([[0, raw.shape[0], raw.shape[1], FORMATS[fmt].code]], np.int64))
    return w8, mats


def cpu_rows(fmt: str, raw: np.ndarray, n: int) -> np.ndarray:
    return dequantize_bytes(fmt, raw, (raw.shape[0], n))


def test_every_format_has_a_unit_decoder():
    from fuelcli.backends.cuda.kernels.unpack import HANDLED

    assert HANDLED == {f.code for f in FORMATS.values()}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_rows_decode_as_the_cpu_does(fmt):
    from fuelcli.backends.cuda.kernels.dequant import take_rows

    n = ncols(fmt)
    raw = random_rows(fmt, 8, n, seed=100 + FORMATS[fmt].code)
    want = cpu_rows(fmt, raw, n)
    w8, _ = upload(raw, fmt)
    rows = np.array([3, 0, 7], np.int32)
    out = cuda.device_array((3, n), np.float32)
    vecs = cuda.to_device(np.zeros(1, np.float32))
    take_rows[3, SIMULATOR.row](w8, 0, raw.shape[1], FORMATS[fmt].code, cuda.to_device(rows), -1, out, vecs, -1,
                                np.float32(0), out)
    got = out.copy_to_host()
    one = cuda.device_array((1, n), np.float32)  # a decode step passes the row as a scalar
    take_rows[1, SIMULATOR.row](w8, 0, raw.shape[1], FORMATS[fmt].code, cuda.to_device(rows), 5, one, vecs, -1,
                                np.float32(0), one)
    if cuda_sim.SIMULATOR:
        assert np.array_equal(got, want[rows]) and np.array_equal(one.copy_to_host()[0], want[5])
    else:
        tol = 2 * np.finfo(np.float32).eps * np.abs(want).max(axis=1, keepdims=True)
        assert np.all(np.abs(got - want[rows]) <= tol[rows]) and np.all(np.abs(one.copy_to_host()[0] - want[5]) <= tol[5])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's inf values
def test_mxfp4_every_exponent_decodes_as_the_cpu():
    """Every E8M0 byte (subnormal scales, infinities past 2^127 / 12) as the numpy decode, bit for
    bit on a GPU too (a power of two times a small integer rounds nowhere)."""
    from fuelcli.backends.cuda.kernels.dequant import take_rows
    from test_formats import _every_e8m0

    raw = _every_e8m0("mxfp4").reshape(32, -1)  # 32 rows of 8 blocks
    with np.errstate(over="ignore"):
        want = cpu_rows("mxfp4", raw, 256)
    w8, _ = upload(raw, "mxfp4")
    rows = np.arange(32, dtype=np.int32)
    out = cuda.device_array((32, 256), np.float32)
    take_rows[32, SIMULATOR.row](w8, 0, raw.shape[1], FORMATS["mxfp4"].code, cuda.to_device(rows), -1, out,
                                 cuda.to_device(np.zeros(1, np.float32)), -1, np.float32(0), out)
    assert np.array_equal(out.copy_to_host().view(np.uint32), want.view(np.uint32))


def test_a_wrong_decode_is_caught():
    """Negative control: q4_0 rows read as q4_1 (same nibbles, another block size) differ."""
    from fuelcli.backends.cuda.kernels.dequant import take_rows

    raw = random_rows("q4_0", 2, 256, seed=3)
    want = cpu_rows("q4_0", raw, 256)
    w8, _ = upload(raw, "q4_0")
    out = cuda.device_array((1, 256), np.float32)
    take_rows[1, SIMULATOR.row](w8, 0, raw.shape[1], FORMATS["q4_1"].code, cuda.to_device(np.zeros(1, np.int32)),
                                0, out, cuda.to_device(np.zeros(1, np.float32)), -1, np.float32(0), out)
    assert not np.allclose(out.copy_to_host()[0], want[0], rtol=1e-2, atol=1e-2)


def run_matvec(raw, fmt, x, L, start=None, bias=None, norm_w=None, eps=np.float32(1e-6), nm=1):
    """One launch of the format's decode product over `raw` (nm equal matrices' rows concatenated
    when nm > 1); out starts as `start` (accumulate) or NaN; returns (out, xn, done)."""
    from fuelcli.backends.cuda.kernels.matvec import matvec_kernel

    rows = raw.shape[0]
    flat = np.ascontiguousarray(raw).reshape(-1)
    w8 = cuda.to_device(np.concatenate([flat, np.zeros(-len(flat) % 256 + 256, np.uint8)]))
    per = rows // nm
    table = np.array([[i * per * raw.shape[1], per, raw.shape[1], FORMATS[fmt].code] for i in range(nm)], np.int64)
    K = x.shape[0]
    pad = np.full(2, np.nan, np.float32)  # past the rows: must stay untouched
    out0 = np.concatenate([start if start is not None else np.full(rows, np.nan, np.float32), pad])
    vecs = np.concatenate([np.zeros(4, np.float32), norm_w if norm_w is not None else np.zeros(rows, np.float32),
                           bias if bias is not None else np.zeros(rows, np.float32)])
    out, xn = cuda.to_device(out0), cuda.to_device(np.full(rows + 2, np.nan, np.float32))
    done = cuda.to_device(np.zeros(1, np.int32))
    matvec_kernel(FORMATS[fmt].code)[-(-rows // L.rows), (L.lanes, L.rows)](
        w8, cuda.to_device(table), 0, nm, cuda.to_device(x), cuda.to_device(vecs),
        -1 if bias is None else 4 + rows, out[:rows], int(start is not None), -1 if norm_w is None else 4, eps,
        xn[:rows], done)
    return out.copy_to_host(), xn.copy_to_host(), int(done.copy_to_host()[0])


def check_matvec(fmt, K, rows, L, seed):
    raw = random_rows(fmt, rows, K, seed=seed)
    x = np.random.default_rng(seed).standard_normal(K).astype(np.float32)
    w = cpu_rows(fmt, raw, K).astype(np.float64)
    want, mag = w @ x, np.abs(w) @ np.abs(x)
    got, _, _ = run_matvec(raw, fmt, x, L)
    err = np.abs(got[:rows] - want) / mag
    assert np.all(err <= REL), (fmt, K, float(err.max()))
    assert np.isnan(got[rows:]).all()  # nothing written past the rows
    return float(err.max())


@pytest.mark.parametrize("launch", list(LAUNCHES))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_matvec_equals_a_dot_of_the_decoded_rows(fmt, launch):
    """Each format's own kernel against a float64 dot of the numpy-decoded rows (the decode the CPU
    kernels are checked against), rows not a multiple of the block's."""
    L = LAUNCHES[launch]
    check_matvec(fmt, ncols(fmt), 10 if launch == "gpu shape" else 5, L, 200 + FORMATS[fmt].code)


@pytest.mark.parametrize("K", [4096, 14336])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_matvec_at_real_row_lengths(fmt, K):
    """The GPU's block (32 lanes a row, 8 rows) at Llama-8B's row lengths: every lane runs many units
    (K = 14336 Q4_K: 14 units a lane), whole blocks and sub-blocks per lane, the shuffle sum over 32
    lanes. One block of 8 rows (the simulator runs ~0.5 ms a thread)."""
    check_matvec(fmt, K, 8, GPU, 500 + FORMATS[fmt].code + K)


def test_a_wrong_format_kernel_is_caught():
    """Negative control: q4_0 rows through q4_1's kernel (same nibbles, another block) miss."""
    raw = random_rows("q4_0", 4, 256, seed=3)
    x = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    w = cpu_rows("q4_0", raw, 256).astype(np.float64)
    table_fmt = "q4_1"
    got, _, _ = run_matvec(raw, table_fmt, x, GPU)
    assert not np.allclose(got[:4], w @ x, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_matvec_fusions(launch):
    """Three matrices in one launch (q|k|v of one format), bias, the residual add and the RMSNorm of
    the result written by the last block (several blocks; the counter back at 0 for the next launch)."""
    L, n, rows = LAUNCHES[launch], 256, 3 * 12
    raw = random_rows("q4_k", rows, n, seed=300)
    rng = np.random.default_rng(9)
    x = rng.standard_normal(n).astype(np.float32)
    bias, start = rng.standard_normal(rows).astype(np.float32), rng.standard_normal(rows).astype(np.float32)
    norm_w = (1 + 0.2 * rng.standard_normal(rows)).astype(np.float32)
    w = cpu_rows("q4_k", raw, n).astype(np.float64)
    want = start + (w @ x + bias)
    eps = np.float32(1e-6)
    for _ in range(2):  # a second launch finds the counter reset
        got, xn, done = run_matvec(raw, "q4_k", x, L, start=start, bias=bias, norm_w=norm_w, eps=eps, nm=3)
        assert np.allclose(got[:rows], want, rtol=0, atol=REL * (np.abs(w) @ np.abs(x)).max())
        g = got[:rows].astype(np.float32)
        inv = np.float32(1) / np.sqrt(np.float32((g.astype(np.float64) ** 2).sum() / rows) + eps)
        assert np.allclose(xn[:rows], norm_w * (g * inv), rtol=1e-5, atol=0) and np.isnan(xn[rows:]).all()
        assert done == 0


@pytest.mark.parametrize("fmts", [("q4_k", "q4_k"), ("q4_k", "q6_k"), ("f16", "q8_0")])
def test_swiglu(fmts):
    """silu(G x) * (U x) with gate and up in their own formats, the GPU's block, rows past a block."""
    from fuelcli.backends.cuda.kernels.matvec import swiglu_kernel

    n, rows = 512, 10
    raws = [random_rows(f, rows, n, seed=600 + i) for i, f in enumerate(fmts)]
    size = -(-raws[0].nbytes // 256) * 256
    buf = np.zeros(size + raws[1].nbytes + 256, np.uint8)
    buf[: raws[0].nbytes], buf[size : size + raws[1].nbytes] = raws[0].reshape(-1), raws[1].reshape(-1)
    table = np.array([[0, rows, raws[0].shape[1], FORMATS[fmts[0]].code],
                      [size, rows, raws[1].shape[1], FORMATS[fmts[1]].code]], np.int64)
    x = np.random.default_rng(6).standard_normal(n)
    x = (x * 4 / np.abs(cpu_rows(fmts[0], raws[0], n) @ x).max()).astype(np.float32)  # gates of magnitude <= 4
    g, u = (cpu_rows(f, r, n).astype(np.float64) @ x for f, r in zip(fmts, raws))
    want = g / (1 + np.exp(-g)) * u
    out = cuda.to_device(np.full(rows + 1, np.nan, np.float32))
    kernel = swiglu_kernel(FORMATS[fmts[0]].code, FORMATS[fmts[1]].code)
    kernel[-(-rows // GPU.rows), (GPU.lanes, GPU.rows)](cuda.to_device(buf), cuda.to_device(table), 0, 1,
                                                         cuda.to_device(x), out)
    got = out.copy_to_host()
    assert np.allclose(got[:rows], want, rtol=1e-4, atol=1e-4 * np.abs(want).max()) and np.isnan(got[rows])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_matmul_equals_the_product(fmt):
    """Partial tiles (rows and tokens not multiples of the tile), a column offset, bias, accumulate."""
    from fuelcli.backends.cuda.kernels.matmul import MT, matmul

    n, code, L = ncols(fmt), FORMATS[fmt].code, SIMULATOR
    raw = random_rows(fmt, 11, n, seed=400 + code)
    w = cpu_rows(fmt, raw, n).astype(np.float64)
    rng = np.random.default_rng(code)
    T = 5
    x = rng.standard_normal((T + 2, n)).astype(np.float32)  # rows past T must not be read into the result
    bias = rng.standard_normal(11).astype(np.float32)
    start = rng.standard_normal((T + 2, 14)).astype(np.float32)
    want = start.astype(np.float64).copy()
    want[:T, 2:13] += x[:T] @ w.T + bias
    w8, mats = upload(raw, fmt)
    out = cuda.to_device(start)
    tile = L.tile * MT
    matmul[(-(-11 // tile), -(-T // tile)), (L.tile, L.tile)](w8, mats, 0, cuda.to_device(x), T,
                                                               cuda.to_device(bias), 0, out, 2, 1)
    got = out.copy_to_host()
    tol = REL * (np.abs(x[:T]) @ np.abs(w).T) + 1e-6
    assert np.all(np.abs(got[:T, 2:13] - want[:T, 2:13]) <= tol)
    assert np.array_equal(got[:, :2], start[:, :2]) and np.array_equal(got[T:], start[T:])


def test_argmax_as_numpy():
    """Ties go to the lower index, a NaN wins (numpy's argmax)."""
    from fuelcli.backends.cuda.kernels.rows import argmax

    rng = np.random.default_rng(2)
    rows = rng.standard_normal((4, 37)).astype(np.float32)
    rows[1, [5, 30]] = 9.0
    rows[2, 20] = np.nan
    rows[3, [3, 33]] = np.nan
    out = cuda.device_array(1, np.int32)
    d = cuda.to_device(rows)
    for r in range(4):
        argmax[1, SIMULATOR.row](d, r, out)
        assert int(out.copy_to_host()[0]) == int(np.argmax(rows[r])), r


@pytest.mark.parametrize("renorm", [False, True])
def test_moe_kernels_route_as_the_cpu(renorm):
    """Routing (softmax, top-k with a tie, renorm or not) as the CPU's route, the chosen experts'
    SwiGLU on the normed input, and their weighted sum added to the residual."""
    from fuelcli.backends.cpu.moe import route as cpu_route
    from fuelcli.backends.cuda.kernels.moe import moe_down, moe_swiglu

    E, k, H, I, T, L = 8, 2, 32, 16, 3, SIMULATOR
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    logits[2, [1, 6]] = 3.0  # a tie: the lower index first, as a stable sort
    gates, ups, downs = (rng.standard_normal((E, r, c)).astype(np.float32) for r, c in ((I, H), (I, H), (H, I)))
    mats = [w for e in range(E) for w in (gates[e], ups[e], downs[e])]
    offsets = np.cumsum([0] + [m.nbytes for m in mats])
    w8 = cuda.to_device(np.concatenate([m.view(np.uint8).reshape(-1) for m in mats]))
    table = cuda.to_device(np.array([[o, m.shape[0], m.nbytes // m.shape[0], FORMATS["f32"].code]
                                     for o, m in zip(offsets, mats)], np.int64))
    etab = cuda.to_device(np.arange(3 * E, dtype=np.int64).reshape(E, 3))
    x = rng.standard_normal((T, H)).astype(np.float32)
    norm_w = (1 + 0.2 * rng.standard_normal(H)).astype(np.float32)
    eps = np.float32(1e-6)
    experts, weights = cuda.device_array((T, k), np.int32), cuda.device_array((T, k), np.float32)
    eg, xd = cuda.device_array((T * k, I), np.float32), cuda.to_device(x)
    block = (L.lanes, L.rows)
    moe_swiglu[(-(-I // L.rows), k, T), block](w8, table, etab, cuda.to_device(logits), k, renorm, xd,
                                               cuda.to_device(norm_w), 0, eps, experts, weights, eg)
    moe_down[(-(-H // L.rows), T), block](w8, table, etab, experts, weights, eg, xd)
    got_e, got_w, got_x = experts.copy_to_host(), weights.copy_to_host(), xd.copy_to_host()
    for t in range(T):
        e, w = np.zeros(k, np.int64), np.zeros(k, np.float32)
        cpu_route(logits[t].copy(), k, renorm, e, w)
        assert list(got_e[t]) == list(e) and np.allclose(got_w[t], w, rtol=1e-6, atol=0)
        h = norm_w * (x[t] / np.sqrt(np.mean(x[t].astype(np.float64) ** 2) + 1e-6))
        want = x[t].astype(np.float64)
        for i in range(k):
            g, u = gates[e[i]] @ h, ups[e[i]] @ h
            want += w[i] * (downs[e[i]] @ (g / (1 + np.exp(-g)) * u))
        assert np.allclose(got_x[t], want, rtol=0, atol=1e-4 * np.abs(want).max()), t


def attention_want(q, kc, vc, p, window, group):
    """float64 attention of q [nh, hd] at position p over cache rows 0..p (keys j > p - window)."""
    nh, hd = q.shape
    start = 0 if window <= 0 else max(0, p - window + 1)
    out = np.empty((nh, hd))
    for h in range(nh):
        k, v = kc[start : p + 1, h // group].astype(np.float64), vc[start : p + 1, h // group].astype(np.float64)
        s = k @ q[h] / np.sqrt(hd)
        e = np.exp(s - s.max())
        out[h] = e @ v / e.sum()
    return out


def rope(v, cos, sin):
    half = v.shape[-1] // 2
    a, b = v[..., :half], v[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


# (position, window): multi-chunk keys at the GPU's 128 per chunk; windows whose first key falls
# inside a chunk, one chunk long or less, and longer than the context
ATTENTION_CASES = [(130, 0), (300, 0), (300, 200), (300, 129), (255, 128), (200, 64), (140, 1000)]


@pytest.mark.parametrize("pos,window", ATTENTION_CASES)
def test_decode_attention_at_gpu_shape(pos, window):
    """attend_one with the GPU's 128 threads a block: QK-norm off, RoPE at pos, the new k and v from
    the row (and stored), GQA (2 query heads a KV head), against float64."""
    from fuelcli.backends.cuda.kernels.attention import attend_one

    nh, nkv, hd, n_ctx = 4, 2, 16, 320
    rng = np.random.default_rng(pos + window)
    kc = rng.standard_normal((1, n_ctx, nkv, hd)).astype(np.float32)
    vc = rng.standard_normal((1, n_ctx, nkv, hd)).astype(np.float32)
    qkv = rng.standard_normal((1, (nh + 2 * nkv) * hd)).astype(np.float32)
    ang = rng.uniform(0, 2 * np.pi, (n_ctx, hd // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q = rope(qkv[0, : nh * hd].reshape(nh, hd), cos[pos], sin[pos])
    knew = rope(qkv[0, nh * hd : (nh + nkv) * hd].reshape(nkv, hd), cos[pos], sin[pos])
    vnew = qkv[0, (nh + nkv) * hd :].reshape(nkv, hd)
    kw, vw = kc[0].copy(), vc[0].copy()
    kw[pos], vw[pos] = knew, vnew
    want = attention_want(q, kw, vw, pos, window, nh // nkv)
    dk, dv, out = cuda.to_device(kc), cuda.to_device(vc), cuda.device_array((1, nh * hd), np.float32)
    attend_one[nh, GPU.attn](cuda.to_device(qkv), pos, window, nh, nkv, hd, cuda.to_device(np.zeros(1, np.float32)),
                             -1, -1, np.float32(1e-6), cuda.to_device(cos), cuda.to_device(sin), dk, dv, 0, out)
    assert np.allclose(out.copy_to_host().reshape(nh, hd), want, rtol=0, atol=1e-5)
    assert np.allclose(dk.copy_to_host()[0, pos], knew, atol=1e-6) and np.array_equal(dv.copy_to_host()[0, pos], vnew)


@pytest.mark.parametrize("pos0,window", [(126, 0), (250, 100)])
def test_prefill_attention_at_gpu_shape(pos0, window):
    """attend over the cache for 3 tokens starting at pos0 (their chunks straddle the 128-key edges),
    128 threads a block; a wrong window direction fails the same comparison (negative control)."""
    from fuelcli.backends.cuda.kernels.attention import attend

    nh, nkv, hd, n_ctx, T = 2, 1, 8, 260, 3
    rng = np.random.default_rng(pos0)
    kc = rng.standard_normal((1, n_ctx, nkv, hd)).astype(np.float32)
    vc = rng.standard_normal((1, n_ctx, nkv, hd)).astype(np.float32)
    qkv = rng.standard_normal((T, (nh + 2 * nkv) * hd)).astype(np.float32)
    out = cuda.device_array((T, nh * hd), np.float32)
    attend[(T, nh), GPU.attn](cuda.to_device(qkv), pos0, window, nh, nkv, hd, cuda.to_device(kc), cuda.to_device(vc),
                              0, out)
    got = out.copy_to_host()
    for t in range(T):
        q = qkv[t, : nh * hd].reshape(nh, hd).astype(np.float64)
        want = attention_want(q, kc[0], vc[0], pos0 + t, window, nh // nkv)
        assert np.allclose(got[t].reshape(nh, hd), want, rtol=0, atol=1e-5), t
        if window > 0:  # keys j < p + w instead of j > p - w: another set of keys
            p = pos0 + t
            flipped = attention_want(q, kc[0, :], vc[0, :], min(p + window - 1, n_ctx - 1), window, nh // nkv)
            assert not np.allclose(got[t].reshape(nh, hd), flipped, atol=1e-3)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_matmul_gpu_tile_every_format(fmt):
    """The GPU's 16 x 16 block (64 x 64 tile) over K = 256 (8 steps of TK = 32 columns, so the tile
    is reloaded), rows past a tile (a second, partial one) and tokens fewer than the tile."""
    from fuelcli.backends.cuda.kernels.matmul import MT, matmul

    n, code, N, T = 256, FORMATS[fmt].code, 66, 3
    raw = random_rows(fmt, N, n, seed=700 + code)
    w = cpu_rows(fmt, raw, n).astype(np.float64)
    x = np.random.default_rng(code).standard_normal((T, n)).astype(np.float32)
    w8, mats = upload(raw, fmt)
    out = cuda.device_array((T, N), np.float32)
    tile = GPU.tile * MT
    matmul[(-(-N // tile), 1), (GPU.tile, GPU.tile)](w8, mats, 0, cuda.to_device(x), T,
                                                      cuda.to_device(np.zeros(1, np.float32)), -1, out, 0, 0)
    tol = REL * (np.abs(x) @ np.abs(w).T) + 1e-6
    assert np.all(np.abs(out.copy_to_host() - x @ w.T) <= tol)


def test_bandwidth_probe_reads_every_word():
    """The roofline's probe (fuel bench --device cuda): each thread XORs its grid-stride share of the
    buffer, so the threads' words XOR to the buffer's, once per pass (an even number of passes
    cancels: the negative control), and the buffer's tail past the grid's first sweep is read too."""
    from fuelcli.backends.cuda import bandwidth
    from fuelcli.backends.cuda.kernels.probe import read_xor

    blocks, threads, n4 = 2, 4, 21  # 8 threads, 21 words of 16 bytes: two sweeps and a partial one
    buf = np.random.default_rng(9).integers(0, 2**32, 4 * n4, dtype=np.uint64).astype(np.uint32)
    whole = np.bitwise_xor.reduce(buf)
    out = cuda.device_array(blocks * threads, np.uint32)
    for passes, want in ((1, whole), (3, whole), (2, 0)):
        read_xor[blocks, threads](cuda.to_device(buf), n4, passes, out)
        assert np.bitwise_xor.reduce(out.copy_to_host()) == want, passes
    read_xor[blocks, threads](cuda.to_device(buf), n4 - 1, 1, out)  # a word short: another XOR
    assert np.bitwise_xor.reduce(out.copy_to_host()) != whole
    assert bandwidth.measure(16 * n4, seconds=0, blocks=blocks, threads=threads, min_call_bytes=1) > 0
