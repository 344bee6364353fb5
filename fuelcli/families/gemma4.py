"""Gemma 4 (gemma4_text, and the multimodal `gemma4` wrapper's text_config): Gemma 3's layout (sandwich
norms, GELU-tanh, QK-norm, local and global layers, a √hidden embedding scale, tied embeddings, an
optional final softcap) with:

- norms applied as w (not 1 + w), and an RMSNorm without weight on v; q·k scaled by 1;
- per layer type its own head_dim and KV heads: global layers `global_head_dim` (and, with
  `attention_k_eq_v`, `num_global_key_value_heads`), or as transformers 5 writes it
  `per_layer_config` {layer: {head_dim, num_key_value_heads}}; with `attention_k_eq_v` global
  layers have no v_proj, v is k's projection;
- RoPE per layer type; global layers' `proportional`: a share of the frequencies over the whole head;
- the last `num_kv_shared_layers` layers keep no k/v and attend to those of the last earlier layer
  of their type; with `use_double_wide_mlp` their FFN is twice as wide;
- per-layer inputs (`hidden_size_per_layer_input` > 0): a packed embedding table of every layer's
  input row per token and a projection of the embedding, gated into each layer after its FFN;
- `layer_scalar`, a stored scalar each layer's output is multiplied by;
- `enable_moe_block`: a routed MoE beside every layer's dense FFN (block.Ffn.moe_beside).

The wrapper's vision and audio towers are read past (their tensors accepted) and not run.
"""

from dataclasses import replace

from ..errors import ConfigError
from ..model.rope import RopeConfig
from .base import COMMON_DEFAULTS, Family, FfnPlan
from .gemma3 import gemma_windows
from .schema import DECODER, Fused

SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' RoPEs when a config has no rope_parameters
_DEFAULT_ROPES = {SLIDING: RopeConfig(theta=10_000.0),
                  FULL: RopeConfig(theta=1_000_000.0, type="proportional", partial_rotary_factor=0.25)}


def gemma4_windows(r, n_layers: int):
    windows, rule = gemma_windows(r, n_layers)
    if windows and windows[-1]:  # transformers forces the last layer global (and warns)
        windows = list(windows[:-1]) + [0]
        rule += "; the last layer global (transformers forces it)"
    return windows, rule


def gemma4_ropes(r, windows, rope_for):
    if r.raw.get("rope_parameters") is None:
        r.origin["rope_theta"] = "default"
        local, full = _DEFAULT_ROPES[SLIDING], _DEFAULT_ROPES[FULL]
    else:
        local, full = rope_for(SLIDING), rope_for(FULL)
    ropes = [local if w else full for w in windows]
    kind = "" if full.type == "default" else f" {full.type}" + (
        f" over {full.partial_rotary_factor:g} of the frequencies" if full.type == "proportional" else "")
    return ropes, f"local layers θ={local.theta:g}, global layers θ={full.theta:g}{kind}"


def gemma4_ffn(r, n_layers: int) -> FfnPlan:
    if not r.flag("enable_moe_block"):
        return FfnPlan((False,) * n_layers)
    experts, k = r.integer("num_experts"), r.integer("top_k_experts")
    if not 0 < k <= experts:
        raise ConfigError(f"top_k_experts={k} must be in 1..num_experts={experts}")
    # the experts sit beside the dense FFN (Ffn.moe_beside, set in gemma4_layers), not instead of it
    return FfnPlan((False,) * n_layers, experts, k, r.integer("moe_intermediate_size"), True)


