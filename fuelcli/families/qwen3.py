"""Qwen3: RMSNorm over head_dim on q and k before RoPE (q_norm, k_norm), an explicit head_dim,
optional attention biases, Qwen2's window rule."""

from .base import COMMON_DEFAULTS, Family
from .qwen2 import qwen_windows

QWEN3 = Family(
    model_type="qwen3",
    architectures=("Qwen3ForCausalLM",),
    gguf_arch="qwen3",
    defaults={**COMMON_DEFAULTS, "vocab_size": 151936, "max_position_embeddings": 32768, "head_dim": 128},
    windows=qwen_windows,
    qk_norm=True,
)
