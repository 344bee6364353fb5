"""Stored-format matrix products: x quantised once, the format's kernel called by address per task.

`kern` is the engine's kernel table (kernel_table): one row per format code with the addresses of
its kernels (kernels.py) and whether it takes int16 activations. A block-format product needs x
quantised first (`quantize_rows`, once per input: q/k/v share one, gate/up another).

Activations are quantised to int16 per ACTIVATION_BLOCK (32) elements: xq = rint(x * 32767 / amax)
with the block scale xs = amax / 32767 and the block's f32 sum xf (for the formats with a min).
16 bits keep a block's values within amax / 65534 of f32: measured on 128 tokens against
transformers (the numpy reference with only this change), mean KL 7e-8 on SmolLM2 Q4_1, where 8 bits
(llama.cpp's Q8 activations) give 3.6e-3 and top-1 0.969.
"""

import numpy as np
from numba import njit, prange

from ...formats import ACTIVATION_BLOCK as AB
from .jit import FAST, PARALLEL
from .kernels import DECODE_ROWS, TASK_ROWS
from .llvm import kcall

K_DECODE, K_PREFILL, K_UNPACK, K_DEQUANT, K_QUANT = range(5)  # columns of the kernel table
N_KERNEL_COLS = 5
C_QUANTIZE, C_SILU, C_ATTENTION = range(3)  # the core table: format-independent kernels


def kernel_table(codes, isa) -> np.ndarray:
    """int64 [n_formats, N_KERNEL_COLS]: the kernels of the formats in `codes` (others stay 0)."""
    from ...formats import BY_CODE
    from .kernels import addresses, is_quant

    table = np.zeros((len(BY_CODE), N_KERNEL_COLS), np.int64)
    for code in sorted(set(int(c) for c in codes)):
        table[code, :4] = addresses(code, isa)
        table[code, K_QUANT] = is_quant(code)
    return table


def core_table(isa, head_dim: int) -> np.ndarray:
    from .core import addresses

    return np.array(addresses(isa, head_dim), np.int64)


@njit(**PARALLEL)
def run_tasks(fn, n, args):
    """The one parallel loop: task kernel `fn` (an address) for tasks 0..n-1, with 11 int64 args."""
    for i in prange(n):
        kcall(fn, (np.int64(i),) + args)


@njit(**FAST)
def tasks(fn, n, args):
    """n tasks: in parallel, or directly when there is one (a parallel region costs microseconds)."""
    if n == 1:
        kcall(fn, (np.int64(0),) + args)
    elif n > 1:
        run_tasks(fn, n, args)


@njit(**FAST)
def quantize_rows(x, xq, xs, xf, core):
    """x [T, K] (C-contiguous) -> int16 per 32-block into the first T*K of xq and T*K/32 of xs
    (block scales) and xf (block sums): flat row-major buffers."""
    T, K = x.shape
    z = np.int64(0)
    tasks(core[C_QUANTIZE], T, (np.int64(x.ctypes.data), np.int64(K), np.int64(K // AB * AB),
                                np.int64(xq.ctypes.data), np.int64(xs.ctypes.data), np.int64(xf.ctypes.data),
                                z, z, z, z, z))


@njit(**FAST)
def silu_mul(gate, up, core):
    """gate <- silu(gate) * up, row by row (C-contiguous [T, n])."""
    T, n = gate.shape
    z = np.int64(0)
    tasks(core[C_SILU], T, (np.int64(gate.ctypes.data), np.int64(up.ctypes.data), np.int64(n), z, z, z, z, z, z,
                            z, z))


@njit(**FAST)
def attention(q, k_cache, v_cache, pos0, window, n_heads, n_kv, out, core):
    """Causal attention of T queries at pos0.. over one layer's cache ([n_ctx, n_kv, head_dim]);
    window w > 0 keeps keys j with p - w < j <= p (transformers' sliding-window direction)."""
    T = q.shape[0]
    z = np.int64(0)
    tasks(core[C_ATTENTION], T * n_heads, (np.int64(q.ctypes.data), np.int64(k_cache.ctypes.data),
                                           np.int64(v_cache.ctypes.data), np.int64(out.ctypes.data),
                                           np.int64(pos0), np.int64(window), np.int64(n_heads), np.int64(n_kv),
                                           np.int64(T), z, z))


@njit(**FAST)
def matmul(x, xq, xs, xf, w_addr, n_rows, row_bytes, code, kern, out):
    """out[t, n] = sum_k x[t, k] * W[n, k] for the stored matrix W at w_addr (n_rows x row_bytes,
    format `code`); x and out C-contiguous, xq/xs/xf hold x quantised (block formats)."""
    T, K = x.shape
    xp = np.int64(xq.ctypes.data) if kern[code, K_QUANT] else np.int64(x.ctypes.data)
    sp, fp_ = np.int64(xs.ctypes.data), np.int64(xf.ctypes.data)
    op = np.int64(out.ctypes.data)
    K = np.int64(K)
    if T == 1:
        tasks(kern[code, K_DECODE], (n_rows + DECODE_ROWS - 1) // DECODE_ROWS,
              (w_addr, n_rows, row_bytes, K, xp, sp, fp_, op, np.int64(0), np.int64(0), np.int64(0)))
    else:
        tasks(kern[code, K_PREFILL], (n_rows + TASK_ROWS - 1) // TASK_ROWS,
              (kern[code, K_UNPACK], w_addr, n_rows, row_bytes, K, np.int64(T), xp, sp, fp_, op, np.int64(0)))


@njit(**FAST)
def dequant_row(kern, code, row_addr, K, out):
    """One stored row decoded exactly into out (f32, K)."""
    kcall(kern[code, K_DEQUANT], (row_addr, np.int64(K), np.int64(out.ctypes.data)))
