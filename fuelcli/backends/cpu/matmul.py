"""How the numba forward runs the IR kernels: the kernel tables, the one parallel loop, matrix products.

`kern` is the engine's kernel table (kernel_table): one row per format code with the addresses of
its kernels (kernels.py) and whether it takes int16 activations; `core` holds the
format-independent kernels (core.py). A block-format product needs its input quantised first
(`quantize_rows`, once per input: q/k/v share one, gate/up another).

Activations are quantised to int16 per ACTIVATION_BLOCK (32) elements: xq = rint(x * Q_MAX / amax)
with the block scale xs = amax / Q_MAX (core.py: Q_MAX = 32639, so that xq splits into two int8
planes) and the block's f32 sum xf (for the formats with a min). 16 bits keep a block's values
within amax / 65278 of f32: measured on 128 tokens against
transformers (the numpy reference with only this change), mean KL 7e-8 on SmolLM2 Q4_1, where 8 bits
(llama.cpp's Q8 activations) give 3.6e-3 and top-1 0.969.

A parallel region costs ~2 us here while the workers still spin from the last one (67 us when they
sleep: process/threads.py), so a decode step runs its matrices in few regions: q/k/v in one (`linears`), gate/up in one; per-token work (norms, RoPE)
runs in the calling thread when there is one token.
"""

import numba
import numpy as np
from numba import njit, prange

from ...formats import ACTIVATION_BLOCK as AB
from .jit import PARALLEL, helper
from .amx import AMX_MIN_TOKENS
from .amx import ROWS as AMX_ROWS
from .attention import ATT_TOKENS, HEADS_AT, KEY_BLOCK, MIN_SPLIT_BLOCKS, PART_EXTRA, SINKS
from .kernels_decode import DECODE_ROWS, DECODE_WIDTHS
from .kernels_prefill import KC, TASK_ROWS
from .kernels_prefill_bf16 import PAIRS_KC
from .llvm import args11, kcall, ptr, stack_counter, stack_counters, take, thread_count

# columns of the kernel table; K_WIDE + i: the decode kernel of DECODE_WIDTHS[i] tokens (add_wide)
K_DECODE, K_PREFILL, K_UNPACK, K_DEQUANT, K_QUANT, K_AMX_PREFILL, K_AMX_UNPACK, K_CHUNKS, K_WIDE = range(9)
N_KERNEL_COLS = K_WIDE + len(DECODE_WIDTHS)
# K_CHUNKS: the tiles read x's bf16 chunks (xb) or its bytes' (x8), the stride where xz goes; or its
# bytes' with the stride where xf goes (the tiles of a min per 16 elements, Q2_K's, read xz there)
CHUNKS_BF16, CHUNKS_BYTES, CHUNKS_BYTES_XZ = 1, 2, 3
# the core table; C_SPLIT is 0 without AMX, C_ROUND_BF16 and C_PACK8 without tiles that read chunks
(C_QUANTIZE, C_SILU, C_ATTENTION, C_RMSNORM, C_ROPE, C_KV_STORE, C_BATCH, C_COMBINE, C_GELU, C_INTERLEAVE,
 C_SPLIT, C_ROUND_BF16, C_PACK8) = range(13)
# a batch of task kernels: (address, n_tasks, 11 arguments) per row; up to 3 products (q, k, v) of
# 2 row groups each (the decode-kernel tokens and the tiled ones)
DESC_ROWS, DESC_COLS = 6, 13


def kernel_table(codes, isa, use_amx: bool = False) -> np.ndarray:
    """int64 [n_formats, N_KERNEL_COLS]: the kernels of the formats in `codes` (others stay 0).
    K_QUANT: a block format (its kernels take int16 activations); K_AMX_*: with use_amx, a block
    format's AMX prefill and panel unpack (amx.py; 0 otherwise); K_CHUNKS: CHUNKS_* where the tiles
    read x by chunks (q8_tables); K_WIDE..: 0 until add_wide."""
    from ...formats import BY_CODE
    from .kernels import addresses, amx_addresses, is_quant

    table = np.zeros((len(BY_CODE), N_KERNEL_COLS), np.int64)
    for code in sorted(set(int(c) for c in codes)):
        table[code, :4] = addresses(code, isa)
        table[code, K_QUANT] = is_quant(code)
        if use_amx and is_quant(code):
            table[code, K_AMX_PREFILL:K_AMX_UNPACK + 1] = amx_addresses(code, isa)
    return table


