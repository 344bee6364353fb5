"""Llama 2, 3 and 3.1 (llama3 RoPE scaling is read by config.py's RoPE reader, shared by all)."""

from .base import COMMON_DEFAULTS, Family

LLAMA = Family(
    model_type="llama",
    architectures=("LlamaForCausalLM",),
    gguf_arch="llama",
    defaults={**COMMON_DEFAULTS, "vocab_size": 32000, "max_position_embeddings": 2048, "bos_token_id": 1,
              "eos_token_id": 2},
    # transformers' Llama adds biases to gate/up/down when mlp_bias is true; the shared decoder has none
    unsupported_flags=("mlp_bias",),
    gguf_permuted_qk=True,
)
