"""Decode (one token): stored-format matrix x vector products, one kernel per weight format.

A decode step streams every weight once, so these kernels are built for bandwidth:
  - one kernel per format (`matvec_kernel(code)`, `swiglu_kernel(gate code, up code)`): the format is a
    closure constant, so NVVM folds the branch to one format's code (its registers, not the sum of
    all nine formats'), and the CUDA cache keeps one entry per format;
  - a lane reads its share of a row as whole words: 16-byte `ld.global.nc.v4` for Q4_K and the float
    formats, 4-byte words for Q4_1, 2-byte halves where a format's blocks are only 2-byte aligned
    (Q8_0, Q4_0, Q5_0, Q6_K: 34, 18, 22 and 210-byte blocks), never single bytes; the activations
    as 16-byte float4s;
  - quantized values become floats by a bit trick (q | 0x4B000000 is the float 2^23 + q; one FADD
    takes the offset and the format's zero point away, exactly) instead of int-to-float conversions,
    which run at a quarter of the FMA rate;
  - a block is (lanes, rows) threads, one warp per row on a GPU; a row's lanes are summed with warp
    shuffles (tests/cuda_sim.py gives the simulator, which has none, a shuffle on shared memory);
  - the RMSNorm is computed once per input, not in every block: the kernel that adds to the residual
    stream (o_proj, down) normalises it for the next product in its last block to finish (a counter
    in `done`, threadfence-ordered), writing `xn`; the products read `xn`.

Every element is decoded with the float operations of the numpy decode (formats/): w = d * q - m
(d * (q - zero) and q * d as the m = 0 case, d * q + m as m negated), so a weight is what the CPU's
dequant gives; the sums run in another order than a float64 dot (tests/test_cuda_kernels.py: the
measured error). Matrices are entries of the device table `mats` (byte offset, rows, row bytes, code).
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int8, int32, uint32

from ....formats import BF16, F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0
from .common import MAX_THREADS, UNIT, block_sum, f16_bits
from .ptxops import f32_bits, ldg, ldg4, ldl2
from .unpack import unpack

LF32, LF16, LBF16 = F32.layout, F16.layout, BF16.layout
L8, L40, L41, L50, L51 = Q8_0.layout, Q4_0.layout, Q4_1.layout, Q5_0.layout, Q5_1.layout
L4K, L6K = Q4_K.layout, Q6_K.layout
MAGIC = 0x4B000000  # the bits of the float 2^23: MAGIC | q (q < 2^23) is 2^23 + q exactly
TWO23 = 8388608.0
FULL = 0xFFFFFFFF
# elements a lane decodes per step: its loads are whole words of one block (and one scale)
UNIT_ELEMS = {LF32.code: 8, LF16.code: 8, LBF16.code: 8, L8.code: 8, L40.code: 8, L41.code: 8, L50.code: 8,
              L51.code: 8, L4K.code: 32, L6K.code: 16}  # any other format: UNIT (dot_units)


@cuda.jit(device=True)
def qf(v, zero):
    """The float of the small non-negative int v minus zero, exactly: (2^23 + v) - (2^23 + zero)."""
    return f32_bits(uint32(v) | uint32(MAGIC)) - float32(TWO23 + zero)


@cuda.jit(device=True)
def fma4(acc, v0, v1, v2, v3, zero, d, m, xr, k):
    """acc + sum over i of (d * (v_i - zero) - m) * x[k + i] (the float of each v_i exact)."""
    x0, x1, x2, x3 = ldg4(xr, k)
    acc += (d * qf(v0, zero) - m) * x0
    acc += (d * qf(v1, zero) - m) * x1
    acc += (d * qf(v2, zero) - m) * x2
    acc += (d * qf(v3, zero) - m) * x3
    return acc


@cuda.jit(device=True)
def nibbles4(acc, word, shift, zero, d, m, xr, k):
    """The four nibbles at bit `shift` of word's bytes, as elements k..k+3."""
    return fma4(acc, (word >> shift) & 15, (word >> (shift + 8)) & 15, (word >> (shift + 16)) & 15,
                (word >> (shift + 24)) & 15, zero, d, m, xr, k)