def add_wide(table: np.ndarray, codes, isa) -> None:
    """The B-wide decode kernels of the formats in `codes` into the table (compiled or loaded now:
    only engines whose steps carry several decoding sequences need them)."""
    from .kernels import wide_addresses

    for code in sorted(set(int(c) for c in codes)):
        table[code, K_WIDE:K_WIDE + len(DECODE_WIDTHS)] = wide_addresses(code, isa)


def core_table(isa, head_dim: int, use_amx: bool = False, cache_type: str = "f32") -> np.ndarray:
    from .core import addresses
    from .kernels import amx_split

    return np.array(addresses(isa, head_dim, cache_type) + (amx_split(isa) if use_amx else 0, 0, 0), np.int64)


@njit(**PARALLEL)
def run_tasks(fn, n, args, one_by_one):
    """The one parallel loop: task kernel `fn` (an address) for tasks 0..n-1, with 11 int64 args.

    Threads take tasks from shared counters whenever they have finished the last, so cores that
    run at different speeds (hybrid CPUs, a busy sibling hyperthread, a host's other tenants)
    finish together: here one vCPU at times ran AMX tiles at 45% of the other's speed, and two
    threads with fixed halves of a prefill then ran no faster than one. Prefill's matrix products
    and attention take their tasks `one_by_one` from one counter (tasks of milliseconds; a causal
    query block late in the prompt costs more than an early one). Decode's short tasks are split
    into one contiguous region per thread, each with its own counter: a thread takes its region's
    tasks in order, one at a time (a stream of weight rows), then helps with the regions of the
    threads after it, taking from their counters; so a late or slow thread's rows are shared out
    a task at a time at the end. Runs of tasks from one shared counter broke each thread's stream of
    rows at every run and left the other thread waiting on the last (decode-shaped Q5_0 matrices
    from DRAM, 2 threads: 1.12-1.17x the rows a second by regions)."""
    threads = thread_count()
    parts = min(n, threads)
    if one_by_one:
        next_task = stack_counter()  # in this call's frame: the loop's threads run while this thread waits in it
        for _ in prange(parts):
            i = take(next_task, 1)
            while i < n:
                kcall(fn, (i,) + args)
                i = take(next_task, 1)
        return
    counters = stack_counters(parts)
    for t in prange(parts):
        for k in range(parts):
            r = (t + k) % parts
            lo, hi = r * n // parts, (r + 1) * n // parts
            i = lo + take(counters + 64 * r, 1)
            while i < hi:
                kcall(fn, (i,) + args)
                i = lo + take(counters + 64 * r, 1)


# Start numba's thread pool now: a function loaded from the on-disk cache that reaches run_tasks
# calls into the pool without starting it (compiling a parallel function would have): a jump to 0.
numba.get_num_threads()


@helper()
def tasks(fn, n, args, one_by_one=False):
    """n tasks: in parallel (run_tasks), or directly when there is one."""
    if n == 1:
        kcall(fn, (np.int64(0),) + args)
    elif n > 1:
        run_tasks(fn, n, args, bool(one_by_one))  # one compiled loop: a literal False would make a second


@helper()
def quantize_rows(x, qx, core):
    """One sequence's rows: a lone token gets its decode kernels' layout (quantize_for)."""
    quantize_for(x, qx, core, np.int64(1) if x.shape[0] == 1 else np.int64(0))


@helper()
def quantize_for(x, qx, core, n_dec):
    """x [T, K] (C-contiguous) -> int16 per 32-block into the first T*K of qx.xq and T*K/32 of qx.xs
    (block scales), qx.xf (block sums) and qx.xz (16-element sums of xq): flat row-major buffers.
    Its first n_dec rows (tokens on the decode kernels) also get the layout those read, in qx.xp
    (core.py's quantize); with more rows and q8 tiles that read bytes by chunks, those too (pack_rows)."""
    T, K = x.shape
    tasks(core[C_QUANTIZE], T, args11(ptr(x), K, K // AB * AB, ptr(qx.xq), ptr(qx.xs), ptr(qx.xf), ptr(qx.xp),
                                      ptr(qx.xz), n_dec))
    if T > n_dec:
        pack_rows(qx, T, K, core)


