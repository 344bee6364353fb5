"""ModelConfig from the real config.json texts in the seeds, both config shapes, and every bad case."""

import json

import pytest

from fuelcli.errors import ConfigError
from fuelcli.model.config import from_hf_config
from fuelcli.model.plan import mask_plan

QWEN2_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "max_position_embeddings": 131072, "max_window_layers": 24, "sliding_window": 131072,
    "use_sliding_window": False, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "attention_bias": False, "max_position_embeddings": 40960,
    "sliding_window": None, "use_sliding_window": False, "max_window_layers": 48, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8,
}
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1.0e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 4096,
    "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1.0e-6, "tie_word_embeddings": False,
}


def test_qwen2_0_5b():
    c = from_hf_config(QWEN2_0_5B)
    assert (c.family, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads) == ("qwen2", 896, 24, 14, 2)
    assert c.head_dim == 64 and c.origin["head_dim"] == "derived"
    a = c.blocks[0].attention
    assert c.tie_embeddings and a.qkv_bias and not a.o_bias and not a.qk_norm
    assert c.rope.theta == 1e6 and c.rope.type == "default"
    assert c.windows == (0,) * 24  # use_sliding_window false
    assert c.origin["rms_norm_eps"] == "config.json"


def test_qwen3_30b_a3b():
    c = from_hf_config(QWEN3_30B_A3B)
    assert c.family == "qwen3_moe" and c.head_dim == 128 != 2048 // 32
    assert (c.num_experts, c.experts_per_tok, c.moe_intermediate_size) == (128, 8, 768)
    assert c.moe_layers == (True,) * 48 and not c.norm_topk_prob and c.blocks[0].attention.qk_norm
    assert c.windows == (0,) * 48  # sliding_window null


def test_llama31_8b_without_model_type():
    c = from_hf_config(LLAMA31_8B)
    assert c.family == "llama" and c.num_kv_heads == 8 and c.head_dim == 128
    assert c.rope.type == "llama3" and c.rope.factor == 8.0 and c.rope.original_max_position == 8192
    assert c.eos_token_ids == (128001, 128008, 128009) and c.bos_token_id == 128000


def test_llama2_7b_defaults():
    c = from_hf_config(LLAMA2_7B)
    assert c.num_kv_heads == 32 and c.origin["num_kv_heads"] == "derived"
    assert c.head_dim == 128 and c.rope.theta == 10000.0 and c.origin["rope_theta"] == "default"
    assert c.eos_token_ids == (2,) and not c.tie_embeddings


def test_both_rope_shapes_agree():
    new = {k: v for k, v in LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {**LLAMA31_8B["rope_scaling"], "rope_theta": 500000.0}
    old_type_key = {**LLAMA31_8B, "rope_scaling": {**LLAMA31_8B["rope_scaling"], "type": "llama3"}}
    del old_type_key["rope_scaling"]["rope_type"]
    assert from_hf_config(new).rope == from_hf_config(LLAMA31_8B).rope == from_hf_config(old_type_key).rope


def test_generation_config_eos_joins():
    c = from_hf_config(LLAMA2_7B, {"eos_token_id": [2, 7]})
    assert c.eos_token_ids == (2, 7)


def test_qwen2_window_direction_follows_transformers():
    raw = {**QWEN2_0_5B, "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 8,
           "max_window_layers": 1}
    c = from_hf_config(raw)
    assert c.windows == (0, 8, 8, 8)  # the FIRST max_window_layers layers are full
    plan = mask_plan(c)
    assert len(plan.variants) == 2 and plan.variants[1].layers == [1, 2, 3]
    assert "max_window_layers=1" in c.window_rule


def test_layer_types_win_over_max_window_layers():
    raw = {**QWEN2_0_5B, "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 8,
           "max_window_layers": 0, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    c = from_hf_config(raw)
    assert c.windows == (8, 0, 8) and "layer_types" in c.window_rule


def test_moe_layer_rule():
    raw = {**QWEN3_30B_A3B, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    assert from_hf_config(raw).moe_layers == (False, True, False, False, False, True)
    assert from_hf_config({**raw, "num_local_experts": 16, "num_experts": None}).num_experts == 16


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "unsupported model_type 'gpt2'; supported model_type: llama, mistral, mixtral, qwen2, "
                             "qwen3, qwen3_moe, smollm3, gemma3_text"),
    ({"hidden_size": None}, "missing required key 'hidden_size'"),
    ({"num_key_value_heads": 3}, "num_attention_heads=14 is not a multiple of num_key_value_heads=3"),
    ({"hidden_size": 900}, "hidden_size=900 is not divisible by num_attention_heads=14"),
    ({"head_dim": 63}, "head_dim=63 must be even"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4}}, "unsupported rope type 'dynamic'"),
    ({"num_hidden_layers": "24"}, "num_hidden_layers must be a non-negative integer"),
])
def test_bad_configs(change, message):
    with pytest.raises(ConfigError) as e:
        from_hf_config({**QWEN2_0_5B, **change})
    assert message in str(e.value)


def test_topk_above_experts():
    with pytest.raises(ConfigError, match="num_experts_per_tok=9 > num_experts=8"):
        from_hf_config({**QWEN3_30B_A3B, "num_experts": 8, "num_experts_per_tok": 9})


def test_unknown_architecture_without_model_type():
    with pytest.raises(ConfigError, match="unsupported architectures"):
        from_hf_config({**LLAMA2_7B, "architectures": ["GPT2LMHeadModel"]})


