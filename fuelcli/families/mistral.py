"""Mistral / Codestral: Llama's block with a sliding window on every layer when sliding_window is
set (null: full attention; transformers' default 4096). Their GGUF files are arch llama (llama.cpp
keeps no window for them), read by the Llama family."""

from ..errors import ConfigError
from .base import COMMON_DEFAULTS, Family


def every_layer_window(r, n_layers: int):
    window = r.raw.get("sliding_window", r.family.defaults.get("sliding_window"))
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 0):
        raise ConfigError(f"sliding_window must be a non-negative integer or null, got {window!r}")
    if not window:
        return [0] * n_layers, "sliding_window null → every layer full"
    return [window] * n_layers, f"sliding_window={window} → every layer windowed"


MISTRAL = Family(
    model_type="mistral",
    architectures=("MistralForCausalLM",),
    gguf_arch=None,
    defaults={**COMMON_DEFAULTS, "vocab_size": 32000, "max_position_embeddings": 4096 * 32, "sliding_window": 4096,
              "bos_token_id": 1, "eos_token_id": 2},
    windows=every_layer_window,
)
