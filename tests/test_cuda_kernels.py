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
    w8 = cuda.to_device(np.ascontiguousarray(raw).reshape(-1))
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
    take_rows[3, SIMULATOR.row](w8, 0, raw.shape[1], FORMATS[fmt].code, cuda.to_device(rows), -1, out)
    got = out.copy_to_host()
    one = cuda.device_array((1, n), np.float32)  # a decode step passes the row as a scalar
    take_rows[1, SIMULATOR.row](w8, 0, raw.shape[1], FORMATS[fmt].code, cuda.to_device(rows), 5, one)
    if cuda_sim.SIMULATOR:
        assert np.array_equal(got, want[rows]) and np.array_equal(one.copy_to_host()[0], want[5])
    else:
        tol = 2 * np.finfo(np.float32).eps * np.abs(want).max(axis=1, keepdims=True)
        assert np.all(np.abs(got - want[rows]) <= tol[rows]) and np.all(np.abs(one.copy_to_host()[0] - want[5]) <= tol[5])


def test_a_wrong_decode_is_caught():
    """Negative control: q4_0 rows read as q4_1 (same nibbles, another block size) differ."""
    from fuelcli.backends.cuda.kernels.dequant import take_rows

    raw = random_rows("q4_0", 2, 256, seed=3)
    want = cpu_rows("q4_0", raw, 256)
    w8, _ = upload(raw, "q4_0")
    out = cuda.device_array((1, 256), np.float32)
    take_rows[1, SIMULATOR.row](w8, 0, raw.shape[1], FORMATS["q4_1"].code, cuda.to_device(np.zeros(1, np.int32)),
                                0, out)
    assert not np.allclose(out.copy_to_host()[0], want[0], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("launch", list(LAUNCHES))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_matvec_equals_a_dot_of_the_decoded_rows(fmt, launch):
    from fuelcli.backends.cuda.kernels.matvec import matvec

    L, n, code = LAUNCHES[launch], ncols(fmt), FORMATS[fmt].code
    raw = random_rows(fmt, 8 if launch == "gpu shape" else 12, n, seed=200 + code)
    x = np.random.default_rng(code).standard_normal((2, n)).astype(np.float32)
    want = cpu_rows(fmt, raw, n).astype(np.float64) @ x[1].astype(np.float64)
    mag = np.abs(cpu_rows(fmt, raw, n)).astype(np.float64) @ np.abs(x[1])
    w8, mats = upload(raw, fmt)
    out = cuda.to_device(np.full((2, raw.shape[0]), np.nan, np.float32))
    vecs = cuda.to_device(np.zeros(1, np.float32))
    blocks = -(-raw.shape[0] // L.rows)
    matvec[blocks, (L.lanes, L.rows)](w8, mats, 0, 1, cuda.to_device(x), 1, vecs, -1, np.float32(0), -1, out, 0)
    got = out.copy_to_host()
    assert np.all(np.abs(got[0] - want) <= REL * mag), np.max(np.abs(got[0] - want) / mag)
    assert np.isnan(got[1]).all()  # the other row untouched


def test_matvec_fusions():
    """RMSNorm of the input, three matrices in one launch (q|k|v), bias and residual add."""
    from fuelcli.backends.cuda.kernels.matvec import matvec

    n, L = 256, SIMULATOR
    fmts = ["q4_k", "q6_k", "q8_0"]
    raws = [random_rows(f, r, n, seed=300 + i) for i, (f, r) in enumerate(zip(fmts, [6, 3, 3]))]
    offsets = np.cumsum([0] + [-(-r.nbytes // 256) * 256 for r in raws])
    buf = np.zeros(offsets[-1], np.uint8)
    for o, r in zip(offsets, raws):
        buf[o : o + r.nbytes] = r.reshape(-1)
    mats = np.array([[o, r.shape[0], r.shape[1], FORMATS[f].code] for o, r, f in zip(offsets, raws, fmts)], np.int64)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, n)).astype(np.float32)
    norm_w, bias = (1 + 0.2 * rng.standard_normal(n)).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    vecs = np.concatenate([np.zeros(5, np.float32), norm_w, bias])  # offsets 5 and 5 + n
    eps = np.float32(1e-6)
    inv = np.float32(1) / np.sqrt(np.float32((x[0] * x[0]).sum()) / np.float32(n) + eps)
    h = norm_w * (x[0] * inv)
    w = np.concatenate([cpu_rows(f, r, n) for f, r in zip(fmts, raws)]).astype(np.float64)
    start = rng.standard_normal((1, 12)).astype(np.float32)
    want = start + (w @ h + bias)
    out = cuda.to_device(start)
    matvec[-(-12 // L.rows), (L.lanes, L.rows)](cuda.to_device(buf), cuda.to_device(mats), 0, 3, cuda.to_device(x), 0,
                                                 cuda.to_device(vecs), 5, eps, 5 + n, out, 1)
    assert np.allclose(out.copy_to_host(), want, rtol=0, atol=REL * (np.abs(w) @ np.abs(h)).max())


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


def test_matmul_gpu_tile():
    """The GPU's 16 x 16 block (64 x 64 tile) on one tile step."""
    from fuelcli.backends.cuda.kernels.matmul import matmul

    rng = np.random.default_rng(1)
    w = rng.standard_normal((70, 32)).astype(np.float32)  # 70 rows: a second, partial tile
    x = rng.standard_normal((3, 32)).astype(np.float32)
    w8, mats = upload(w.view(np.uint8), "f32")
    out = cuda.device_array((3, 70), np.float32)
    matmul[(2, 1), (GPU.tile, GPU.tile)](w8, mats, 0, cuda.to_device(x), 3, cuda.to_device(np.zeros(1, np.float32)),
                                         -1, out, 0, 0)
    assert np.allclose(out.copy_to_host(), x.astype(np.float64) @ w.T, rtol=0, atol=1e-5)


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
    from fuelcli.backends.cpu.forward import route as cpu_route
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
