"""The block descriptions of the families read from real config.json texts (Gemma 3 270M,
Mistral-7B-v0.1, Mixtral-8x7B, SmolLM3-3B, Qwen2.5 with YaRN), the GGUF form against the HF form
of the same model, and every bad value of the keys these families read."""

import math

import pytest
from test_config import LLAMA2_7B, QWEN2_0_5B

from fuelcli.errors import ConfigError
from fuelcli.model.block import features, rope_variants
from fuelcli.model.config import from_hf_config
from fuelcli.model.plan import mask_plan

GEMMA3_270M = {  # google/gemma-3-270m config.json
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "intermediate_size": 2048,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]
    + ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": 512, "use_bidirectional_attention": False, "vocab_size": 262144,
}
GEMMA3_4B_TEXT = {  # the text part of google/gemma-3-4b-it: linear RoPE scaling on the global layers
    **{k: v for k, v in GEMMA3_270M.items() if k != "layer_types"}, "hidden_size": 2560, "intermediate_size": 10240,
    "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4, "sliding_window": 1024,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window_pattern": 6,
}
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000,
}
SMOLLM3_3B = {
    "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "bos_token_id": None, "eos_token_id": 128012,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 65536,
    "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3", "no_rope_layer_interval": 4,
    "no_rope_layers": [1, 1, 1, 0] * 9, "num_attention_heads": 16, "num_hidden_layers": 36,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0,
    "sliding_window": None, "use_sliding_window": False, "vocab_size": 128256, "tie_word_embeddings": True,
}
PHI3_MINI_128K = {
    "architectures": ["Phi3ForCausalLM"], "bos_token_id": 1, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "phi3",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0 + i / 8 for i in range(48)],
                     "short_factor": [1.0 + i / 64 for i in range(48)]},
    "sliding_window": 262144, "tie_word_embeddings": False, "vocab_size": 32064,
}
QWEN25_YARN = {**QWEN2_0_5B, "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                                               "type": "yarn"}}


def test_gemma3_270m():
    c = from_hf_config(GEMMA3_270M)
    assert c.family == "gemma3_text" and c.head_dim == 256 and c.tie_embeddings
    assert c.windows == (512,) * 5 + (0,) + (512,) * 5 + (0,) + (512,) * 5 + (0,)
    local, full = rope_variants(c)
    assert (local.theta, full.theta) == (1e4, 1e6) and c.rope == full
    assert [b.attention.rope for b in c.blocks][:6] == [local] * 5 + [full]
    b = c.blocks[0]
    assert b.sandwich and b.attention.qk_norm and b.ffn.activation == "gelu_tanh" and not b.attention.qkv_bias
    assert b.attention.scale is None  # query_pre_attn_scalar == head_dim: 1/sqrt(256) as the default
    assert c.norm_offset == 1.0 and c.embed_scale == math.sqrt(640) and c.final_softcap == 0.0
    assert c.eos_token_ids == (1,) and c.bos_token_id == 2
    assert set(features(c)) == {"a RoPE base or scaling per layer", "post-attention and post-FFN norms",
                                "a gelu_tanh FFN", "an embedding scale"}
    assert len(mask_plan(c).variants) == 2


def test_gemma3_pattern_and_global_scaling():
    c = from_hf_config(GEMMA3_4B_TEXT)
    assert c.windows == tuple(0 if (i + 1) % 6 == 0 else 1024 for i in range(34))
    local, full = rope_variants(c)
    assert local.type == "default" and (full.type, full.factor, full.theta) == ("linear", 8.0, 1e6)
    # transformers 5's shape of the same config gives the same blocks
    new = {k: v for k, v in GEMMA3_4B_TEXT.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    new["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert from_hf_config(new).blocks == c.blocks


def test_gemma3_scale_and_softcap():
    c = from_hf_config({**GEMMA3_270M, "query_pre_attn_scalar": 168, "final_logit_softcapping": 30.0})
    assert c.blocks[0].attention.scale == 168 ** -0.5 and c.final_softcap == 30.0


def test_mistral_and_mixtral():
    m = from_hf_config(MISTRAL_7B_V01)
    assert m.family == "mistral" and m.windows == (4096,) * 32 and m.head_dim == 128
    assert from_hf_config({**MISTRAL_7B_V01, "sliding_window": None}).windows == (0,) * 32
    x = from_hf_config(MIXTRAL_8X7B)
    assert x.family == "mixtral" and x.moe_layers == (True,) * 32 and x.windows == (0,) * 32
    assert (x.num_experts, x.experts_per_tok, x.moe_intermediate_size, x.norm_topk_prob) == (8, 2, 14336, True)


def test_smollm3_nope_layers():
    c = from_hf_config(SMOLLM3_3B)
    assert [b.attention.rope is None for b in c.blocks] == [False, False, False, True] * 9
    assert c.windows == (0,) * 36 and "no RoPE on layers 3, 7" in c.rope_rule
    derived = {k: v for k, v in SMOLLM3_3B.items() if k != "no_rope_layers"}  # from no_rope_layer_interval
    assert from_hf_config(derived).blocks == c.blocks


def test_yarn_parameters():
    r = from_hf_config(QWEN25_YARN).rope
    assert (r.type, r.factor, r.original_max_position, r.beta_fast, r.beta_slow) == ("yarn", 4.0, 32768, 32.0, 1.0)
    assert r.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    ds = {**QWEN2_0_5B, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}}
    assert from_hf_config(ds).rope.attention_factor == 1.0  # mscale / mscale_all_dim, DeepSeek's form


def test_phi3_longrope():
    c = from_hf_config(PHI3_MINI_128K)
    r = c.rope
    assert c.family == "phi3" and c.head_dim == 96 and c.windows == (262144,) * 32
    assert (r.type, r.factor, r.original_max_position) == ("longrope", 32.0, 4096) and len(r.long_factors) == 48
    assert r.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    from fuelcli.model.rope import inv_freq

    short, long = inv_freq(r, 96, 4096), inv_freq(r, 96, 4097)  # the long factors past the original context
    assert short[1] == pytest.approx(long[1] * 1.125 / (1 + 1 / 64)) and short[0] == long[0]


def test_gguf_form_of_gemma3_is_the_hf_form(gemma3_gguf):
    """The real 270M file read through the GGUF key map has the blocks its hub config.json says."""
    from fuelcli.assembly.loader import open_model

    g = open_model(str(gemma3_gguf)).cfg
    h = from_hf_config(GEMMA3_270M)
    assert g.blocks == h.blocks
    assert (g.norm_offset, g.embed_scale, g.final_softcap, g.hidden_size, g.head_dim, g.num_kv_heads) == (
        h.norm_offset, h.embed_scale, h.final_softcap, h.hidden_size, h.head_dim, h.num_kv_heads)


def test_gguf_llama_with_experts_is_mixtral():
    from fuelcli.weights.gguf_model import config_from_gguf

    meta = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
            "llama.feed_forward_length": 96, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
            "llama.rope.freq_base": 1e6, "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.context_length": 128,
            "llama.expert_count": 8, "llama.expert_used_count": 2, "llama.vocab_size": 50}
    c = from_hf_config(config_from_gguf(meta, ["output.weight"]), source="gguf")
    assert c.family == "mixtral" and c.moe_layers == (True, True) and c.num_experts == 8 and c.norm_topk_prob
    plain = {k: v for k, v in meta.items() if "expert" not in k}
    assert from_hf_config(config_from_gguf(plain, ["output.weight"]), source="gguf").family == "llama"


@pytest.mark.parametrize("base, change, message", [
    # the FFN's activation, now read for every family
    (LLAMA2_7B, {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported; supported: silu, swish"),
    (LLAMA2_7B, {"hidden_act": 3}, "hidden_act=3 is not supported"),
    (GEMMA3_270M, {"hidden_activation": "relu"}, "hidden_activation='relu' is not supported"),
    # Gemma 3
    (GEMMA3_270M, {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 in config.json is not supported"),
    (GEMMA3_270M, {"use_bidirectional_attention": True}, "use_bidirectional_attention=true in config.json is not"),
    (GEMMA3_270M, {"use_bidirectional_attention": "no"}, "use_bidirectional_attention must be true or false"),
    (GEMMA3_270M, {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be > 0"),
    (GEMMA3_270M, {"query_pre_attn_scalar": "256"}, "query_pre_attn_scalar must be a number"),
    (GEMMA3_270M, {"final_logit_softcapping": -1.0}, "final_logit_softcapping must be > 0 or null"),
    (GEMMA3_270M, {"final_logit_softcapping": "30"}, "final_logit_softcapping must be a number"),
    (GEMMA3_270M, {"rope_local_base_freq": 0}, "rope_local_base_freq must be > 0"),
    (GEMMA3_270M, {"rope_local_base_freq": "1e4"}, "rope_local_base_freq must be a number"),
    (GEMMA3_270M, {"sliding_window": -1}, "sliding_window must be a non-negative integer"),
    (GEMMA3_270M, {"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern must be a positive"),
    (GEMMA3_270M, {"layer_types": ["sliding_attention"] * 17}, "layer_types has 17 entries but num_hidden_layers=18"),
    (GEMMA3_270M, {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                       "sliding_attention": None}},
     "rope_parameters has no object for sliding_attention layers"),
    (GEMMA3_270M, {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": -1},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_parameters.full_attention.rope_theta must be > 0"),
    # Mistral / Mixtral
    (MISTRAL_7B_V01, {"sliding_window": "4096"}, "sliding_window must be a non-negative integer or null"),
    (MIXTRAL_8X7B, {"num_experts_per_tok": 9}, "num_experts_per_tok=9 must be between 1 and num_local_experts=8"),
    (MIXTRAL_8X7B, {"num_experts_per_tok": 0}, "num_experts_per_tok=0 must be between 1"),
    (MIXTRAL_8X7B, {"num_local_experts": -8}, "num_local_experts must be a non-negative integer"),
    # SmolLM3
    (SMOLLM3_3B, {"no_rope_layers": [1, 0]}, "no_rope_layers must be a list of 36 zeros and ones"),
    (SMOLLM3_3B, {"no_rope_layers": [True] * 36}, "no_rope_layers must be a list of 36 zeros and ones"),
    (SMOLLM3_3B, {"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval must be > 0"),
    (SMOLLM3_3B, {"mlp_bias": True}, "mlp_bias=true in config.json is not supported"),
    # YaRN
    (QWEN2_0_5B, {"rope_scaling": {"type": "yarn", "factor": 4, "beta_fast": 1, "beta_slow": 32}},
     "needs beta_fast > beta_slow > 0"),
    (QWEN2_0_5B, {"rope_scaling": {"type": "yarn", "factor": 4, "beta_fast": "32"}}, "beta_fast must be a number"),
    (QWEN2_0_5B, {"rope_scaling": {"type": "yarn", "factor": 4, "truncate": "yes"}}, "truncate must be true or false"),
    (QWEN2_0_5B, {"rope_scaling": {"type": "yarn", "factor": 0}}, "rope scaling 'yarn' needs a positive factor"),
    (QWEN2_0_5B, {"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 0}},
     "original_max_position_embeddings must be a positive integer"),
    (QWEN2_0_5B, {"rope_scaling": {"type": "yarn", "factor": 4, "attention_factor": "1"}},
     "attention_factor must be a number"),
    (QWEN2_0_5B, {"rope_scaling": {"type": "factors", "factors": [1.0]}}, "unsupported rope type 'factors'"),
    # LongRoPE, Phi-3
    (PHI3_MINI_128K, {"rope_scaling": {**PHI3_MINI_128K["rope_scaling"], "long_factor": [1.0] * 47}},
     "the RoPE's 47 long factors do not fit head_dim 96"),
    (PHI3_MINI_128K, {"rope_scaling": {**PHI3_MINI_128K["rope_scaling"], "short_factor": ["1"] * 48}},
     "short_factor must be a list of numbers > 0"),
    (PHI3_MINI_128K, {"rope_scaling": {**PHI3_MINI_128K["rope_scaling"], "long_factor": None}},
     "long_factor must be a list of numbers > 0, got None"),
    (PHI3_MINI_128K, {"rope_scaling": {**PHI3_MINI_128K["rope_scaling"], "short_factor": [0.0] * 48}},
     "short_factor must be a list of numbers > 0"),
    (PHI3_MINI_128K, {"original_max_position_embeddings": 0}, "original_max_position_embeddings must be a positive"),
    (PHI3_MINI_128K, {"partial_rotary_factor": 0.75}, "partial_rotary_factor=0.75 is not supported"),
    (PHI3_MINI_128K, {"sliding_window": True}, "sliding_window must be a non-negative integer or null"),
])
def test_bad_values(base, change, message):
    with pytest.raises(ConfigError) as e:
        from_hf_config({**base, **change})
    assert message in str(e.value)
