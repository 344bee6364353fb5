"""The delta rule of linear_mixer.py for a prompt's rows: CHUNK rows at a time, in matrix products
(transformers' torch_chunk_gated_delta_rule, assembly/delta_rule.chunked), where the recurrence
makes two passes of rank-1 work over every head's [dk, dv] state per row.

Per value head and chunk of n rows (cum: the running sum of g within the chunk; beta, q and k as in
the recurrence):

    U = (I + A)^-1 R,   A[i, j] = beta_i (k_i . k_j) exp(cum_i - cum_j) for j < i,
                        R_i = beta_i (v_i - exp(cum_i) S^T k_i)
    o_i = exp(cum_i) S^T q_i + sum_{j <= i} (q_i . k_j) exp(cum_i - cum_j) U_j
    S  <- exp(cum_n) S + sum_i exp(cum_n - cum_i) k_i U_i^T

U holds the recurrence's beta (v - S^T k) of each row. Every product is `_nt` (both operands' rows
along the summed index), so the head's state is held transposed while its chunks run. The chunks
start at the segment's first row, as transformers' start at the prompt's; the last one holds the
rows left (transformers pads it with zero rows, which changes nothing).
"""

import numpy as np
from numba import njit, prange

from .jit import PARALLEL, helper
from .linear_mixer import _gated_norm, _l2norm_scaled, _sigmoid, _softplus

CHUNK = 64  # transformers' chunk_size


@njit(**PARALLEL)
def delta_rule_chunked(qkv, z, b, a, a_log, dt_bias, norm_w, state, pos0, k_heads, dk, dv, eps, out):
    """linear_mixer.delta_rule's arguments and results (out, and the state after the last row)."""
    if pos0 == 0:
        state[:, :, :] = 0
    for h in prange(state.shape[0]):
        _chunked_head(qkv, z, b, a, a_log, dt_bias, norm_w, state[h], h, state.shape[0] // k_heads, k_heads * dk,
                      dk, dv, eps, out)


@helper()
def _chunked_head(qkv, z, b, a, a_log, dt_bias, norm_w, S, h, group, key_dim, dk, dv, eps, out):
    f32 = np.float32
    st = np.ascontiguousarray(S.T)  # [dv, dk]
    q, k = np.empty((CHUNK, dk), f32), np.empty((CHUNK, dk), f32)
    k_t = np.empty((dk, CHUNK), f32)
    r, r_t, u_t = np.empty((CHUNK, dv), f32), np.empty((dv, CHUNK), f32), np.empty((dv, CHUNK), f32)
    system, scores, inverse = np.empty((CHUNK, CHUNK), f32), np.empty((CHUNK, CHUNK), f32), np.empty((CHUNK, CHUNK), f32)
    cum, beta, growth = np.empty(CHUNK, f32), np.empty(CHUNK, f32), np.empty(CHUNK, f32)
    scale = f32(1.0) / np.sqrt(f32(dk))
    kk = h // group
    v0 = 2 * key_dim + h * dv
    rate = -np.exp(a_log[h])
    T = qkv.shape[0]
    for c0 in range(0, T, CHUNK):
        n = min(CHUNK, T - c0)
        o = out[c0:c0 + n, h * dv:(h + 1) * dv]
        total = f32(0.0)
        for i in range(n):
            t = c0 + i
            _l2norm_scaled(qkv[t], kk * dk, dk, scale, q[i])
            _l2norm_scaled(qkv[t], key_dim + kk * dk, dk, f32(1.0), k[i])
            total += rate * _softplus(a[t, h] + dt_bias[h])
            cum[i] = total
            growth[i] = np.exp(total)
            beta[i] = _sigmoid(b[t, h])
        _nt(k, st, r, n, dv, dk, f32(0.0))  # S^T k_i, row i
        _nt(q, st, o, n, dv, dk, f32(0.0))  # S^T q_i
        for i in range(n):
            v = qkv[c0 + i, v0:v0 + dv]
            for c in range(dv):
                r[i, c] = beta[i] * (v[c] - growth[i] * r[i, c])
                o[i, c] *= growth[i]
        for c in range(dv):
            for i in range(n):
                r_t[c, i] = r[i, c]
        _nt(k, k, system, n, n, dk, f32(0.0))
        _nt(q, k, scores, n, n, dk, f32(0.0))
        for i in range(n):
            for j in range(n):
                if j <= i:
                    d = np.exp(cum[i] - cum[j])
                    system[i, j] *= beta[i] * d
                    scores[i, j] *= d
                else:
                    scores[i, j] = 0
        # inverse = (I + A)^-1, A = system's strictly lower part: row i from the rows before it
        for i in range(n):
            row = inverse[i]
            row[:n] = 0
            row[i] = 1
            for j in range(i):
                coef = -system[i, j]
                for m in range(j + 1):
                    row[m] += coef * inverse[j, m]
        _nt(r_t, inverse, u_t, dv, n, n, f32(0.0))  # U^T
        _nt(scores, u_t, o, n, dv, n, f32(1.0))  # the chunk's own rows' part of o
        for i in range(n):
            t = c0 + i
            _gated_norm(out[t, h * dv:(h + 1) * dv], z[t, h * dv:(h + 1) * dv], norm_w, dv, eps)
        last = cum[n - 1]
        for i in range(n):
            w = np.exp(last - cum[i])
            for x in range(dk):
                k_t[x, i] = k[i, x] * w
        _nt(u_t, k_t, st, dv, dk, n, np.exp(last))
    S[:, :] = st.T


