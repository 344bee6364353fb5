"""RoPE inverse frequencies equal transformers' own, bit for bit, for every scaling fuel reads."""

import numpy as np
import pytest

from fuelcli.config import from_hf_config
from fuelcli.rope import inv_freq

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
    assert np.array_equal(inv_freq(cfg.rope, cfg.head_dim), ref.numpy())
