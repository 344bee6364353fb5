"""Tiny random HF checkpoints for oracle tests (test-side only; no fuel code).

``write_tiny(case, out_dir)`` writes ``out_dir/<case>/`` (config.json + model.safetensors +
generation_config.json) with transformers' own ``save_pretrained``. The weights are deterministic
(``torch.manual_seed``) and deliberately *large* (projections N(0, 0.3), norms 1 ± 0.2, biases
N(0, 0.3), embeddings N(0, 1)) so that every semantic detail moves the logits by far more than 1e-3:
window direction, which layers are windowed, dense vs top-k routing, norm_topk_prob, llama3 RoPE
bands, q/k norms, head_dim != hidden/heads, qkv bias, tied embeddings.

What transformers 5.x writes (checked with 5.24):
  * config.json carries ``rope_parameters`` ({"rope_type": ..., "rope_theta": ..., + scaling keys})
    instead of ``rope_theta`` / ``rope_scaling``; Qwen2/Qwen3 also get ``layer_types``
    (Qwen3-MoE configs do not carry it).
    ``legacy_rope=True`` rewrites it to the old hub shape (``rope_theta`` + ``rope_scaling`` with
    ``rope_type``); ``legacy_rope="type"`` uses the even older ``type`` key.
  * Qwen3-MoE: in memory transformers 5 holds fused experts (``mlp.experts.gate_up_proj`` [E, 2I, H],
    ``mlp.experts.down_proj`` [E, H, I]) but ``save_pretrained`` reverses that and WRITES THE HUB
    LAYOUT, one tensor per expert: ``model.layers.{i}.mlp.experts.{e}.gate_proj.weight`` [I, H],
    ``...experts.{e}.up_proj.weight`` [I, H], ``...experts.{e}.down_proj.weight`` [H, I]; router
    ``model.layers.{i}.mlp.gate.weight`` [E, H]. Dense layers: ``mlp.{gate,up,down}_proj.weight``.
  * Qwen3-MoE config.json says ``num_local_experts`` (attribute_map num_experts -> num_local_experts),
    NOT ``num_experts`` as hub files do; ``legacy_moe_key=True`` writes ``num_experts`` instead.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

VOCAB = 256

CASES: dict[str, str] = {
    "qwen2_window": (
        "Qwen2, 4 layers, hidden 64, 4 heads / 2 kv heads (head_dim 16), qkv bias, "
        "use_sliding_window=True, sliding_window=4, max_window_layers=2 -> layers 2,3 windowed; "
        "config.json written WITH layer_types"
    ),
    "qwen2_window_legacy": (
        "same weights as qwen2_window but config.json WITHOUT layer_types: the windowed layers "
        "must be derived from max_window_layers (i >= 2)"
    ),
    "qwen3_bias_headdim": (
        "Qwen3, 2 layers, hidden 64, 4 heads / 2 kv heads, head_dim 32 (!= 64/4), "
        "attention_bias=True (q,k,v,o biases), q_norm/k_norm over head_dim"
    ),
    "qwen3_moe_norm_false": (
        "Qwen3-MoE, 4 layers, decoder_sparse_step=2, mlp_only_layers=[3] -> layer 1 MoE, layers "
        "0,2 dense by the step rule, layer 3 dense by mlp_only_layers; 8 experts, top-2, "
        "moe_intermediate_size 32, intermediate_size 96, norm_topk_prob=False"
    ),
    "qwen3_moe_norm_true": "same weights as qwen3_moe_norm_false but norm_topk_prob=True",
    "llama31": (
        "Llama, 2 layers, hidden 64, 4 heads / 2 kv heads (head_dim 16), rope_theta 500, "
        "rope llama3 (factor 8, low 1, high 4, original_max_position_embeddings 32): wavelengths "
        "6.3 (kept), 13.7 and 29.7 (smoothed: x0.516, x0.148), 64.6..1445 (divided by 8); "
        "tie_word_embeddings=True"
    ),
    "llama2": "plain Llama, 2 layers, hidden 64, 4 heads = 4 kv heads, rope_theta 10000, untied",
    "gemma3": (
        "Gemma 3 text, 3 layers (sliding_window_pattern 2 -> local, global, local), hidden 64, 4 heads / 2 kv "
        "heads, head_dim 32, sliding_window 4, local RoPE theta 100, global theta 10000 with linear x4, "
        "query_pre_attn_scalar 24 (!= head_dim), final_logit_softcapping 30, tied; config.json with "
        "per-layer-type rope_parameters (transformers 5)"
    ),
    "gemma3_hub": "same weights as gemma3, config.json in the hub shape (rope_theta, rope_local_base_freq, rope_scaling)",
    "gemma3_6layers": (
        "Gemma 3 text as a GGUF can say it: 6 layers (5 local : 1 global), hidden 64, head_dim 32, "
        "sliding_window 4, local RoPE theta 10000, global 1e6, q·k scaled by head_dim, softcap 30, tied"
    ),
    "mistral": "Mistral, 2 layers, hidden 64, 4 heads / 2 kv heads, head_dim 32, sliding_window 4 on every layer",
    "mixtral": "Mixtral, 2 layers, 4 experts top-2 (always renormalised), intermediate 48, sliding_window null",
    "smollm3": "SmolLM3, 4 layers, no_rope_layers [1, 1, 1, 0] (layer 3 without RoPE), tied",
    "phi3": "Phi-3, 2 layers, fused qkv_proj and gate_up_proj, sliding_window 4 on every layer, no RoPE scaling",
    "phi3_longrope": (
        "Phi-3 with LongRoPE: original_max_position_embeddings 16 (the 24-token test sequence is past it: the "
        "long factors), max_position_embeddings 256, short/long factors of 8 frequencies, no window"
    ),
    "qwen2_yarn": (
        "Qwen2, 2 layers, rope_theta 10000, rope_scaling yarn factor 4, original_max_position_embeddings 8 "
        "(ramp over dims 0-6 of 8 frequencies), attention factor 1.139"
    ),
    "qwen3_5": (
        "Qwen3.5 text, 4 layers (3 gated DeltaNet, then full attention), hidden 64; linear: 2 key heads of 8, "
        "4 value heads of 12 (each key head serves 2), conv kernel 4; full: 4 heads / 2 kv heads of 16, output "
        "gate, QK-norm, RoPE over the first 4 dimensions (partial_rotary_factor 0.25); norms 1 + w"
    ),
    "qwen3_5_moe": (
        "Qwen3.5 MoE text: qwen3_5's layers with a MoE on every layer, 8 experts top-2 (renormalised), "
        "moe_intermediate_size 32, a shared expert of 48 scaled by sigmoid(shared_expert_gate)"
    ),
    "gpt_oss": (
        "gpt-oss, 4 layers (windowed w=8, full, windowed, full), hidden 64, 4 heads / 2 kv heads of 16, q/k/v/o "
        "biases, a sink logit per head (N(0, 1)), YaRN factor 8 over original_max_position_embeddings 32 "
        "(truncate false, attention factor 1.208); 8 experts of 32, top-4, router with a bias, softmax over the "
        "top-4, expert biases, swiglu_limit 1 (so that the clamp bites at these weights), alpha 1.702"
    ),
    "gpt_oss_limit7": (
        "same weights as gpt_oss with swiglu_limit 7, the value llama.cpp fixes (a GGUF file carries no limit), "
        "for the converted GGUF"
    ),
    "qwen3_5_wrapped": (
        "qwen3_5's text weights inside the hub's wrapper (Qwen3_5ForConditionalGeneration, model_type qwen3_5): "
        "config.json with text_config and a tiny vision_config, model.language_model.* names, a random vision "
        "tower (model.visual.*) and MTP head (mtp.*, mtp_num_hidden_layers 1) as hub files carry"
    ),
    "qwen3_5_moe_wrapped": (
        "qwen3_5_moe's text weights in the MoE wrapper (Qwen3_5MoeForConditionalGeneration), as qwen3_5_wrapped; "
        "the experts stacked as the hub's files hold them (mlp.experts.gate_up_proj, mlp.experts.down_proj)"
    ),
    "qwen3_next": (
        "Qwen3-Next: qwen3_5_moe's shapes (2 key heads of 8, 4 value heads of 12; 8 experts top-2, renormalised, "
        "a shared expert of 48), its linear layers' in_proj_qkvz and in_proj_ba interleaved per key head; "
        "an MTP head (mtp.*) as hub files carry (llama.cpp's converter wants one)"
    ),
    "qwen3_5_square": (
        "qwen3_5 with value heads of 8, the key heads' size, as llama.cpp's qwen35 loader requires (it sizes "
        "attn_qkv with ssm.state_size for both): the llama.cpp oracle's file"
    ),
    "qwen3_5_moe_square": "qwen3_5_moe with value heads of 8, as qwen3_5_square",
    "qwen3_5_square_wrapped": "qwen3_5_square in the hub's wrapper, as qwen3_5_wrapped (the converter wants its MTP head)",
    "qwen3_5_moe_square_wrapped": "qwen3_5_moe_square in the MoE wrapper, as qwen3_5_moe_wrapped",
    "gemma4_e2b": (
        "Gemma 4 text shaped like E2B: 6 layers (local, local, global, local, local, global), hidden 64, 4 heads; "
        "local layers 2 kv heads of 16 (window 4, RoPE θ 100), global ones 2 kv heads of 32 (proportional RoPE "
        "θ 10000 over 0.25 of the frequencies); the last 3 layers share k/v (layers 3, 4 attend to layer 1's, 5 to "
        "2's) and have a double-wide FFN; per-layer inputs of 8; layer_scalar; softcap 30; norms w, tied"
    ),
    "gemma4_moe": (
        "Gemma 4 text shaped like 26B-A4B: 4 layers (local, global, local, global), hidden 64, 4 heads; local 2 kv "
        "heads of 16, global 1 kv head of 32 whose v is its k (attention_k_eq_v); a MoE of 8 experts top-2 "
        "(moe_intermediate_size 32, router scale and per-expert scale) beside every dense FFN; no per-layer inputs"
    ),
    "gemma4_wrapper": (
        "the gemma4 multimodal wrapper (Gemma4ForConditionalGeneration): gemma4_e2b's config as text_config (its own "
        "weights) beside a 1-layer vision tower that fuel reads past"
    ),
}

# wrapper case -> the text case whose weights it holds
WRAPPED = {"qwen3_5_wrapped": "qwen3_5", "qwen3_5_moe_wrapped": "qwen3_5_moe", "qwen3_5_square_wrapped": "qwen3_5_square",
           "qwen3_5_moe_square_wrapped": "qwen3_5_moe_square"}

# Common small sizes.
_BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    attn_implementation="eager",
)

EXPERT_KEYS_NOTE = (
    "saved per expert: model.layers.{i}.mlp.experts.{e}.gate_proj.weight [I, H], "
    "model.layers.{i}.mlp.experts.{e}.up_proj.weight [I, H], "
    "model.layers.{i}.mlp.experts.{e}.down_proj.weight [H, I]; router model.layers.{i}.mlp.gate.weight [E, H]"
)


def _config(case: str):
    from transformers import (Gemma3TextConfig, LlamaConfig, MistralConfig, MixtralConfig, Phi3Config, Qwen2Config,
                              Qwen3Config, Qwen3MoeConfig, SmolLM3Config)

    if case in ("qwen2_window", "qwen2_window_legacy"):
        return Qwen2Config(
            **_BASE,
            num_hidden_layers=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=2,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
    if case == "qwen3_bias_headdim":
        return Qwen3Config(
            **_BASE,
            num_hidden_layers=2,
            num_key_value_heads=2,
            head_dim=32,
            attention_bias=True,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
    if case in ("qwen3_moe_norm_false", "qwen3_moe_norm_true"):
        base = dict(_BASE)
        base["intermediate_size"] = 96
        return Qwen3MoeConfig(
            **base,
            num_hidden_layers=4,
            num_key_value_heads=2,
            head_dim=16,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=(case == "qwen3_moe_norm_true"),
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
    if case == "llama31":
        return LlamaConfig(
            **_BASE,
            num_hidden_layers=2,
            num_key_value_heads=2,
            rope_theta=500.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            tie_word_embeddings=True,
        )
    if case == "llama2":
        return LlamaConfig(
            **_BASE,
            num_hidden_layers=2,
            num_key_value_heads=4,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
    if case in ("gemma3", "gemma3_hub"):
        return Gemma3TextConfig(
            **{**_BASE, "pad_token_id": 0}, num_hidden_layers=3, num_key_value_heads=2, head_dim=32,
            sliding_window=4, sliding_window_pattern=2, query_pre_attn_scalar=24, final_logit_softcapping=30.0,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                             "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
            tie_word_embeddings=True,
        )
    if case == "gemma3_6layers":
        return Gemma3TextConfig(
            **{**_BASE, "pad_token_id": 0}, num_hidden_layers=6, num_key_value_heads=2, head_dim=32,
            sliding_window=4, query_pre_attn_scalar=32, final_logit_softcapping=30.0, tie_word_embeddings=True,
        )
    if case == "mistral":
        return MistralConfig(**_BASE, num_hidden_layers=2, num_key_value_heads=2, head_dim=32, sliding_window=4,
                             rope_theta=10000.0, tie_word_embeddings=False)
    if case == "mixtral":
        return MixtralConfig(**{**_BASE, "intermediate_size": 48}, num_hidden_layers=2, num_key_value_heads=2,
                             num_local_experts=4, num_experts_per_tok=2, sliding_window=None, rope_theta=10000.0,
                             tie_word_embeddings=False)
    if case == "smollm3":
        return SmolLM3Config(**_BASE, num_hidden_layers=4, num_key_value_heads=2, no_rope_layers=[1, 1, 1, 0],
                             rope_theta=10000.0, tie_word_embeddings=True)
    if case == "phi3":
        return Phi3Config(**_BASE, num_hidden_layers=2, num_key_value_heads=2, sliding_window=4, tie_word_embeddings=False)
    if case == "phi3_longrope":
        return Phi3Config(**_BASE, num_hidden_layers=2, num_key_value_heads=2, sliding_window=None,
                          tie_word_embeddings=False, original_max_position_embeddings=16,
                          rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                           "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0],
                                           "long_factor": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0]})
    if case == "qwen2_yarn":
        return Qwen2Config(**_BASE, num_hidden_layers=2, num_key_value_heads=2, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                            "rope_theta": 10000.0})
    if case in ("qwen3_5", "qwen3_5_moe", "qwen3_5_square", "qwen3_5_moe_square"):
        from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

        hybrid = dict(**_BASE, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
                      linear_key_head_dim=8, linear_num_key_heads=2,
                      linear_value_head_dim=8 if case.endswith("_square") else 12,
                      linear_num_value_heads=4, tie_word_embeddings=False)
        if case in ("qwen3_5", "qwen3_5_square"):
            return Qwen3_5TextConfig(**hybrid)
        return Qwen3_5MoeTextConfig(**hybrid, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=48)
    if case in ("gpt_oss", "gpt_oss_limit7"):
        from transformers import GptOssConfig

        return GptOssConfig(**{**_BASE, "intermediate_size": 32}, num_hidden_layers=4, num_key_value_heads=2,
                            head_dim=16, num_local_experts=8, num_experts_per_tok=4, sliding_window=8,
                            swiglu_limit=1.0 if case == "gpt_oss" else 7.0, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                             "truncate": False, "original_max_position_embeddings": 32,
                                             "rope_theta": 150000.0})
    if case == "qwen3_next":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(**_BASE, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
                               linear_key_head_dim=8, linear_num_key_heads=2, linear_value_head_dim=12,
                               linear_num_value_heads=4, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
                               decoder_sparse_step=1)
    if case in ("gemma4_e2b", "gemma4_moe", "gemma4_wrapper"):
        return _gemma4_config(case)
    raise KeyError(f"unknown tiny case {case!r}; known: {sorted(CASES)}")


def _gemma4_config(case: str):
    from transformers import Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

    base = {**_BASE, "pad_token_id": 0, "intermediate_size": 64}
    local, full = "sliding_attention", "full_attention"
    if case == "gemma4_moe":
        return Gemma4TextConfig(
            **base, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
            num_global_key_value_heads=1, attention_k_eq_v=True, layer_types=[local, full, local, full],
            sliding_window=4, hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=8, top_k_experts=2,
            moe_intermediate_size=32, final_logit_softcapping=30.0,
            rope_parameters={local: {"rope_type": "default", "rope_theta": 100.0},
                             full: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 10000.0}})
    text = Gemma4TextConfig(
        **base, num_hidden_layers=6, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        layer_types=[local, local, full, local, local, full], sliding_window=4, final_logit_softcapping=30.0,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=3,
        use_double_wide_mlp=True,
        rope_parameters={local: {"rope_type": "default", "rope_theta": 100.0},
                         full: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 10000.0}})
    if case == "gemma4_e2b":
        return text
    vision = Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=8)
    return Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None)


def _gemma_hub_shape(conf: dict) -> dict:
    """transformers 5's per-layer-type rope_parameters -> the hub files' rope_theta (global),
    rope_local_base_freq and rope_scaling (the global layers')."""
    rp = conf.pop("rope_parameters")
    full, local = dict(rp["full_attention"]), rp["sliding_attention"]
    conf["rope_theta"], conf["rope_local_base_freq"] = full.pop("rope_theta"), local["rope_theta"]
    if full.get("rope_type", "default") != "default":
        conf["rope_scaling"] = full
    return conf


def _randomize(model, seed: int, expert_scale: float = 0.3) -> None:
    """Deterministic, deliberately large weights (so semantics are visible in the logits); experts at
    `expert_scale` (where every layer adds a MoE and a shared expert, 0.3 takes the residual stream
    past 300 and f32 rounding past 1e-3 in transformers' own logits)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            shape = tuple(p.shape)
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(shape, generator=g))
            elif "norm" in name:  # input/post-attention/final RMSNorm, q_norm, k_norm
                p.copy_(1.0 + 0.2 * torch.randn(shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(shape, generator=g))
            elif name.endswith(("mlp.gate.weight", "mlp.router.weight")):  # MoE router: spread logits -> distinct top-k
                p.copy_(0.5 * torch.randn(shape, generator=g))
            elif name.endswith("self_attn.sinks"):  # as large as the attention logits, so that they weigh
                p.copy_(torch.randn(shape, generator=g))
            elif name.endswith(("in_proj_a.weight", "in_proj_b.weight", "in_proj_ba.weight")):
                # a linear layer's decay and beta in the ranges trained ones keep: at 0.3 some heads'
                # beta reaches 1e-5, their output's RMS 1e-6, and the gated norm amplifies rounding
                p.copy_(0.05 * torch.randn(shape, generator=g))
            elif ".experts." in name or "shared_expert." in name:
                p.copy_(expert_scale * torch.randn(shape, generator=g))
            elif name.endswith(("router.scale", "router.per_expert_scale")):  # Gemma 4's router scales
                p.copy_(1.0 + 0.3 * torch.randn(shape, generator=g))
            else:  # q/k/v/o, gate/up/down, lm_head
                p.copy_(0.3 * torch.randn(shape, generator=g))
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("layer_scalar"):  # Gemma 4's stored per-layer output scale (1 when untrained)
                b.copy_(0.5 + torch.rand(tuple(b.shape), generator=g))


# the cases' seed order, fixed: a new case goes at the end, so that no existing case's weights change
_SEED_ORDER = ["llama2", "llama31", "qwen2_window", "qwen2_window_legacy", "qwen3_bias_headdim", "qwen3_moe_norm_false",
               "qwen3_moe_norm_true", "gemma3", "mistral", "mixtral", "smollm3", "qwen2_yarn", "gemma3_6layers", "phi3", "phi3_longrope",
               "qwen3_5", "qwen3_5_moe", "gpt_oss", "qwen3_5_wrapped", "qwen3_next", "qwen3_5_moe_wrapped",
               "gemma4_e2b", "gemma4_moe", "qwen3_5_square", "qwen3_5_moe_square",
               "qwen3_5_square_wrapped", "qwen3_5_moe_square_wrapped"]


def _seed_for(case: str) -> int:
    # Variants of one model share their seed (hence their weights) on purpose.
    root = {
        "qwen2_window_legacy": "qwen2_window",
        "qwen3_moe_norm_true": "qwen3_moe_norm_false",
        "gemma3_hub": "gemma3",
        "gpt_oss_limit7": "gpt_oss",
        "gemma4_wrapper": "gemma4_e2b",
    }.get(case, case)
    return 1000 + _SEED_ORDER.index(root)


def _legacy_rope_shape(cfg: dict, key: str = "rope_type") -> dict:
    """transformers-5 ``rope_parameters`` -> hub ``rope_theta`` + ``rope_scaling`` (or nothing)."""
    rp = cfg.pop("rope_parameters", None)
    if rp is None:
        return cfg
    rp = dict(rp)
    cfg["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type", rp.pop("type", "default"))
    if rtype != "default":
        cfg["rope_scaling"] = {key: rtype, **rp}
    return cfg


def write_tiny(
    case: str,
    out_dir: Path,
    dtype: str = "float32",
    legacy_rope: bool | str = False,
    legacy_moe_key: bool = False,
) -> Path:
    """Write the tiny random checkpoint ``case`` to ``out_dir/<case>`` and return that directory.

    dtype: "float32" | "bfloat16" | "float16" (safetensors dtype).
    legacy_rope: False -> config.json as transformers 5 writes it (``rope_parameters``);
                 True -> old hub shape ``rope_theta`` + ``rope_scaling: {"rope_type": ...}``;
                 "type" -> same with the older ``"type"`` key.
    legacy_moe_key: transformers 5 writes the Qwen3-MoE expert count as ``num_local_experts``;
                 hub files (e.g. Qwen3-30B-A3B) say ``num_experts``. True rewrites it to ``num_experts``.
    Variants get their own sub-directory name (suffixes _legacyrope[_type], _hubmoe, _<dtype>).
    """
    import torch
    from transformers import AutoModelForCausalLM

    if case not in CASES:
        raise KeyError(f"unknown tiny case {case!r}; known: {sorted(CASES)}")
    suffix = "" if not legacy_rope else ("_legacyrope_type" if legacy_rope == "type" else "_legacyrope")
    if legacy_moe_key:
        suffix += "_hubmoe"
    d = Path(out_dir) / f"{case}{suffix}{'' if dtype == 'float32' else '_' + dtype}"
    if (d / "config.json").exists() and (d / "model.safetensors").exists():
        return d  # deterministic content: reuse (lets parallel workers share one out_dir)
    d.parent.mkdir(parents=True, exist_ok=True)
    text_dir = write_tiny(WRAPPED[case], out_dir, dtype) if case in WRAPPED else None
    tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.tmp-", dir=d.parent))
    tmp.chmod(0o755)
    try:
        if text_dir is not None:
            _write_wrapper(case, text_dir, tmp, getattr(torch, dtype))
        else:
            cfg = _config(case)
            torch.manual_seed(_seed_for(case))
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
            _randomize(model, _seed_for(case), expert_scale=0.1 if case in ("qwen3_5_moe", "qwen3_next", "gpt_oss", "gpt_oss_limit7",
                                                                     "qwen3_5_moe_square") else 0.3)
            if cfg.tie_word_embeddings:
                model.tie_weights()
            model.to(getattr(torch, dtype))
            model.eval()
            model.generation_config.do_sample = False  # generation defaults: greedy
            model.save_pretrained(tmp, safe_serialization=True)
            if case == "qwen3_next":
                _add_mtp(tmp, "model.layers.3.", cfg.hidden_size, _seed_for(case), getattr(torch, dtype))

        cfg_path = tmp / "config.json"
        conf = json.loads(cfg_path.read_text())
        if case == "qwen2_window_legacy":
            conf.pop("layer_types", None)
        if case == "gemma3_hub":
            conf = _gemma_hub_shape(conf)
        if legacy_rope:
            conf = _legacy_rope_shape(conf, "type" if legacy_rope == "type" else "rope_type")
        if legacy_moe_key and "num_local_experts" in conf:
            conf["num_experts"] = conf.pop("num_local_experts")
        cfg_path.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(tmp, d)
        except OSError:  # another worker published it first
            if not (d / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return d


def _write_wrapper(case: str, text_dir: Path, out: Path, dtype) -> None:
    """The text checkpoint's weights under the wrapper's names (transformers' own wrapper class and
    save_pretrained), beside a tiny random vision tower, plus an MTP head (_add_mtp: transformers
    drops it on load, so it is added to the file after saving)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    text = json.loads((text_dir / "config.json").read_text())
    moe = text["model_type"] == "qwen3_5_moe_text"
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
                  spatial_merge_size=2, out_hidden_size=text["hidden_size"], num_position_embeddings=16)
    cfg = AutoConfig.for_model("qwen3_5_moe" if moe else "qwen3_5", text_config=text, vision_config=vision,
                               tie_word_embeddings=text["tie_word_embeddings"])
    torch.manual_seed(_seed_for(case))
    model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32)
    # the text model's parameters as transformers holds them in memory (stacked experts, as the wrapper)
    weights = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32).state_dict()
    g = torch.Generator().manual_seed(_seed_for(case))
    with torch.no_grad():
        for name, p in model.named_parameters():
            own = name.replace("model.language_model.", "model.", 1)
            p.copy_(weights[own] if own in weights else 0.3 * torch.randn(tuple(p.shape), generator=g))
    model.to(dtype)
    model.save_pretrained(out, safe_serialization=True)
    if moe:  # the hub's files stack the language model's experts as transformers 5 holds them
        _stack_experts(out, {k: v for k, v in model.state_dict().items() if ".mlp.experts." in k})
    _add_mtp(out, f"model.language_model.layers.{text['num_hidden_layers'] - 1}.", text["hidden_size"],
             _seed_for(case), dtype)
    conf = json.loads((out / "config.json").read_text())
    conf["text_config"]["mtp_num_hidden_layers"] = 1
    # the hub's text RoPE keys: interleaved mRoPE sections (plain positions for text; 2 frequencies here)
    conf["text_config"]["rope_parameters"].update(mrope_interleaved=True, mrope_section=[1, 1, 0])
    (out / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    shutil.copy(text_dir / "generation_config.json", out / "generation_config.json")


def _stack_experts(d: Path, stacked: dict) -> None:
    """d/model.safetensors with its per-expert tensors replaced by `stacked` (experts.gate_up_proj
    [E, 2I, H], experts.down_proj [E, H, I] per layer)."""
    from safetensors.torch import load_file, save_file

    kept = {k: v for k, v in load_file(d / "model.safetensors").items() if ".mlp.experts." not in k}
    save_file({**kept, **{k: v.contiguous() for k, v in stacked.items()}}, d / "model.safetensors",
              metadata={"format": "pt"})


def _add_mtp(d: Path, last: str, hidden: int, seed: int, dtype) -> None:
    """Random MTP-head tensors (mtp.*) added to d/model.safetensors, shaped as the hub's: fc, three
    norms and one decoder layer shaped like the model's last (whose names start with `last`)."""
    import torch
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(seed + 1)
    stored = load_file(d / "model.safetensors")
    mtp = {f"mtp.layers.0.{k[len(last):]}": 0.3 * torch.randn(tuple(v.shape), generator=g)
           for k, v in sorted(stored.items()) if k.startswith(last)}
    mtp.update({"mtp.fc.weight": 0.3 * torch.randn((hidden, 2 * hidden), generator=g),
                **{f"mtp.{n}.weight": 1 + 0.2 * torch.randn((hidden,), generator=g)
                   for n in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden")}})
    save_file({**stored, **{k: v.to(dtype).contiguous() for k, v in mtp.items()}}, d / "model.safetensors",
              metadata={"format": "pt"})


def write_all(out_dir: Path, dtype: str = "float32") -> dict[str, Path]:
    return {c: write_tiny(c, out_dir, dtype) for c in CASES}


if __name__ == "__main__":  # python tests/tiny_models.py OUT_DIR
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fuel_tiny")
    for c, p in write_all(out).items():
        print(c, p)


def write_byte_tokenizer(d: Path) -> Path:
    """d/tokenizer.json whose ids are the bytes of the text (GPT-2's byte alphabet, no merges): a
    tokenizer for the tiny checkpoints (VOCAB = 256), so text commands run on them."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    spelling = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    tok = tokenizers.Tokenizer(models.BPE(vocab={ch: b for b, ch in spelling.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(Path(d) / "tokenizer.json"))
    return Path(d)