def _layer_geometry(r, windows) -> dict:
    """{layer: {"head_dim": d, "num_key_value_heads": n}} of the layers that differ from the config's."""
    stored = r.raw.get("per_layer_config")
    if stored is not None:
        if not isinstance(stored, dict):
            raise ConfigError(f"per_layer_config must be a JSON object, got {stored!r}")
        r.origin["per_layer_config"] = r.source
        out = {}
        for key, values in stored.items():
            if not (str(key).isdigit() and int(key) < len(windows)) or not isinstance(values, dict):
                raise ConfigError(f"per_layer_config: {key!r}: {values!r} is not a layer index and an object")
            unknown = set(values) - {"head_dim", "num_key_value_heads"}
            if unknown:
                raise ConfigError(f"per_layer_config of layer {key} sets {sorted(unknown)[0]!r}, which fuel does "
                                  "not read per layer")
            out[int(key)] = values
        return out
    overrides = {"head_dim": r.integer("global_head_dim")}
    if r.flag("attention_k_eq_v") and r.raw.get("num_global_key_value_heads") is not None:
        overrides["num_key_value_heads"] = r.integer("num_global_key_value_heads")
    return {i: overrides for i, w in enumerate(windows) if not w}


def _kv_sources(r, windows) -> list:
    """Per layer: None, or the layer whose k/v it attends to (the last one of its type before the
    shared ones)."""
    n, shared = len(windows), r.integer("num_kv_shared_layers")
    if shared >= n:
        raise ConfigError(f"num_kv_shared_layers={shared} leaves no layer of the {n} to keep k/v")
    first = n - shared
    sources = [None] * n
    for i in range(first, n):
        same = [j for j in range(first) if bool(windows[j]) == bool(windows[i])]
        if not same:
            raise ConfigError(f"layer {i} shares k/v (num_kv_shared_layers={shared}) but no earlier layer of its "
                              "type keeps them")
        sources[i] = same[-1]
    return sources


def gemma4_layers(r, blocks: tuple) -> tuple:
    if r.raw.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention='all' is not supported by fuel (model_type gemma4_text)")
    windows = [b.attention.window for b in blocks]
    geometry, sources = _layer_geometry(r, windows), _kv_sources(r, windows)
    heads = r.integer("num_attention_heads")
    for i, g in geometry.items():
        for key, value in g.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or (key == "head_dim" and value % 2):
                raise ConfigError(f"layer {i}'s {key} must be a positive (head_dim: even) integer, got {value!r}")
        if heads % g.get("num_key_value_heads", 1):
            raise ConfigError(f"num_attention_heads={heads} is not a multiple of layer {i}'s "
                              f"num_key_value_heads={g['num_key_value_heads']}")
    k_eq_v, wide = r.flag("attention_k_eq_v"), r.flag("use_double_wide_mlp")
    moe = r.flag("enable_moe_block")
    per_layer = r.integer("hidden_size_per_layer_input") > 0
    width = 2 * r.integer("intermediate_size")
    out = []
    for i, b in enumerate(blocks):
        g = geometry.get(i, {})
        # 0 where the layer's is the model's (ModelConfig.at), however the file said it
        own_dim = 0 if g.get("head_dim") == r.integer("head_dim") else g.get("head_dim", 0)
        own_kv = 0 if g.get("num_key_value_heads") == (r.raw.get("num_key_value_heads") or heads) \
            else g.get("num_key_value_heads", 0)
        attention = replace(b.attention, head_dim=own_dim, kv_heads=own_kv,
                            v_norm=True, v_is_k=k_eq_v and not b.attention.window, kv_from=sources[i])
        ffn = replace(b.ffn, width=width if wide and sources[i] is not None else 0, moe_beside=moe)
        out.append(replace(b, attention=attention, ffn=ffn, per_layer_input=per_layer, layer_scalar=True))
    return tuple(out)


def gemma4_fields(r) -> dict:
    size = r.integer("hidden_size_per_layer_input", "per_layer_input_size")
    if not size:
        return {}
    vocab = r.integer("vocab_size_per_layer_input", "per_layer_vocab")
    if vocab < r.integer("vocab_size"):
        raise ConfigError(f"vocab_size_per_layer_input={vocab} is smaller than vocab_size={r.integer('vocab_size')}: "
                          "some tokens would have no per-layer input")
    return {"per_layer_input_size": size, "per_layer_vocab": vocab}


