"""Every activation of the CPU forward, allocated once per engine for up to `rows` tokens at a time
(llama.cpp's ubatch): the forward takes views of the first T rows."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...formats import ACTIVATION_BLOCK
from ...model.config import ModelConfig
from .amx import TILE
from .attention import MAX_SPLITS, part_stride
from .kernels_prefill import KC
from .kernels_prefill_bf16 import PAIRS_KC
from .matmul import DESC_COLS, DESC_ROWS

GROUP_COLS = 5  # the columns of a MoE layer's group table (moe.py's G_*)


class Quantized(NamedTuple):
    """A matrix input as the block-format kernels read it (forward.prepare, matmul.quantize_rows)."""

    xq: np.ndarray  # int16 [rows * K] (K <= max_k); with AMX [2 * rows rounded up to 16 * K]: its
    # bf16 planes (amx.py)
    xs: np.ndarray  # [rows * K / 32] its block scales
    xf: np.ndarray  # [rows * K / 32] its block sums
    xp: np.ndarray  # int8 [tokens * (4 * K + 64)]: each token on the decode kernels as they read it:
    # two int8 planes (the planes kernels; they read a unit past K at most), then both again in the
    # K-quants' layout (core.py's quantize), or int16 words (the words kernels)
    xz: np.ndarray  # [rows * K / 16]: its 16-element sums of xq
    # x by chunks of KC elements for the q8 tiles that read it so (matmul.K_CHUNKS), a chunk's rows
    # together: chunk c of row t at c * stride + t * (the chunk's bytes). Only the tiles of a q8
    # engine touch them (np.zeros maps the pages on first touch).
    xb: np.ndarray  # int32: rounded to bf16 pairs, BF16 weights' tiles (matmul.round_rows)
    xbs: int  # its chunk stride in bytes: rows * PAIRS_KC * 4
    x8: np.ndarray  # uint8: xq + 128, the block formats' tiles (matmul.pack_rows)
    x8s: int  # its chunk stride in bytes: rows * KC


def quantized(rows: int, max_k: int, amx_planes: bool = False, tokens: int = 1) -> Quantized:
    """Room for `rows` rows of at most max_k, `tokens` of them on the decode kernels at once."""
    nb = -(-max_k // ACTIVATION_BLOCK)
    k = nb * ACTIVATION_BLOCK
    xq_rows = 2 * -(-rows // TILE) * TILE if amx_planes else rows
    chunks = -(-max_k // KC)
    return Quantized(xq=np.zeros(xq_rows * k, np.int16), xs=np.zeros(rows * nb, np.float32),
                     xf=np.zeros(rows * nb, np.float32), xp=np.zeros(tokens * (4 * k + 64), np.int8),
                     xz=np.zeros(rows * (k // 16), np.float32), xb=np.zeros(chunks * rows * PAIRS_KC, np.int32),
                     xbs=rows * PAIRS_KC * 4, x8=np.zeros(chunks * rows * KC, np.uint8), x8s=rows * KC)


class Activations(NamedTuple):
    x: np.ndarray  # [rows, H] residual stream
    h: np.ndarray  # [rows, H] normed input of attention / FFN
    q: np.ndarray  # [rows, heads * head_dim]
    k: np.ndarray  # [rows, kv_heads * head_dim]
    v: np.ndarray  # [rows, kv_heads * head_dim]
    att: np.ndarray  # [rows, heads * head_dim] attention output before o_proj
    o: np.ndarray  # [rows, H] output of o_proj, then of the FFN
    gate: np.ndarray  # [rows, I] dense FFN gate (then silu(gate) * up)
    up: np.ndarray  # [rows, I]
    router: np.ndarray  # [rows, experts] router logits (MoE layers; moe.py)
    experts: np.ndarray  # [rows, k] int64 each row's chosen experts
    expert_w: np.ndarray  # [rows, k] their weights
    epos: np.ndarray  # [rows, k] int64 the pair row of each (row, chosen expert)
    esrc: np.ndarray  # [rows * k] int64 the row of each pair row
    ecount: np.ndarray  # [experts, 2] int64 scratch of the grouping
    egroups: np.ndarray  # [groups, GROUP_COLS] int64 the pair rows' groups (moe.G_*)
    egate: np.ndarray  # [rows * k, moe_I] the pair rows' gate, up
    eup: np.ndarray  # [rows * k, moe_I]
    ey: np.ndarray  # [rows * k, H] the pair rows' gathered inputs, then their experts' outputs; where
    # no expert reads f32 rows, in the memory of egate and eup (pair_rows)
    edesc: np.ndarray  # [2 * groups, DESC_COLS] int64: the experts' products of one parallel loop
    eddesc: np.ndarray  # [2 * k * slots, DESC_COLS] int64: their decode kernels (ddesc's role)
    qx: Quantized  # the input of the next matrix products, prepared for the block formats
    eqx: Quantized  # the pair rows' inputs, prepared (moe.py)
    desc: np.ndarray  # [DESC_ROWS, 13] int64: the task kernels of one parallel loop (matmul.batch)
    ddesc: np.ndarray  # [3, slots, 13] int64: each product's decode kernels, one or B tokens each, their tasks
    # interleaved (matmul.describe_product)
    part: np.ndarray  # a decode step's attention runs: attention_splits() * heads * part_stride(head_dim)
    last: np.ndarray  # [slots, H] the last row of each sequence in a step (its logits' input)
    qg: np.ndarray  # [rows, heads * head_dim] the attention output gate (Attention.output_gate)
    lq: np.ndarray  # [rows, conv channels] a linear-attention layer's in_proj_qkv, then
    lc: np.ndarray  # [rows, conv channels] its conv output
    lz: np.ndarray  # [rows, value_dim] its output gate
    lb: np.ndarray  # [rows, v_heads] its beta and decay inputs
    la: np.ndarray  # [rows, v_heads]
    lo: np.ndarray  # [rows, value_dim] its output before out_proj
    sgl: np.ndarray  # [rows, 1] a shared expert's gate logit
    sgate: np.ndarray  # [rows, shared I] its gate and up
    sup: np.ndarray  # [rows, shared I]
    sy: np.ndarray  # [rows, H] its output
    pli: np.ndarray  # [L, rows, P] Gemma 4's per-layer inputs (forward.per_layer_inputs; P: their width)
    plt: np.ndarray  # [rows, L * P] their projection
    plr: np.ndarray  # [rows, L * P] their rows of the packed table
    plg: np.ndarray  # [rows, P] a layer's gate of its input
    mb: np.ndarray  # [rows, H] the experts' input beside the dense FFN (forward.moe_beside)
    my: np.ndarray  # [rows, H] their output
    # out_proj's stored column order where it is not the model's (weights/tensor.Tensor.columns), the
    # same for every linear layer that has one (lay[l, L_LOUT_ORDER])
    lo_order: np.ndarray = np.zeros(0, np.int64)


def attention_splits(cfg: ModelConfig, pool: int) -> int:
    """Key runs of a decode step's attention: about two tasks for each of the pool's threads."""
    return max(1, min(MAX_SPLITS, (2 * pool + cfg.num_kv_heads - 1) // max(cfg.num_kv_heads, 1)))


def pair_rows(pairs: int, H: int, moe_I: int, apart: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The MoE pair rows' f32 gate, up and output (egate, eup, ey). Where every expert's gate, up and
    down are of a block format (apart False), their products read only the int16 quantisations (eqx)
    and the outputs are written after the gate and up are quantised: ey then lies over egate and eup,
    pairs * max(H, 2 * moe_I) floats instead of pairs * (H + 2 * moe_I) (Qwen3-30B-A3B's 512 rows:
    32 MiB instead of 56). A float-format expert reads the gathered f32 rows in ey beside its gate
    and up: apart."""
    if apart:
        return (np.zeros((pairs, moe_I), np.float32), np.zeros((pairs, moe_I), np.float32),
                np.zeros((pairs, H), np.float32))
    mem = np.zeros(pairs * max(H, 2 * moe_I), np.float32)
    return (mem[:pairs * moe_I].reshape(pairs, moe_I), mem[pairs * moe_I:2 * pairs * moe_I].reshape(pairs, moe_I),
            mem[:pairs * H].reshape(pairs, H))