@helper()
def _nt(a, b, c, m, n, length, beta):
    """c[i, j] = beta c[i, j] + a[i, :length] . b[j, :length] for i < m, j < n (beta 0: c is not
    read). Tiles of 4 x 4 sums, the summed index innermost: 16 vector accumulators, each load used
    four times."""
    m4, n4 = m - m % 4, n - n % 4
    for i in range(0, m4, 4):
        a0, a1, a2, a3 = a[i], a[i + 1], a[i + 2], a[i + 3]
        for j in range(0, n4, 4):
            b0, b1, b2, b3 = b[j], b[j + 1], b[j + 2], b[j + 3]
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = np.float32(0.0)
            s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = np.float32(0.0)
            for x in range(length):
                x0, x1, x2, x3 = a0[x], a1[x], a2[x], a3[x]
                y0, y1, y2, y3 = b0[x], b1[x], b2[x], b3[x]
                s00 += x0 * y0
                s01 += x0 * y1
                s02 += x0 * y2
                s03 += x0 * y3
                s10 += x1 * y0
                s11 += x1 * y1
                s12 += x1 * y2
                s13 += x1 * y3
                s20 += x2 * y0
                s21 += x2 * y1
                s22 += x2 * y2
                s23 += x2 * y3
                s30 += x3 * y0
                s31 += x3 * y1
                s32 += x3 * y2
                s33 += x3 * y3
            _put4(c, i, j, beta, s00, s01, s02, s03)
            _put4(c, i + 1, j, beta, s10, s11, s12, s13)
            _put4(c, i + 2, j, beta, s20, s21, s22, s23)
            _put4(c, i + 3, j, beta, s30, s31, s32, s33)
    for i in range(m):  # the edges: rows past m4 whole, columns past n4 of the others
        for j in range(n4 if i < m4 else 0, n):
            s = np.float32(0.0)
            for x in range(length):
                s += a[i, x] * b[j, x]
            c[i, j] = s if beta == 0 else beta * c[i, j] + s


@helper()
def _put4(c, i, j, beta, s0, s1, s2, s3):
    if beta == 0:
        c[i, j], c[i, j + 1], c[i, j + 2], c[i, j + 3] = s0, s1, s2, s3
    else:
        c[i, j] = beta * c[i, j] + s0
        c[i, j + 1] = beta * c[i, j + 1] + s1
        c[i, j + 2] = beta * c[i, j + 2] + s2
        c[i, j + 3] = beta * c[i, j + 3] + s3