@helper()
def pack_rows(qx, T, K, core):
    """The values of T rows of K in qx.xq as the bytes x + 128 by chunks in qx.x8, where q8 tiles
    read them so (quantize_q8.pack_task; core[C_PACK8] 0: none do)."""
    if core[C_PACK8] != 0:
        tasks(core[C_PACK8], T, args11(ptr(qx.xq), K, ptr(qx.x8), qx.x8s))


@helper()
def round_rows(x, qx, core):
    """x [T, K] (C-contiguous) -> bf16 by chunks in qx.xb, for the BF16 weights' q8 tiles
    (kernels_prefill_bf16.round_task)."""
    T, K = x.shape
    tasks(core[C_ROUND_BF16], T, args11(ptr(x), K, ptr(qx.xb), qx.xbs))


@helper()
def split_rows(x, planes, core):
    """x [T, K] (C-contiguous) -> the AMX kernels' bf16 high and low planes in `planes` (amx.py)."""
    T, K = x.shape
    tasks(core[C_SPLIT], T, args11(ptr(x), K, K, ptr(planes), T))


ACT_SILU, ACT_GELU_TANH = 0, 1  # the activation codes of forward.py's layer table
ACTIVATION_CODES = {"silu": ACT_SILU, "gelu_tanh": ACT_GELU_TANH}  # block.ACTIVATIONS' names
ACT_CLAMPED_SWIGLU = 2  # gpt-oss's experts (block.Ffn.swiglu_limit): clamped_glu, not glu


@helper()
def glu(gate, up, act, core):
    """gate <- act(gate) * up, row by row (C-contiguous [T, n]); act: ACT_SILU or ACT_GELU_TANH."""
    tasks(core[C_GELU if act == ACT_GELU_TANH else C_SILU], gate.shape[0], args11(ptr(gate), ptr(up), gate.shape[1]))


@helper()
def bias_norm_rope(x, bias, norm, n_heads, head_dim, pos0, cos, sin, eps, scale, core):
    """x (+ bias) (per-head RMSNorm) (RoPE unless cos is 0 or head_dim is 0) (* scale unless 0), in
    place, row by row; cos/sin: table addresses. With head_dim 0 only the bias: add_bias."""
    tasks(core[C_ROPE], x.shape[0], args11(ptr(x), bias, norm, n_heads, head_dim, pos0, cos, sin, eps, scale))


@helper()
def add_bias(x, bias, core):
    """x += bias (a vector address) on every row, in place."""
    bias_norm_rope(x, bias, 0, x.shape[1], 0, 0, 0, 0, 0, 0, core)


@helper()
def clamped_glu(gate, up, limit_bits, alpha_bits, core):
    """gate <- (clip(up, ±limit) + 1) · g · sigmoid(alpha · g) with g = min(gate, limit), row by row
    (ACT_CLAMPED_SWIGLU; limit and alpha as f32 bits, limit != 0)."""
    tasks(core[C_SILU], gate.shape[0], args11(ptr(gate), ptr(up), gate.shape[1], limit_bits, alpha_bits))


