"""Qwen3-Next (qwen3_next): Qwen3.5's hybrid layers (qwen3_5.py: gated DeltaNet and gated full
attention, partial RoPE, norms as 1 + w) with Qwen3-MoE's FFN plan (decoder_sparse_step,
mlp_only_layers, norm_topk_prob), each MoE layer with a shared expert scaled by
sigmoid(shared_expert_gate).

Its linear layers store in_proj_qkvz and in_proj_ba interleaved per key head (transformers'
fix_query_key_value_ordering): for each key head its q, k, v (its value heads') and z rows, and its
b then a rows. They are split per key head and q, k, v regathered into in_proj_qkv's order (all q,
all k, all v) on load.

GGUF (arch qwen3next, llama.cpp's converter): q|k|v already regathered (attn_qkv) beside z
(attn_gate), b|a as stored (ssm_ba); the value heads keep HF's order; the keys, the MTP layers and
the other transforms (A = -exp(A_log), norms as 1 + w) as Qwen3.5's files.
"""

from dataclasses import replace

import numpy as np

from .base import COMMON_DEFAULTS
from .qwen3_5 import A_LOG, GGUF_NAMES, MTP, Q_GATE, QWEN3_5
from .qwen3_moe import moe_ffn
from .schema import DECODER, Fused, Regroup

_L = "model.layers.{i}.linear_attn"


def _k_heads(c):
    return c.linear.k_heads


def _qkv_gathered(c):
    """in_proj_qkv's rows (all q, all k, all v) from the rows of each key head's q, k, v in turn."""
    lin = c.linear
    sizes = (lin.k_head_dim, lin.k_head_dim, lin.v_heads // lin.k_heads * lin.v_head_dim)
    offsets, group = (0, sizes[0], 2 * sizes[0]), sum(sizes)
    return np.concatenate([np.arange(h * group + o, h * group + o + n) for o, n in zip(offsets, sizes)
                           for h in range(lin.k_heads)])


def shared_expert_moe(r, n_layers: int):
    return moe_ffn(r, n_layers)._replace(shared_intermediate_size=r.integer("shared_expert_intermediate_size"))


WEIGHTS = replace(
    DECODER.with_fused(Q_GATE, Fused(("lin_qkv", "lin_z"), hf=f"{_L}.in_proj_qkvz.weight", interleaved=_k_heads),
                       Fused(("lin_b", "lin_a"), hf=f"{_L}.in_proj_ba.weight", gguf="blk.{i}.ssm_ba.weight",
                             interleaved=_k_heads))
    .renamed(gguf=GGUF_NAMES)
    .undoing("hf", {"lin_qkv": (Regroup(unit=lambda c: 1, order=_qkv_gathered),)})
    .undoing("gguf", {"lin_a_log": (A_LOG,)}),
    gguf_norm_shift=1.0,
    not_run=MTP,
)

QWEN3_NEXT = replace(
    QWEN3_5,
    model_type="qwen3_next",
    architectures=("Qwen3NextForCausalLM",),
    gguf_arch="qwen3next",
    defaults={**COMMON_DEFAULTS, "vocab_size": 151936, "max_position_embeddings": 32768, "head_dim": 256,
              "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4,
              "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1,
              "mlp_only_layers": []},
    ffn=shared_expert_moe,
    weights=WEIGHTS,
    # llama.cpp's qwen3next runs every layer's MoE, renormalised: no key says otherwise
    gguf_defaults={"norm_topk_prob": True},
)