def test_config_json_errors(tmp_path):
    from fuelcli.model.config import load_hf_config

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hf_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match="not a JSON object"):
        load_hf_config(tmp_path)


@pytest.mark.parametrize("base, change, message", [
    (QWEN2_0_5B, {"rms_norm_eps": "abc"}, "rms_norm_eps must be a number, got 'abc'"),
    (QWEN2_0_5B, {"rms_norm_eps": True}, "rms_norm_eps must be a number"),
    (QWEN2_0_5B, {"rms_norm_eps": -1e-6}, "rms_norm_eps must be >= 0"),
    (QWEN2_0_5B, {"rope_theta": "x"}, "rope_theta must be a number, got 'x'"),
    (QWEN2_0_5B, {"rope_theta": 0}, "rope_theta must be > 0"),
    (QWEN2_0_5B, {"rope_parameters": "default"}, "rope_parameters must be a JSON object, got 'default'"),
    (QWEN2_0_5B, {"rope_parameters": {"rope_type": "default", "rope_theta": "x"}},
     "rope_parameters.rope_theta must be a number"),
    (QWEN2_0_5B, {"rope_scaling": "linear"}, "rope_scaling must be a JSON object, got 'linear'"),
    (QWEN2_0_5B, {"rope_scaling": {"rope_type": ["linear"], "factor": 2}}, "unsupported rope type ['linear']"),
    (QWEN2_0_5B, {"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "needs a positive factor, got '2'"),
    (LLAMA31_8B, {"rope_scaling": {**LLAMA31_8B["rope_scaling"], "low_freq_factor": "1"}},
     "low_freq_factor must be a number"),
    (LLAMA31_8B, {"rope_scaling": {**LLAMA31_8B["rope_scaling"], "original_max_position_embeddings": 8.5}},
     "original_max_position_embeddings must be a positive integer"),
    (QWEN2_0_5B, {"model_type": ["qwen2"]}, "model_type must be a string, got ['qwen2']"),
    (LLAMA2_7B, {"architectures": [{"x": 1}]}, "architectures must be a list of strings"),
    (QWEN2_0_5B, {"use_sliding_window": True, "max_window_layers": None}, "max_window_layers must be a non-negative"),
    (QWEN2_0_5B, {"max_window_layers": "24"}, "max_window_layers must be a non-negative integer, got '24'"),
    (QWEN2_0_5B, {"use_sliding_window": True, "sliding_window": "x"}, "sliding_window must be a non-negative integer"),
    (QWEN2_0_5B, {"use_sliding_window": "false"}, "use_sliding_window must be true or false, got 'false'"),
    (QWEN2_0_5B, {"layer_types": "full_attention"}, "layer_types must be a list of strings"),
    (QWEN2_0_5B, {"layer_types": [1] * 24}, "layer_types must be a list of strings"),
    (QWEN2_0_5B, {"layer_types": ["linear_attention"] * 24}, "layer_types entries ['linear_attention'] are not"),
    (QWEN2_0_5B, {"tie_word_embeddings": "true"}, "tie_word_embeddings must be true or false"),
    (QWEN2_0_5B, {"attention_bias": "no"}, "attention_bias must be true or false"),
    (QWEN2_0_5B, {"eos_token_id": "2"}, "eos_token_id in config.json must be an integer or a list"),
    (QWEN2_0_5B, {"bos_token_id": "1"}, "bos_token_id must be a non-negative integer"),
    (QWEN2_0_5B, {"num_key_value_heads": 0}, "num_key_value_heads must be > 0"),
    (QWEN3_30B_A3B, {"mlp_only_layers": 3}, "mlp_only_layers must be a list of non-negative integers, got 3"),
    (QWEN3_30B_A3B, {"mlp_only_layers": ["3"]}, "mlp_only_layers must be a list of non-negative integers"),
    (QWEN3_30B_A3B, {"norm_topk_prob": "yes"}, "norm_topk_prob must be true or false"),
    (QWEN3_30B_A3B, {"use_sliding_window": True, "sliding_window": "x"}, "sliding_window must be a non-negative"),
    (LLAMA2_7B, {"mlp_bias": True}, "mlp_bias=true in config.json is not supported by fuel"),
])
def test_wrong_types_are_config_errors(base, change, message):
    with pytest.raises(ConfigError) as e:
        from_hf_config({**base, **change})
    assert message in str(e.value)


def test_null_and_false_values_are_fine():
    # null means absent; mlp_bias false is plain Llama; max_window_layers null is unread without windows
    c = from_hf_config({**LLAMA2_7B, "num_key_value_heads": None, "mlp_bias": False, "rope_scaling": None})
    assert c.num_kv_heads == 32 and c.origin["num_kv_heads"] == "derived"
    assert from_hf_config({**QWEN2_0_5B, "max_window_layers": None}).windows == (0,) * 24
    raw = {**QWEN2_0_5B, "num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": 8,
           "max_window_layers": None, "layer_types": ["full_attention", "sliding_attention"]}
    assert from_hf_config(raw).windows == (0, 8)
    assert from_hf_config({**QWEN3_30B_A3B, "mlp_only_layers": None}).moe_layers == (True,) * 48


def test_generation_config_must_be_an_object():
    with pytest.raises(ConfigError, match="generation_config.json is not a JSON object"):
        from_hf_config(LLAMA2_7B, [2])
    with pytest.raises(ConfigError, match="eos_token_id in generation_config.json"):
        from_hf_config(LLAMA2_7B, {"eos_token_id": [2, "x"]})