@helper()
def attention_splits(T, pos0, window, n_kv, max_splits):
    """Key runs of one step's attention: for one token, as many as the scratch holds (max_splits:
    activations.attention_splits sized it so that each of the pool's threads gets about two tasks;
    a decode step has only n_kv tasks otherwise: 3 on SmolLM2, 2 on Qwen2, so threads beyond them
    would wait), each of MIN_SPLIT_BLOCKS key blocks at least; prefill has tasks enough. Not the
    threads running now: the runs sum in their own order, so the logits must not depend on them."""
    if T != 1:
        return np.int64(1)
    blocks = (pos0 + 1 if window <= 0 else min(pos0 + 1, window)) // KEY_BLOCK + 1
    return max(np.int64(1), min(blocks // MIN_SPLIT_BLOCKS, max_splits))


@helper()
def attention(q, k_cache, v_cache, pos0, window, n_heads, n_kv, out, part, core, sinks=0, att_fn=0, comb_fn=0):
    """Causal attention of T queries at pos0.. over one layer's cache ([n_ctx, n_kv, head_dim]);
    window w > 0 keeps keys j with p - w < j <= p (transformers' sliding-window direction). part:
    scratch for a decode step's key runs (attention_splits): MAX_SPLITS * n_heads * part_stride floats.
    sinks: the address of the heads' sink logits (f32 [n_heads]; 0: none), in each softmax's
    denominator: the attention kernel's with one key run, the combine kernel's with several.
    att_fn, comb_fn: a layer's own kernels, compiled for its head_dim (Gemma 4; 0: the core table's)."""
    T = q.shape[0]
    hd = q.shape[1] // n_heads
    splits = attention_splits(T, pos0, window, n_kv, part.shape[0] // (n_heads * (hd + PART_EXTRA)))
    whole_sinks = splits == 1 and sinks != 0
    # a decode step: a task takes as many kv heads as leave a task to each thread, so that its reads
    # are whole stretches of the cache's rows, in order (f16 cache at depth 8192, Qwen2-1.5B's 2 kv
    # heads on 2 threads: 1.6x); the sums do not change
    groups = n_kv  # of kv heads, a task each
    if T == 1:
        threads = thread_count()
        groups = 1
        while groups < n_kv and (groups * splits < threads or n_kv % groups):
            groups += 1
    flags = (SINKS if whole_sinks else 0) | (n_kv // groups) << HEADS_AT
    tasks(core[C_ATTENTION] if att_fn == 0 else att_fn, (T + ATT_TOKENS - 1) // ATT_TOKENS * groups * splits,
          args11(ptr(q), ptr(k_cache), ptr(v_cache), ptr(out), pos0, window, n_heads, n_kv, T, splits | flags,
                 sinks if whole_sinks else ptr(part)),
          T > 1)
    if splits > 1:
        tasks(core[C_COMBINE] if comb_fn == 0 else comb_fn, T * n_heads,
              args11(ptr(part), ptr(out), splits, T * n_heads, sinks, n_heads))


@helper()
def decode_task(x, qx, b, w_addr, n_rows, row_bytes, code, kern, out_addr, col=K_DECODE):
    """(kernel, n_tasks, args) of row b of out = x @ W^T on the decode kernels (col: the kernel
    table's column; a B-wide kernel takes rows b .. b + B - 1): they read token b's x (float
    formats) or its int16 quantisation, int8 planes or words (block formats; quantize_for wrote
    them for b < its n_dec), the next tokens' at the strides kernels_decode._tokens assumes."""
    K = x.shape[1]
    nb = K // AB
    xp = ptr(qx.xq) + 2 * b * K if kern[code, K_QUANT] else ptr(x) + 4 * b * K
    return (kern[code, col], (n_rows + DECODE_ROWS - 1) // DECODE_ROWS,
            args11(w_addr, n_rows, row_bytes, K, xp, ptr(qx.xs) + 4 * b * nb, ptr(qx.xf) + 4 * b * nb,
                   out_addr + 4 * b * n_rows, ptr(qx.xp) + b * (4 * K + 64), ptr(qx.xz) + 4 * b * (K // 16)))


@helper()
def tile_task(x, qx, r0, w_addr, n_rows, row_bytes, code, kern, out_addr, amx=True):
    """(kernel, n_tasks, args) of rows r0.. of out = x @ W^T on the tiles: the kernel reads x itself
    (float formats), its int16 quantisation (block formats), its chunks (K_CHUNKS: q8 tiles)
    or, AMX_MIN_TOKENS tokens or more of a block format on AMX unless amx is False, its bf16 planes
    (forward.prepare made them of x)."""
    T, K = x.shape
    rows = T - r0
    nb = K // AB
    xp = ptr(qx.xq) + 2 * r0 * K if kern[code, K_QUANT] else ptr(x) + 4 * r0 * K
    out = out_addr + 4 * r0 * n_rows
    chunks = kern[code, K_CHUNKS]
    if chunks != 0:  # x's bf16 chunks (round_rows) or bytes' (pack_rows), their stride where the tiles
        # read neither xz nor xf
        xc, stride = ((ptr(qx.xb) + 4 * PAIRS_KC * r0, qx.xbs) if chunks == CHUNKS_BF16 else
                      (ptr(qx.x8) + KC * r0, qx.x8s))
        xf, xz = ptr(qx.xf) + 4 * r0 * nb, stride
        if chunks == CHUNKS_BYTES_XZ:
            xf, xz = stride, ptr(qx.xz) + 4 * r0 * (K // 16)
        return (kern[code, K_PREFILL], (n_rows + TASK_ROWS - 1) // TASK_ROWS,
                args11(kern[code, K_UNPACK], w_addr, n_rows, row_bytes, K, rows, xc, ptr(qx.xs) + 4 * r0 * nb, xf,
                       out, xz))
    if amx and rows >= AMX_MIN_TOKENS and kern[code, K_AMX_PREFILL] != 0:
        return (kern[code, K_AMX_PREFILL], (n_rows + AMX_ROWS - 1) // AMX_ROWS,
                args11(kern[code, K_AMX_UNPACK], w_addr, n_rows, row_bytes, K, rows, xp, 0, 0, out))
    return (kern[code, K_PREFILL], (n_rows + TASK_ROWS - 1) // TASK_ROWS,
            args11(kern[code, K_UNPACK], w_addr, n_rows, row_bytes, K, rows, xp, ptr(qx.xs) + 4 * r0 * nb,
                   ptr(qx.xf) + 4 * r0 * nb, out, ptr(qx.xz) + 4 * r0 * (K // 16)))


@helper()
def decode_width(kern, code, left):
    """(kernel table column, tokens) of the widest decode kernel the format has for `left` tokens."""
    for i in range(len(DECODE_WIDTHS) - 1, -1, -1):
        if DECODE_WIDTHS[i] <= left and kern[code, K_WIDE + i] != 0:
            return K_WIDE + i, DECODE_WIDTHS[i]
    return K_DECODE, 1


@helper()
def describe_product(desc, r, x, qx, w_addr, n_rows, row_bytes, code, kern, core, out_addr, n_dec, ddesc,
                     amx=True):
    """out = x @ W^T described into desc from row r (returns the next free row): x's first n_dec
    rows on the decode kernels, the rest on the tiles (on AMX only if amx: tile_task). The decode rows go to the widest kernels
    the format has (decode_width: 8 tokens as 4 + 4, 3 as 2 + 1), which unpack a weight row once for
    their tokens; several such kernels (in ddesc) have their tasks interleaved, so that a group of
    weight rows is read once from memory for all of them. A row's result is the same whatever rows
    run beside it: every decode kernel does each token's arithmetic as the one-token kernel."""
    T = x.shape[0]
    if n_dec >= 1:
        j = b = n = np.int64(0)
        while b < n_dec:
            col, width = decode_width(kern, code, n_dec - b)
            fn, n, a = decode_task(x, qx, b, w_addr, n_rows, row_bytes, code, kern, out_addr, col)
            describe(ddesc, j, fn, n, a)
            j += 1
            b += width
        if j == 1:
            describe(desc, r, fn, n, a)
        else:
            describe(desc, r, core[C_INTERLEAVE], n * j, args11(ptr(ddesc), j))
        r += 1
    if T > n_dec:
        fn, n, a = tile_task(x, qx, n_dec, w_addr, n_rows, row_bytes, code, kern, out_addr, amx)
        describe(desc, r, fn, n, a)
        r += 1
    return r


@helper()
def matmul(x, qx, w_addr, n_rows, row_bytes, code, kern, out):
    """out[t, n] = sum_k x[t, k] * W[n, k] for the stored matrix W at w_addr (n_rows x row_bytes,
    format `code`) of one sequence's rows: one token on the decode kernels, more on the tiles; x and
    out C-contiguous, qx holds x prepared."""
    T = x.shape[0]
    if T == 1:
        fn, n, a = decode_task(x, qx, 0, w_addr, n_rows, row_bytes, code, kern, ptr(out))
    else:
        fn, n, a = tile_task(x, qx, 0, w_addr, n_rows, row_bytes, code, kern, ptr(out))
    tasks(fn, n, a, T > 1)


@helper()
def describe(desc, r, fn, n, a):
    desc[r, 0] = fn
    desc[r, 1] = n
    for i in range(DESC_COLS - 2):
        desc[r, 2 + i] = a[i]
    return n


@helper()
def batch(desc, rows, core, one_by_one=False):
    """The task kernels described in the first `rows` rows of desc, in one parallel loop (tasks)."""
    total = np.int64(0)
    for r in range(rows):
        total += desc[r, 1]
    tasks(core[C_BATCH], total, args11(ptr(desc), rows), one_by_one)


@helper()
def dequant_row(kern, code, row_addr, K, out):
    """One stored row decoded exactly into out (f32, K)."""
    kcall(kern[code, K_DEQUANT], (np.int64(row_addr), np.int64(K), ptr(out)))