def allocate(cfg: ModelConfig, rows: int, planes: bool = False, slots: int = 1, pool: int = 1,
             f32_experts: bool = True) -> Activations:
    """Activations for `rows` tokens at a time, of up to `slots` sequences (each one's next token
    on the decode kernels), with the attention's key runs for a pool of `pool` threads.
    f32_experts: some expert matrix is of a float format (pair_rows)."""
    def f32(*shape):
        return np.zeros(shape, np.float32)

    H, E, k = cfg.hidden_size, max(cfg.num_experts, 1), max(cfg.experts_per_tok, 1)
    lin, S = cfg.linear, cfg.shared_expert_intermediate_size
    gated = any(b.attention.output_gate for b in cfg.blocks)
    conv, value, v_heads = (lin.conv_dim, lin.value_dim, lin.v_heads) if lin else (0, 0, 0)
    P, beside = cfg.per_layer_input_size, any(b.ffn.moe_beside for b in cfg.blocks)
    max_k = max(H, cfg.q_dim, cfg.intermediate_size, cfg.moe_intermediate_size, value, S)
    # MoE: every (row, chosen expert) pair has a row (moe.py); at most 2 groups an expert (decode
    # kernels, tiles), and one a pair
    pairs = rows * k if cfg.num_experts else 0
    groups = min(2 * E, pairs) if pairs else 0
    moe_I = cfg.moe_intermediate_size
    egate, eup, ey = pair_rows(pairs, H, moe_I, f32_experts)
    return Activations(
        x=f32(rows, H), h=f32(rows, H), q=f32(rows, cfg.q_dim), k=f32(rows, cfg.kv_dim), v=f32(rows, cfg.kv_dim),
        att=f32(rows, cfg.q_dim), o=f32(rows, H), gate=f32(rows, cfg.intermediate_size),
        up=f32(rows, cfg.intermediate_size), router=f32(rows, E), experts=np.zeros((rows, k), np.int64),
        expert_w=f32(rows, k), epos=np.zeros((rows, k), np.int64), esrc=np.zeros(pairs, np.int64),
        ecount=np.zeros((E, 2), np.int64), egroups=np.zeros((groups, GROUP_COLS), np.int64),
        egate=egate, eup=eup, ey=ey,
        edesc=np.zeros((2 * groups, DESC_COLS), np.int64),
        eddesc=np.zeros((2 * k * slots if pairs else 0, DESC_COLS), np.int64),
        qx=quantized(rows, max_k, planes, tokens=slots),
        eqx=quantized(pairs, max(H, moe_I) if pairs else 0, tokens=slots * k if pairs else 0),
        desc=np.zeros((DESC_ROWS, DESC_COLS), np.int64),
        ddesc=np.zeros((3, slots, DESC_COLS), np.int64),
        part=f32(attention_splits(cfg, pool) * cfg.num_heads * part_stride(cfg.head_dim)),
        last=f32(slots, H),
        qg=f32(rows, cfg.q_dim if gated else 0), lq=f32(rows, conv), lc=f32(rows, conv), lz=f32(rows, value),
        lb=f32(rows, v_heads), la=f32(rows, v_heads), lo=f32(rows, value), sgl=f32(rows, 1 if S else 0),
        sgate=f32(rows, S), sup=f32(rows, S), sy=f32(rows, H if S else 0),
        pli=f32(cfg.num_layers if P else 0, rows, P), plt=f32(rows, cfg.num_layers * P),
        plr=f32(rows, cfg.num_layers * P), plg=f32(rows, P), mb=f32(rows, H if beside else 0),
        my=f32(rows, H if beside else 0),
    )