def text_config(raw: dict) -> dict:
    """The wrapper's text_config, under the wrapper's names (its tie_word_embeddings where it says)."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"a gemma4 config.json needs a text_config object, got {text!r}")
    out = {**text, "model_type": raw["model_type"], "architectures": raw.get("architectures")}
    if raw.get("tie_word_embeddings") is not None:
        out["tie_word_embeddings"] = raw["tie_word_embeddings"]
    return out


def gguf_config(meta: dict, d: dict):
    """What llama.cpp's converter writes of a gemma4 file, back into config.json's terms: the local
    layers' head_dim in key_length_swa (key_length is the global layers'), KV heads and FFN widths
    per layer, the layer types as a list of bools, the global layers' proportional RoPE as
    rope_freqs factors (1 for a rotated frequency, 1e30 for one that is not)."""
    n, shared = d.get("num_hidden_layers"), d.get("num_kv_shared_layers", 0)
    pattern = meta.get("gemma4.attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) != n:
        raise ConfigError(f"gemma4.attention.sliding_window_pattern must hold one bool per layer ({n}), "
                          f"got {pattern!r}")
    d["layer_types"] = [SLIDING if p else FULL for p in pattern]
    full_dim, d["head_dim"] = d.get("head_dim"), meta.get("gemma4.attention.key_length_swa")
    kv = d.get("num_key_value_heads")
    kv = kv if isinstance(kv, list) else [kv] * n
    d["num_key_value_heads"] = kv[pattern.index(True)] if True in pattern else kv[0]
    d["per_layer_config"] = {str(i): {"head_dim": full_dim, "num_key_value_heads": kv[i]}
                             for i, p in enumerate(pattern) if not p}
    ff = d.get("intermediate_size")
    if isinstance(ff, list):
        wide = [ff[0] if i < n - shared else 2 * ff[0] for i in range(n)]
        if ff not in ([ff[0]] * n, wide):
            raise ConfigError(f"gemma4.feed_forward_length {ff} is neither one width nor twice it on the "
                              f"{shared} layers that share KV (use_double_wide_mlp)")
        d["intermediate_size"], d["use_double_wide_mlp"] = ff[0], ff != [ff[0]] * n
    factors = d.pop("rope_scaling", {}).get("factors")
    rotated = len(factors) if not factors else next((i for i, f in enumerate(factors) if f != 1), len(factors))
    if factors and any(f < 1e29 for f in factors[rotated:]):
        raise ConfigError("rope_freqs of a gemma4 file must be 1 (rotated) then 1e30 (not rotated) per frequency")
    part = 2 * rotated / full_dim if factors else 1.0
    if int(part * full_dim // 2) != rotated:
        raise ConfigError(f"{rotated} rotated frequencies of head_dim {full_dim} are no partial_rotary_factor")
    if meta.get("gemma4.rope.dimension_count_swa", d["head_dim"]) != d["head_dim"]:
        raise ConfigError("gemma4.rope.dimension_count_swa != key_length_swa: partial RoPE on local layers is not "
                          "supported")
    d["rope_parameters"] = {
        SLIDING: {"rope_type": "default", "rope_theta": meta.get("gemma4.rope.freq_base_swa", 10_000.0)},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": part, "rope_theta": d.pop("rope_theta")}}
    d["enable_moe_block"] = "num_experts" in d
    if d["enable_moe_block"]:
        d["top_k_experts"] = d.pop("num_experts_per_tok")
    d["hidden_size_per_layer_input"] = meta.get("gemma4.embedding_length_per_layer_input", 0)
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None:
        d["vocab_size_per_layer_input"] = len(tokens)


def gguf_tensors_config(names: set, d: dict):
    """attention_k_eq_v: a global layer that keeps its own KV stores no attn_v."""
    n = d["num_hidden_layers"]
    own = range(n - d.get("num_kv_shared_layers", 0))
    d["attention_k_eq_v"] = any(d["layer_types"][i] == FULL and f"blk.{i}.attn_v.weight" not in names for i in own)


_X = "model.layers.{i}.experts"
WEIGHTS = replace(
    DECODER.renamed(hf={"post_attn_norm": "model.layers.{i}.post_attention_layernorm.weight",
                        "ffn_norm": "model.layers.{i}.pre_feedforward_layernorm.weight",
                        "post_ffn_norm": "model.layers.{i}.post_feedforward_layernorm.weight",
                        "router": "model.layers.{i}.router.proj.weight"},
                    gguf={"post_attn_norm": "blk.{i}.post_attention_norm.weight",
                          "post_ffn_norm": "blk.{i}.post_ffw_norm.weight",
                          "router_scale": "blk.{i}.ffn_gate_inp.scale",
                          "per_expert_scale": "blk.{i}.ffn_down_exps.scale",
                          "post_ffn_norm_1": "blk.{i}.post_ffw_norm_1.weight",
                          "ffn_norm_2": "blk.{i}.pre_ffw_norm_2.weight",
                          "post_ffn_norm_2": "blk.{i}.post_ffw_norm_2.weight",
                          "pl_gate": "blk.{i}.inp_gate.weight",
                          "pl_proj": "blk.{i}.proj.weight",
                          "pl_norm": "blk.{i}.post_norm.weight",
                          "layer_scalar": "blk.{i}.layer_output_scale.weight"}),
    # the experts are stored stacked: gate|up rows of each expert in one tensor, down in another
    fused=(Fused(("gate_exps", "up_exps"), hf=f"{_X}.gate_up_proj", with_names={"down_exps": f"{_X}.down_proj"}),
           Fused(("gate_exps", "up_exps"), gguf="blk.{i}.ffn_gate_up_exps.weight")),
    per_layer_inputs=tuple(replace(w, gguf=name) for w, name in zip(
        DECODER.per_layer_inputs,
        ("per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"))),
)


# the multimodal wrapper's language model: every `model.` name under `model.language_model.`
_TOWERS = (("model.vision_tower.", "the vision tower"), ("model.embed_vision.", "the vision embedding"),
           ("model.audio_tower.", "the audio tower"), ("model.embed_audio.", "the audio embedding"))


_DEFAULTS = {**COMMON_DEFAULTS, "vocab_size": 262_144, "max_position_embeddings": 131_072, "head_dim": 256,
             "sliding_window": 512, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
             "bos_token_id": 2, "eos_token_id": 1, "global_head_dim": 512, "attention_k_eq_v": False,
             "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "enable_moe_block": False,
             "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262_144}

GEMMA4_TEXT = Family(
    model_type="gemma4_text",
    architectures=("Gemma4ForCausalLM",),
    gguf_arch="gemma4",
    defaults=_DEFAULTS,
    windows=gemma4_windows,
    ffn=gemma4_ffn,
    qk_norm=True,
    ropes=gemma4_ropes,
    attention_scale=lambda r, head_dim: 1.0,
    activation_key="hidden_activation",
    sandwich=True,
    embed_scale=lambda r, hidden: hidden ** 0.5,
    softcap_key="final_logit_softcapping",
    weights=WEIGHTS,
    layers=gemma4_layers,
    model_fields=gemma4_fields,
    gguf_keys={"attention.sliding_window": "sliding_window", "final_logit_softcapping": "final_logit_softcapping",
               "attention.shared_kv_layers": "num_kv_shared_layers"},
    gguf_per_layer=("feed_forward_length", "attention.head_count_kv"),
    gguf_config=gguf_config,
    gguf_tensors_config=gguf_tensors_config,
)

# a GGUF file of either is arch gemma4 (the text family's)
GEMMA4 = replace(GEMMA4_TEXT, model_type="gemma4", architectures=("Gemma4ForConditionalGeneration",), gguf_arch=None,
                 weights=WEIGHTS.nested("model.language_model.", _TOWERS), text_config=text_config, model_fields=gemma4_fields)
