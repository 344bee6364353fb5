"""Decode (one token): stored-format matrix x vector products, fused so that a layer is few launches.

Block (lanes, rows): `lanes` threads share a row, each decoding every lanes-th unit of it and
dotting it with x; a shared-memory sum (no warp shuffles: the simulator has none) joins the lanes.
Matrices are entries of the device table `mats` (byte offset, rows, row bytes, format code).

Fusions, each saving a launch per layer:
  - RMSNorm of the input (norm_off >= 0): every block computes 1/rms(x) itself (x is a few KB) and
    dots with w * (x * inv), so the normed vector is never written;
  - several matrices in one launch (q, k and v): their rows are concatenated in `out`;
  - the bias add and the residual add (accumulate: out += W x);
  - gate and up with SiLU(gate) * up (`swiglu`); moe.py has the MoE experts' versions.
"""

import math

from numba import cuda, float32

from .common import MAX_THREADS, UNIT, block_sum, lane_sum
from .unpack import unpack


@cuda.jit(device=True)
def rms_inv(x, xrow, vecs, norm_off, eps, red, tid, nthreads):
    """1 / rms(x[xrow]) for a fused RMSNorm, or 1 when there is none."""
    if norm_off < 0:
        return float32(1.0)
    K = x.shape[1]
    ss = float32(0.0)
    for k in range(tid, K, nthreads):
        ss += x[xrow, k] * x[xrow, k]
    ss = block_sum(ss, red, tid, nthreads)
    return float32(1.0) / math.sqrt(ss / float32(K) + eps)


@cuda.jit(device=True)
def row_dot(w8, p, code, x, xrow, lane, lanes, buf):
    """This lane's share of dot(row at byte p, x[xrow])."""
    acc = float32(0.0)
    for u in range(lane, x.shape[1] // UNIT, lanes):
        unpack(code, w8, p, u * UNIT, buf)
        k = u * UNIT
        for j in range(UNIT):
            acc += buf[j] * x[xrow, k + j]
    return acc


@cuda.jit(device=True)
def row_dot_normed(w8, p, code, x, xrow, vecs, norm_off, inv, lane, lanes, buf):
    """This lane's share of dot(row at byte p, rmsnorm(x[xrow])) with the norm weight at
    vecs[norm_off:] (none when norm_off < 0), as the CPU's rmsnorm rounds: w * (x * inv)."""
    if norm_off < 0:
        return row_dot(w8, p, code, x, xrow, lane, lanes, buf)
    acc = float32(0.0)
    for u in range(lane, x.shape[1] // UNIT, lanes):
        unpack(code, w8, p, u * UNIT, buf)
        k = u * UNIT
        for j in range(UNIT):
            acc += buf[j] * (vecs[norm_off + k + j] * (x[xrow, k + j] * inv))
    return acc


@cuda.jit(cache=True)
def matvec(w8, mats, m0, nm, x, xrow, vecs, norm_off, eps, bias_off, out, accumulate):
    """out[0, n] (+)= W[n] . rmsnorm(x[xrow]) (+ bias[n]) over the rows n of matrices m0..m0+nm-1
    of `mats`, concatenated. Grid: ceil(rows / block rows)."""
    lane, row, lanes = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    tid, nthreads = row * lanes + lane, lanes * cuda.blockDim.y
    red = cuda.shared.array(MAX_THREADS, float32)
    buf = cuda.local.array(UNIT, float32)
    inv = rms_inv(x, xrow, vecs, norm_off, eps, red, tid, nthreads)
    n = cuda.blockIdx.x * cuda.blockDim.y + row
    r, mi = n, m0  # which matrix row n falls in
    while mi < m0 + nm - 1 and r >= mats[mi, 1]:
        r -= mats[mi, 1]
        mi += 1
    live = r < mats[mi, 1]
    acc = float32(0.0)
    if live:
        acc = row_dot_normed(w8, mats[mi, 0] + r * mats[mi, 2], mats[mi, 3], x, xrow, vecs, norm_off, inv,
                              lane, lanes, buf)
    s = lane_sum(acc, red, lane, row, lanes)
    if live and lane == 0:
        if bias_off >= 0:
            s += vecs[bias_off + n]
        if accumulate:
            out[0, n] += s
        else:
            out[0, n] = s


@cuda.jit(device=True)
def silu_times(g, u):
    return g / (float32(1.0) + math.exp(-g)) * u


@cuda.jit(cache=True)
def swiglu(w8, mats, mg, mu, x, xrow, vecs, norm_off, eps, out):
    """out[0, n] = silu(G[n] . h) * (U[n] . h), h = rmsnorm(x[xrow]): the dense FFN's first half."""
    lane, row, lanes = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
    tid, nthreads = row * lanes + lane, lanes * cuda.blockDim.y
    red = cuda.shared.array(MAX_THREADS, float32)
    buf = cuda.local.array(UNIT, float32)
    inv = rms_inv(x, xrow, vecs, norm_off, eps, red, tid, nthreads)
    n = cuda.blockIdx.x * cuda.blockDim.y + row
    live = n < mats[mg, 1]
    g = float32(0.0)
    u = float32(0.0)
    if live:
        g = row_dot_normed(w8, mats[mg, 0] + n * mats[mg, 2], mats[mg, 3], x, xrow, vecs, norm_off, inv, lane,
                            lanes, buf)
        u = row_dot_normed(w8, mats[mu, 0] + n * mats[mu, 2], mats[mu, 3], x, xrow, vecs, norm_off, inv, lane,
                            lanes, buf)
    g = lane_sum(g, red, lane, row, lanes)
    u = lane_sum(u, red, lane, row, lanes)
    if live and lane == 0:
        out[0, n] = silu_times(g, u)