@cuda.jit(device=True)
def half2_word(w16, i):
    """Two 2-byte loads as one little-endian word (blocks that are only 2-byte aligned)."""
    return uint32(ldg(w16, i)) | (uint32(ldg(w16, i + 1)) << uint32(16))


# ---------------------------------------------------------------- one lane's share of a row, per format
# p: the row's byte offset in w8; xr: the activations (1-D f32, the row's length); units u = lane,
# lane + lanes, ... of UNIT_ELEMS[code] elements each.

@cuda.jit(device=True)
def dot_f32(w8, p, xr, lane, lanes):
    wf = w8.view(np.float32)
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 8, lanes):
        k = 8 * u
        a0, a1, a2, a3 = ldg4(wf, p // 4 + k)
        b0, b1, b2, b3 = ldg4(wf, p // 4 + k + 4)
        x0, x1, x2, x3 = ldg4(xr, k)
        y0, y1, y2, y3 = ldg4(xr, k + 4)
        acc += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3 + b0 * y0 + b1 * y1 + b2 * y2 + b3 * y3
    return acc


@cuda.jit(device=True)
def dot_halves(w8, p, xr, lane, lanes, bf):
    """f16 (bf = False) or bf16: 8 elements a step from one 16-byte load."""
    w32 = w8.view(np.uint32)
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 8, lanes):
        k = 8 * u
        q0, q1, q2, q3 = ldg4(w32, p // 4 + 4 * u)
        x0, x1, x2, x3 = ldg4(xr, k)
        y0, y1, y2, y3 = ldg4(xr, k + 4)
        if bf:  # bf16 is the top half of an f32
            acc += (f32_bits(q0 << uint32(16)) * x0 + f32_bits(q0 & uint32(0xFFFF0000)) * x1
                    + f32_bits(q1 << uint32(16)) * x2 + f32_bits(q1 & uint32(0xFFFF0000)) * x3
                    + f32_bits(q2 << uint32(16)) * y0 + f32_bits(q2 & uint32(0xFFFF0000)) * y1
                    + f32_bits(q3 << uint32(16)) * y2 + f32_bits(q3 & uint32(0xFFFF0000)) * y3)
        else:
            acc += (f16_bits(q0 & uint32(0xFFFF)) * x0 + f16_bits(q0 >> uint32(16)) * x1
                    + f16_bits(q1 & uint32(0xFFFF)) * x2 + f16_bits(q1 >> uint32(16)) * x3
                    + f16_bits(q2 & uint32(0xFFFF)) * y0 + f16_bits(q2 >> uint32(16)) * y1
                    + f16_bits(q3 & uint32(0xFFFF)) * y2 + f16_bits(q3 >> uint32(16)) * y3)
    return acc


@cuda.jit(device=True)
def dot_q8_0(w8, p, xr, lane, lanes):
    """4 steps a block: 8 int8 from four 2-byte loads; x = q * d (the int8 as (byte ^ 128) - 128)."""
    L = L8
    w16 = w8.view(np.uint16)
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 8, lanes):
        blk, j = u // 4, u % 4
        b = p + blk * L.block_bytes
        d = f16_bits(ldg(w16, (b + L.d) // 2))
        lo = half2_word(w16, (b + L.qs + 8 * j) // 2) ^ uint32(0x80808080)
        hi = half2_word(w16, (b + L.qs + 8 * j) // 2 + 2) ^ uint32(0x80808080)
        k = blk * L.block_elems + 8 * j
        acc = fma4(acc, lo & 255, (lo >> 8) & 255, (lo >> 16) & 255, lo >> 24, 128, d, float32(0.0), xr, k)
        acc = fma4(acc, hi & 255, (hi >> 8) & 255, (hi >> 16) & 255, hi >> 24, 128, d, float32(0.0), xr, k + 4)
    return acc


@cuda.jit(device=True)
def dot_q4_0(w8, p, xr, lane, lanes):
    """4 steps a block: qs bytes 4j..4j+3 hold elements 4j.. (low nibbles) and 16 + 4j.. (high)."""
    L = L40
    w16 = w8.view(np.uint16)
    half = L.block_elems // 2
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 8, lanes):
        blk, j = u // 4, u % 4
        b = p + blk * L.block_bytes
        d = f16_bits(ldg(w16, (b + L.d) // 2))
        q = half2_word(w16, (b + L.qs + 4 * j) // 2)
        k = blk * L.block_elems + 4 * j
        acc = nibbles4(acc, q, 0, L.zero, d, float32(0.0), xr, k)
        acc = nibbles4(acc, q, 4, L.zero, d, float32(0.0), xr, k + half)
    return acc


@cuda.jit(device=True)
def dot_q4_1(w8, p, xr, lane, lanes):
    """As q4_0 with x = d * q + m; 20-byte blocks: the qs words are 4-byte aligned."""
    L = L41
    w16 = w8.view(np.uint16)
    w32 = w8.view(np.uint32)
    half = L.block_elems // 2
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 8, lanes):
        blk, j = u // 4, u % 4
        b = p + blk * L.block_bytes
        d = f16_bits(ldg(w16, (b + L.d) // 2))
        m = -f16_bits(ldg(w16, (b + L.m) // 2))
        q = ldg(w32, (b + L.qs) // 4 + j)
        k = blk * L.block_elems + 4 * j
        acc = nibbles4(acc, q, 0, 0, d, m, xr, k)
        acc = nibbles4(acc, q, 4, 0, d, m, xr, k + half)
    return acc


@cuda.jit(device=True)
def dot_q5_0(w8, p, xr, lane, lanes):
    """As q4_0 with element e's fifth bit at bit e of the block's 32-bit qh."""
    L = L50
    w16 = w8.view(np.uint16)
    half = L.block_elems // 2
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 8, lanes):
        blk, j = u // 4, u % 4
        b = p + blk * L.block_bytes
        d = f16_bits(ldg(w16, (b + L.d) // 2))
        qh = half2_word(w16, (b + L.qh) // 2)
        q = half2_word(w16, (b + L.qs + 4 * j) // 2)
        lo = qh >> uint32(4 * j)  # bits of elements 4j..4j+3
        hi = qh >> uint32(half + 4 * j)
        k = blk * L.block_elems + 4 * j
        acc = fma4(acc, (q & 15) | ((lo & 1) << 4), ((q >> 8) & 15) | (((lo >> 1) & 1) << 4),
                   ((q >> 16) & 15) | (((lo >> 2) & 1) << 4), ((q >> 24) & 15) | (((lo >> 3) & 1) << 4),
                   L.zero, d, float32(0.0), xr, k)
        acc = fma4(acc, ((q >> 4) & 15) | ((hi & 1) << 4), ((q >> 12) & 15) | (((hi >> 1) & 1) << 4),
                   ((q >> 20) & 15) | (((hi >> 2) & 1) << 4), ((q >> 28) & 15) | (((hi >> 3) & 1) << 4),
                   L.zero, d, float32(0.0), xr, k + half)
    return acc


@cuda.jit(device=True)
def dot_q5_1(w8, p, xr, lane, lanes):
    """As q4_1 (24-byte blocks: 4-byte words) with element e's fifth bit at bit e of qh."""
    L = L51
    w16 = w8.view(np.uint16)
    w32 = w8.view(np.uint32)
    half = L.block_elems // 2
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 8, lanes):
        blk, j = u // 4, u % 4
        b = p + blk * L.block_bytes
        d = f16_bits(ldg(w16, (b + L.d) // 2))
        m = -f16_bits(ldg(w16, (b + L.m) // 2))
        qh = ldg(w32, (b + L.qh) // 4)
        q = ldg(w32, (b + L.qs) // 4 + j)
        lo = qh >> uint32(4 * j)  # bits of elements 4j..4j+3
        hi = qh >> uint32(half + 4 * j)
        k = blk * L.block_elems + 4 * j
        acc = fma4(acc, (q & 15) | ((lo & 1) << 4), ((q >> 8) & 15) | (((lo >> 1) & 1) << 4),
                   ((q >> 16) & 15) | (((lo >> 2) & 1) << 4), ((q >> 24) & 15) | (((lo >> 3) & 1) << 4),
                   0, d, m, xr, k)
        acc = fma4(acc, ((q >> 4) & 15) | ((hi & 1) << 4), ((q >> 12) & 15) | (((hi >> 1) & 1) << 4),
                   ((q >> 20) & 15) | (((hi >> 2) & 1) << 4), ((q >> 28) & 15) | (((hi >> 3) & 1) << 4),
                   0, d, m, xr, k + half)
    return acc


@cuda.jit(device=True)
def k4_scale_byte(s0, s1, s2, i):
    """Byte i of a Q4_K block's 12 scale bytes, held as three words."""
    word = s0 if i < 4 else (s1 if i < 8 else s2)
    return int32((word >> uint32(8 * (i % 4))) & uint32(255))


@cuda.jit(device=True)
def k4_scale_min(s0, s1, s2, i):
    """Sub-block i's 6-bit (scale, min) (get_scale_min_k4), from the scale words."""
    if i < 4:
        return k4_scale_byte(s0, s1, s2, i) & 63, k4_scale_byte(s0, s1, s2, i + 4) & 63
    s = (k4_scale_byte(s0, s1, s2, i + 4) & 15) | ((k4_scale_byte(s0, s1, s2, i - 4) >> 6) << 4)
    m = (k4_scale_byte(s0, s1, s2, i + 4) >> 4) | ((k4_scale_byte(s0, s1, s2, i) >> 6) << 4)
    return s, m


@cuda.jit(device=True)
def dot_q4_k(w8, p, xr, lane, lanes):
    """8 steps a block, each one 16-byte piece j of qs (two loads of 16 bytes: the block's header
    and the piece): qs chunk c = j // 2 holds sub-block 2c in its low nibbles and 2c + 1 in its high
    ones, element 64c + t and 64c + 32 + t for byte t of the chunk. x = (d * sc) * q - dmin * m."""
    L = L4K
    w32 = w8.view(np.uint32)
    per = L.block_elems // 32  # steps a block
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 32, lanes):
        blk, j = u // per, u % per
        b = (p + blk * L.block_bytes) // 4
        h, s0, s1, s2 = ldg4(w32, b)  # d | dmin, then the 12 scale bytes (L.d, L.dmin = 0, 2; L.scales = 4)
        q0, q1, q2, q3 = ldg4(w32, b + L.qs // 4 + 4 * j)
        c = j // 2
        sc, mn = k4_scale_min(s0, s1, s2, 2 * c)
        d = f16_bits(h & uint32(0xFFFF))
        dmin = f16_bits(h >> uint32(16))
        d0, m0 = d * float32(sc), dmin * float32(mn)
        sc, mn = k4_scale_min(s0, s1, s2, 2 * c + 1)
        d1, m1 = d * float32(sc), dmin * float32(mn)
        k = blk * L.block_elems + 2 * L.sub_elems * c + 16 * (j % 2)
        acc = nibbles4(acc, q0, 0, 0, d0, m0, xr, k)
        acc = nibbles4(acc, q1, 0, 0, d0, m0, xr, k + 4)
        acc = nibbles4(acc, q2, 0, 0, d0, m0, xr, k + 8)
        acc = nibbles4(acc, q3, 0, 0, d0, m0, xr, k + 12)
        k += L.sub_elems
        acc = nibbles4(acc, q0, 4, 0, d1, m1, xr, k)
        acc = nibbles4(acc, q1, 4, 0, d1, m1, xr, k + 4)
        acc = nibbles4(acc, q2, 4, 0, d1, m1, xr, k + 8)
        acc = nibbles4(acc, q3, 4, 0, d1, m1, xr, k + 12)
    return acc


@cuda.jit(device=True)
def q6_word(lo, qh, lo_shift, hi_shift):
    """The 6-bit values of four elements: 4 bits of lo's bytes at lo_shift, 2 of qh's at hi_shift."""
    v = ((lo >> lo_shift) & uint32(0x0F0F0F0F)) | (((qh >> hi_shift) & uint32(0x03030303)) << uint32(4))
    return v & 255, (v >> 8) & 255, (v >> 16) & 255, v >> 24


@cuda.jit(device=True)
def dot_q6_k(w8, p, xr, lane, lanes):
    """16 steps a block: step (h, g) takes elements 128h + 32k + 4g.. (k < 4: four 4-element runs,
    each with its own scale) from ql words at 64h + 4g (k = 0, 2) and 64h + 32 + 4g (k = 1, 3) and
    the qh word at 32h + 4g; 2-byte loads (210-byte blocks). x = (d * scale) * (q - 32)."""
    L = L6K
    w16 = w8.view(np.uint16)
    quarter = L.half // 4
    per = L.block_elems // 16
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // 16, lanes):
        blk, r = u // per, u % per
        h, l0 = r // (per // 2), 4 * (r % (per // 2))
        b = p + blk * L.block_bytes
        d = f16_bits(ldg(w16, (b + L.d) // 2))
        ql_a = half2_word(w16, (b + L.ql + h * (L.half // 2) + l0) // 2)
        ql_b = half2_word(w16, (b + L.ql + h * (L.half // 2) + quarter + l0) // 2)
        qh = half2_word(w16, (b + L.qh + h * quarter + l0) // 2)
        sub = b + L.scales + h * (L.half // L.sub_elems) + l0 // L.sub_elems
        k = blk * L.block_elems + h * L.half + l0
        for kk in range(4):
            ds = d * float32(int8(ldg(w8, sub + 2 * kk)))
            v0, v1, v2, v3 = q6_word(ql_b if kk & 1 else ql_a, qh, uint32(4 * (kk >> 1)), uint32(2 * kk))
            acc = fma4(acc, v0, v1, v2, v3, L.zero, ds, float32(0.0), xr, k + quarter * kk)
    return acc


@cuda.jit(device=True)
def dot_units(code, w8, p, xr, lane, lanes):
    """A format without a word-level dot above: its unit decoder's UNIT elements at a time (byte
    loads; correct for every format, not built for bandwidth)."""
    buf = cuda.local.array(UNIT, float32)
    acc = float32(0.0)
    for u in range(lane, xr.shape[0] // UNIT, lanes):
        unpack(code, w8, p, u * UNIT, buf)
        for j in range(UNIT):
            acc += buf[j] * xr[u * UNIT + j]
    return acc


@cuda.jit(device=True)
def lane_dot(code, w8, p, xr, lane, lanes):
    """This lane's share of dot(row at byte p, xr). `code` is a compile-time constant in every
    kernel below, so one branch is left."""
    if code == L4K.code:
        return dot_q4_k(w8, p, xr, lane, lanes)
    if code == L6K.code:
        return dot_q6_k(w8, p, xr, lane, lanes)
    if code == L50.code:
        return dot_q5_0(w8, p, xr, lane, lanes)
    if code == L51.code:
        return dot_q5_1(w8, p, xr, lane, lanes)
    if code == L8.code:
        return dot_q8_0(w8, p, xr, lane, lanes)
    if code == L41.code:
        return dot_q4_1(w8, p, xr, lane, lanes)
    if code == L40.code:
        return dot_q4_0(w8, p, xr, lane, lanes)
    if code == LBF16.code:
        return dot_halves(w8, p, xr, lane, lanes, True)
    if code == LF16.code:
        return dot_halves(w8, p, xr, lane, lanes, False)
    if code == LF32.code:
        return dot_f32(w8, p, xr, lane, lanes)
    return dot_units(code, w8, p, xr, lane, lanes)


@cuda.jit(device=True)
def lane_sum(v, lanes):
    """Sum over the `lanes` (a power of two <= 32) threads of a row, in its lane 0; every thread of
    the warp must call it."""
    w = lanes // 2
    while w > 0:
        v += cuda.shfl_down_sync(FULL, v, w)
        w //= 2
    return v


@cuda.jit(device=True)
def norm_epilogue(out, vecs, norm_off, eps, xn, done, tid, nthreads):
    """After this block's writes to out: the last block of the launch to finish writes
    xn = RMSNorm(out) * vecs[norm_off:] (the next product's input) and resets the counter.
    Every thread of the block must call it."""
    red = cuda.shared.array(MAX_THREADS, float32)
    last = cuda.shared.array(1, int32)
    cuda.threadfence()  # this block's out writes are visible to the block that counts last
    cuda.syncthreads()
    if tid == 0:
        last[0] = cuda.atomic.add(done, 0, 1) == cuda.gridDim.x - 1
    cuda.syncthreads()
    if last[0]:
        H = out.shape[0]
        ss = float32(0.0)
        for k in range(tid, H, nthreads):
            v = ldl2(out, k)  # from L2: other blocks wrote it, this SM's L1 may hold older lines
            ss += v * v
        ss = block_sum(ss, red, tid, nthreads)
        inv = float32(1.0) / math.sqrt(ss / float32(H) + eps)
        for k in range(tid, H, nthreads):
            xn[k] = vecs[norm_off + k] * (ldl2(out, k) * inv)
        if tid == 0:
            done[0] = 0


@lru_cache(maxsize=None)
def matvec_kernel(code: int):
    """The decode product for weight format `code`:
    out[n] (+)= W[n] . x (+ bias[n]) over the rows n of matrices m0..m0+nm-1 of `mats` (all of this
    format), concatenated; with norm_off >= 0, then xn = RMSNorm(out) * vecs[norm_off:] (norm_epilogue;
    `done` an int32 [1] counter at 0). x, out, xn 1-D. Grid ceil(rows / block rows), block (lanes, rows)."""

    @cuda.jit(cache=True)
    def matvec(w8, mats, m0, nm, x, vecs, bias_off, out, accumulate, norm_off, eps, xn, done):
        lane, row, lanes = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
        n = cuda.blockIdx.x * cuda.blockDim.y + row
        r, mi = n, m0  # which matrix row n falls in
        while mi < m0 + nm - 1 and r >= mats[mi, 1]:
            r -= mats[mi, 1]
            mi += 1
        live = r < mats[mi, 1]
        acc = float32(0.0)
        if live:
            acc = lane_dot(code, w8, mats[mi, 0] + r * mats[mi, 2], x, lane, lanes)
        s = lane_sum(acc, lanes)
        if live and lane == 0:
            if bias_off >= 0:
                s += vecs[bias_off + n]
            if accumulate:
                out[n] += s
            else:
                out[n] = s
        if norm_off >= 0:
            norm_epilogue(out, vecs, norm_off, eps, xn, done, row * lanes + lane, lanes * cuda.blockDim.y)

    return matvec


@cuda.jit(device=True)
def silu_times(g, u):
    return g / (float32(1.0) + math.exp(-g)) * u


@lru_cache(maxsize=None)
def swiglu_kernel(code_gate: int, code_up: int):
    """The dense FFN's first half for gate / up formats: out[n] = silu(G[n] . x) * (U[n] . x), 1-D x, out.
    Grid ceil(rows / block rows), block (lanes, rows)."""

    @cuda.jit(cache=True)
    def swiglu(w8, mats, mg, mu, x, out):
        lane, row, lanes = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x
        n = cuda.blockIdx.x * cuda.blockDim.y + row
        live = n < mats[mg, 1]
        g = float32(0.0)
        u = float32(0.0)
        if live:
            g = lane_dot(code_gate, w8, mats[mg, 0] + n * mats[mg, 2], x, lane, lanes)
            u = lane_dot(code_up, w8, mats[mu, 0] + n * mats[mu, 2], x, lane, lanes)
        g = lane_sum(g, lanes)
        u = lane_sum(u, lanes)
        if live and lane == 0:
            out[n] = silu_times(g, u)

    return swiglu
