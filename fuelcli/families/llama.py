"""Llama 2, 3, 3.1/3.2 (llama3 RoPE scaling is read by model/config.py's RoPE reader, shared by all; a
GGUF file carries it as a rope_freqs tensor). GGUF arch llama also holds Mistral (read as Llama:
llama.cpp keeps no window for it) and Mixtral (expert tensors: the Mixtral family)."""

from .base import COMMON_DEFAULTS, Family


def gguf_config(meta: dict, d: dict):
    if d.get("num_experts"):  # a llama-arch file with experts is a Mixtral
        d["model_type"] = "mixtral"


LLAMA = Family(
    model_type="llama",
    architectures=("LlamaForCausalLM",),
    gguf_arch="llama",
    defaults={**COMMON_DEFAULTS, "vocab_size": 32000, "max_position_embeddings": 2048, "bos_token_id": 1,
              "eos_token_id": 2},
    # transformers' Llama adds biases to gate/up/down when mlp_bias is true; the shared decoder has none
    unsupported_flags=("mlp_bias",),
    gguf_config=gguf_config,
    gguf_permuted_qk=True,
)
