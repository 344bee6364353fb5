"""RoPE inverse frequencies equal transformers' own for every scaling fuel reads, to the last bit but
one: torch's float32 pow is vectorised (Sleef, <= 1 ulp) and its last bit depends on the CPU's vector
width (bit-exact against numpy's float32 pow on an AVX2 machine; 13 of 64 frequencies 1 ulp apart on
an AVX-512 one). A wrong formula or operation order is off by far more: see the negative control."""

import numpy as np
import pytest

from fuelcli.model.config import from_hf_config
from fuelcli.model.rope import inv_freq

LLAMA31 = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 2, "num_key_value_heads": 8, "vocab_size": 1000, "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
}
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
}


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_inv_freq_equals_transformers(kind):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = {**LLAMA31, **({"rope_scaling": SCALINGS[kind]} if SCALINGS[kind] else {})}
    cfg = from_hf_config(raw)
    hf_cfg = LlamaConfig(**raw)
    if kind == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        ref = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_cfg)[0]
    else:
        ref = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")[0]
    np.testing.assert_array_max_ulp(inv_freq(cfg.rope, cfg.head_dim), ref.numpy(), maxulp=1)


def test_inv_freq_comparison_discriminates():
    """Negative control: a factor off by 1e-5 or another low_freq_factor is more than 1 ulp away."""
    import dataclasses

    raw = {**LLAMA31, "rope_scaling": SCALINGS["llama3"]}
    cfg = from_hf_config(raw)
    good = inv_freq(cfg.rope, cfg.head_dim)
    for rope in (dataclasses.replace(cfg.rope, low_freq_factor=1.5), dataclasses.replace(cfg.rope, factor=8.0001)):
        with pytest.raises(AssertionError):
            np.testing.assert_array_max_ulp(inv_freq(rope, cfg.head_dim), good, maxulp=1)
