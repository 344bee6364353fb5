"""ModelConfig: the one description of a decoder that the reference and the engine both read.

Read from an HF config.json in either shape (hub files: rope_theta + rope_scaling; transformers-5
files: rope_parameters + layer_types) or from GGUF metadata turned into the same dict.
Every resolved value remembers where it came from, for `fuel inspect config`.
"""

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError, located
from ..families import BY_ARCHITECTURE, FAMILIES, Family
from ..fileio.jsondoc import read_object
from .block import ACTIVATIONS, Attention, Block, Ffn
from .rope import SUPPORTED_ROPE_TYPES, RopeConfig
from .sizes import check_weights_fit

REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    tie_embeddings: bool
    blocks: tuple  # one block.Block per layer: what the layer computes
    window_rule: str
    rope_rule: str  # how the layers' RoPEs were chosen, in words
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0  # the shared expert beside a MoE's experts (Block.ffn.shared_expert)
    norm_offset: float = 0.0  # every RMSNorm weight w is applied as norm_offset + w (folded in at load)
    embed_scale: float = 1.0  # the embedding rows are multiplied by it
    final_softcap: float = 0.0  # logits -> c * tanh(logits / c); 0 = none
    bos_token_id: int | None = None
    eos_token_ids: tuple = ()
    per_layer_input_size: int = 0  # Gemma 4's per-layer inputs: each layer's width (Block.per_layer_input)
    per_layer_vocab: int = 0  # the rows of their embedding table
    not_run: str = ""  # what the file holds that fuel reads past and does not run, in words
    origin: dict = field(default_factory=dict, compare=False)  # field -> "config.json" | "default" | "derived" | ...

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def at(self, block) -> "ModelConfig":
        """This config with a layer's own head_dim, KV heads and FFN width where its block has them
        (the shape rules of the weights and the reference read the layer's geometry through it)."""
        a = block.attention
        own = dict(head_dim=a.head_dim or self.head_dim, num_kv_heads=a.kv_heads or self.num_kv_heads,
                   intermediate_size=block.ffn.width or self.intermediate_size)
        return self if all(getattr(self, k) == v for k, v in own.items()) else replace(self, **own)

    @property
    def windows(self) -> tuple:
        """Per layer: 0 = full causal attention, w = query i sees keys i-w < j <= i."""
        return tuple(b.attention.window for b in self.blocks)

    @property
    def linear(self):
        """The linear-attention layers' block.LinearAttention (one per model), or None."""
        return next((b.linear for b in self.blocks if b.linear is not None), None)

    @property
    def moe_layers(self) -> tuple:
        """Per layer: True = sparse MoE FFN."""
        return tuple(b.ffn.moe for b in self.blocks)

    @property
    def rope(self) -> RopeConfig | None:
        """The RoPE of the full-attention layers (of the first layer that has one when no full
        layer does): the model's one RoPE unless its layers differ (block.rope_variants)."""
        ropes = [b.attention.rope for b in self.blocks if b.attention.rope is not None]
        full = [b.attention.rope for b in self.blocks if b.attention.rope is not None and not b.attention.window]
        return (full or ropes or [None])[0]


class _Reader:
    """Looks keys up in the raw dict, falling back to the family defaults, noting the origin."""

    def __init__(self, raw: dict, family: Family, source: str):
        self.raw, self.family, self.source, self.origin = raw, family, source, {}

    def get(self, key: str, name: str | None = None, default=None):
        name = name or key
        if key in self.raw and self.raw[key] is not None:
            self.origin[name] = self.source
            return self.raw[key]
        if key in self.family.defaults:
            self.origin[name] = "default"
            return self.family.defaults[key]
        if default is not None:
            self.origin[name] = "default"
        return default

    def derived(self, name: str, value):
        self.origin[name] = "derived"
        return value

    def integer(self, key: str, name: str | None = None, default=None, optional: bool = False) -> int | None:
        value = self.get(key, name, default)
        if value is None and optional:
            return None
        if not _is_int(value) or value < 0:
            raise ConfigError(f"{key} must be a non-negative integer, got {value!r}")
        return value

    def number(self, key: str, name: str | None = None, default=None) -> float:
        value = self.get(key, name, default)
        if not _is_number(value):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)

    def flag(self, key: str, name: str | None = None, default=False) -> bool:
        value = self.get(key, name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value

    def mapping(self, key: str) -> dict | None:
        """A JSON object or null/absent (None); no family defaults for these."""
        value = self.raw.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{key} must be a JSON object, got {value!r}")
        return value

    def int_list(self, key: str, name: str | None = None) -> list:
        value = self.get(key, name, [])
        if not isinstance(value, list) or not all(_is_int(v) and v >= 0 for v in value):
            raise ConfigError(f"{key} must be a list of non-negative integers, got {value!r}")
        return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def family_of(raw: dict) -> Family:
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"model_type must be a string, got {model_type!r}")
    archs = raw.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"architectures must be a list of strings, got {archs!r}")
    if model_type is None:
        for arch in archs or []:
            if arch in BY_ARCHITECTURE:
                return BY_ARCHITECTURE[arch]
    if model_type not in FAMILIES:
        what = f"model_type {model_type!r}" if model_type else f"architectures {archs!r}"
        raise ConfigError(f"unsupported {what}; supported model_type: {', '.join(FAMILIES)}")
    # transformers follows model_type, vLLM and llama.cpp's converter follow architectures: when
    # they name different families the file is ambiguous, and either guess could be silently wrong
    named = sorted({BY_ARCHITECTURE[a].model_type for a in archs or [] if a in BY_ARCHITECTURE})
    if named and model_type not in named:
        raise ConfigError(f"model_type {model_type!r} disagrees with architectures {archs!r} "
                          f"(model_type {', '.join(named)}); fix one of them")
    return FAMILIES[model_type]


def _scaling_number(scaling: dict, key: str, default, rtype: str) -> float:
    value = scaling.get(key)
    if value is None:
        return default
    if not _is_number(value):
        raise ConfigError(f"rope scaling {rtype!r}: {key} must be a number, got {value!r}")
    return value


def _theta(value, where: str) -> float:
    if not _is_number(value):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{where} must be > 0, got {value!r}")
    return float(value)


def _positive_int(value, what: str) -> int:
    if not _is_int(value) or value <= 0:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def parse_rope(r: _Reader, scaling: dict | None, theta: float) -> RopeConfig:
    """One RoPE: base `theta` and the scaling dict (rope_scaling, or a rope_parameters dict; None or
    type default: none), checked key by key as transformers reads them."""
    if not scaling:
        return RopeConfig(theta=theta)
    rtype = scaling.get("rope_type", scaling.get("type", "default"))
    # "factors" (one divisor per frequency) is what a GGUF rope_freqs tensor says: no config.json type
    known = SUPPORTED_ROPE_TYPES + (("factors",) if r.source == "gguf" else ())
    if not isinstance(rtype, str) or rtype not in known:
        raise ConfigError(f"unsupported rope type {rtype!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    r.origin["rope_scaling"] = r.source
    if rtype == "default":
        return RopeConfig(theta=theta)
    if rtype == "factors":
        return RopeConfig(theta=theta, type="factors", factors=tuple(scaling["factors"]))
    if rtype == "longrope":
        return _longrope(r, scaling, theta)
    if rtype == "proportional":
        return _proportional(scaling, theta)
    original = scaling.get("original_max_position_embeddings")
    if original is None:
        original = r.raw.get("max_position_embeddings", 8192)
    original = _positive_int(original, f"rope scaling {rtype!r}: original_max_position_embeddings")
    factor = scaling.get("factor")
    if factor is None and rtype == "yarn" and _is_int(r.raw.get("max_position_embeddings")):
        factor = r.raw["max_position_embeddings"] / original  # transformers' fallback (DeepSeek-V3)
    if not _is_number(factor) or factor <= 0:
        raise ConfigError(f"rope scaling {rtype!r} needs a positive factor, got {factor!r}")
    if rtype == "linear":
        return RopeConfig(theta=theta, type="linear", factor=float(factor))
    if rtype == "yarn":
        return _yarn(scaling, theta, float(factor), original)
    low = float(_scaling_number(scaling, "low_freq_factor", 1.0, rtype))
    high = float(_scaling_number(scaling, "high_freq_factor", 4.0, rtype))
    # the bands are original/high < wavelength < original/low: both factors divide, and equal
    # factors leave no smoothed band (a hard cut, as transformers computes it)
    if not 0 < low <= high:
        raise ConfigError(f"rope scaling {rtype!r}: needs 0 < low_freq_factor <= high_freq_factor, "
                          f"got low_freq_factor={low:g} and high_freq_factor={high:g}")
    return RopeConfig(theta=theta, type="llama3", factor=float(factor), low_freq_factor=low, high_freq_factor=high,
                      original_max_position=original)


def _yarn(scaling: dict, theta: float, factor: float, original: int) -> RopeConfig:
    """transformers' _compute_yarn_parameters: the ramp's rotations (beta_fast, beta_slow: 32, 1
    when absent or 0) and the factor cos and sin are multiplied by (attention_factor, else from
    mscale / mscale_all_dim, else 0.1 ln(factor) + 1)."""
    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    fast = _scaling_number(scaling, "beta_fast", None, "yarn") or 32.0
    slow = _scaling_number(scaling, "beta_slow", None, "yarn") or 1.0
    attention = _scaling_number(scaling, "attention_factor", None, "yarn")
    if attention is None:
        m, m_all = (_scaling_number(scaling, k, None, "yarn") for k in ("mscale", "mscale_all_dim"))
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ConfigError(f"rope scaling 'yarn': truncate must be true or false, got {truncate!r}")
    if not fast > slow > 0:
        raise ConfigError(f"rope scaling 'yarn': needs beta_fast > beta_slow > 0, got {fast:g} and {slow:g}")
    return RopeConfig(theta=theta, type="yarn", factor=factor, original_max_position=original, beta_fast=float(fast),
                      beta_slow=float(slow), truncate=truncate, attention_factor=float(attention))


def _proportional(scaling: dict, theta: float) -> RopeConfig:
    """transformers' _compute_proportional_rope_parameters: factor (default 1) and
    partial_rotary_factor (default 1) read from the RoPE's own dict."""
    factor = _scaling_number(scaling, "factor", 1.0, "proportional")
    part = _scaling_number(scaling, "partial_rotary_factor", 1.0, "proportional")
    if factor <= 0 or not 0 < part <= 1:
        raise ConfigError(f"rope scaling 'proportional': needs factor > 0 and 0 < partial_rotary_factor <= 1, "
                          f"got {factor!r} and {part!r}")
    return RopeConfig(theta=theta, type="proportional", factor=float(factor), partial_rotary_factor=float(part))


def _longrope(r: _Reader, scaling: dict, theta: float) -> RopeConfig:
    """transformers' _compute_longrope_parameters: short and long per-frequency factors; a top-level
    original_max_position_embeddings wins (Phi-3's configs carry it there); factor, when absent,
    max_position / original; the attention factor sqrt(1 + ln factor / ln original)."""
    factors = {}
    for key in ("short_factor", "long_factor"):
        value = scaling.get(key)
        if not isinstance(value, list) or not value or not all(_is_number(v) and v > 0 for v in value):
            raise ConfigError(f"rope scaling 'longrope': {key} must be a list of numbers > 0, got {value!r}")
        factors[key] = tuple(float(v) for v in value)
    original = r.raw.get("original_max_position_embeddings", scaling.get("original_max_position_embeddings"))
    if original is None:
        original = r.raw.get("max_position_embeddings")
    original = _positive_int(original, "rope scaling 'longrope': original_max_position_embeddings")
    factor = _scaling_number(scaling, "factor", None, "longrope")
    if factor is None:
        factor = _positive_int(r.raw.get("max_position_embeddings"), "max_position_embeddings") / original
    attention = _scaling_number(scaling, "attention_factor", None, "longrope")
    if attention is None:
        attention = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    return RopeConfig(theta=theta, type="longrope", factor=float(factor), original_max_position=original,
                      attention_factor=float(attention), factors=factors["short_factor"],
                      long_factors=factors["long_factor"])


def rope_reader(r: _Reader):
    """rope_for(layer_type) -> the RopeConfig of "full_attention" or "sliding_attention" layers,
    from either shape: `rope_parameters` (transformers 5; one dict, or one per layer type) or
    `rope_theta` + `rope_scaling` (hub files), the same for every layer type."""
    params = r.mapping("rope_parameters")
    if params is not None and any(isinstance(v, dict) for v in params.values()):
        def rope_for(kind: str) -> RopeConfig:
            p = params.get(kind)
            if not isinstance(p, dict):
                raise ConfigError(f"rope_parameters has no object for {kind} layers, got {p!r}")
            theta = p.get("rope_theta")
            r.origin["rope_theta"] = r.source
            return parse_rope(r, p, _theta(theta if theta is not None else r.number("rope_theta"),
                                          f"rope_parameters.{kind}.rope_theta"))
        return rope_for
    if params is not None and params.get("rope_theta") is not None:
        r.origin["rope_theta"] = r.source
        theta = _theta(params["rope_theta"], "rope_parameters.rope_theta")
    else:
        theta = _theta(r.number("rope_theta"), "rope_theta")
    single = parse_rope(r, params if params is not None else r.mapping("rope_scaling"), theta)
    return lambda kind: single


def _eos_ids(*values: tuple) -> tuple:
    """(value, where) pairs: each an int, a list of ints or None."""
    ids = []
    for v, where in values:
        for i in v if isinstance(v, list) else [] if v is None else [v]:
            if not _is_int(i) or i < 0:
                raise ConfigError(f"eos_token_id in {where} must be an integer or a list of integers, got {v!r}")
            if i not in ids:
                ids.append(i)
    return tuple(ids)


def from_hf_config(raw: dict, generation: dict | None = None, source: str = "config.json",
                   file_bytes: int | None = None, key_names: dict | None = None) -> ModelConfig:
    """raw: config.json as a dict; generation: generation_config.json or None. `source` is the origin
    label of values read from `raw`; `file_bytes` (the weight files' size, None when unknown) bounds
    the sizes the config may imply; `key_names` spells keys as the source does (GGUF). The callers
    that read files (load_hf_config, gguf_config) prefix errors with the file's path.

    The steps run in this order, each refusing what it reads before the next reads more: the first
    error names the first thing wrong, and the origins stay in reading order (`fuel inspect config`)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source} is not a JSON object")
    if generation is not None and not isinstance(generation, dict):
        raise ConfigError("generation_config.json is not a JSON object")
    family = family_of(raw)
    raw = family.text_config(raw)
    r = _Reader(raw, family, source)
    _check_supported(r)
    sizes = _attention_sizes(r)
    # before anything per layer is built: embeddings and attention alone must fit the files
    check_weights_fit(sizes, file_bytes, key_names)
    n_layers, head_dim, vocab = sizes["num_hidden_layers"], sizes["head_dim"], sizes["vocab_size"]
    windows, rule = _layer_windows(r, n_layers)
    ffn = _ffn(r, sizes, file_bytes, key_names)
    max_position = r.integer("max_position_embeddings", "max_position")
    if max_position == 0:
        raise ConfigError(f"max_position_embeddings must be > 0 in {source}")
    bos, eos = _special_tokens(r, generation or {}, vocab, key_names)
    blocks, rope_rule = _blocks(r, windows, ffn, head_dim)
    blocks = family.layers(r, blocks)
    return ModelConfig(
        family=family.model_type,
        vocab_size=vocab,
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_layers=n_layers,
        num_heads=sizes["num_attention_heads"],
        num_kv_heads=sizes["num_key_value_heads"],
        head_dim=head_dim,
        rms_norm_eps=_rms_norm_eps(r),
        max_position=max_position,
        tie_embeddings=sizes["tie_word_embeddings"],
        blocks=blocks,
        window_rule=rule,
        rope_rule=rope_rule or "every layer: the config's RoPE",
        num_experts=ffn.num_experts,
        experts_per_tok=ffn.experts_per_tok,
        moe_intermediate_size=ffn.moe_intermediate_size,
        norm_topk_prob=ffn.norm_topk_prob,
        shared_expert_intermediate_size=ffn.shared_intermediate_size,
        norm_offset=family.norm_offset,
        embed_scale=float(family.embed_scale(r, sizes["hidden_size"])),
        final_softcap=_softcap(r, family.softcap_key),
        bos_token_id=bos,
        eos_token_ids=eos,
        not_run=_not_run(r, n_layers),
        **family.model_fields(r),
        origin=r.origin,
    )


def _not_run(r: _Reader, n_layers: int) -> str:
    """The file's parts no path runs, in one line: a GGUF's MTP layers (llama.cpp's nextn layers
    after the model's, which config_from_gguf counts as mtp_num_hidden_layers), or what the family's
    HF files may carry beside the decoder (schema.not_run)."""
    if r.source == "gguf":
        n = r.raw.get("mtp_num_hidden_layers") or 0
        last = f"..{n_layers + n - 1}" if n > 1 else ""
        if n:
            r.origin["not_run"] = r.source
        return f"the multi-token-prediction head (blk.{n_layers}{last}): not run" if n else ""
    parts = [f"{what} ({prefix}*)" for prefix, what in r.family.weights.not_run]
    if parts:
        r.origin["not_run"] = "derived"
    return ", ".join(parts) + ": not run" if parts else ""


def _check_supported(r: _Reader):
    """The required keys present; no flag or key the family has that fuel does not run."""
    raw, family, source = r.raw, r.family, r.source
    for key in REQUIRED:
        if raw.get(key) is None:
            raise ConfigError(f"{source} is missing required key {key!r} (model_type {family.model_type})")
    for key in family.unsupported_flags:
        if raw.get(key) is not None and r.flag(key):
            raise ConfigError(f"{key}=true in {source} is not supported by fuel (model_type {family.model_type})")
    for key in family.unsupported_keys:
        if raw.get(key) is not None:
            raise ConfigError(f"{key}={raw[key]!r} in {source} is not supported by fuel (model_type "
                              f"{family.model_type})")


def _attention_sizes(r: _Reader) -> dict:
    """The sizes of the embeddings and of attention, by their config.json names (check_weights_fit's):
    the heads, kv heads and head_dim consistent, absent ones derived."""
    raw, family, source = r.raw, r.family, r.source
    hidden = r.integer("hidden_size")
    n_layers = r.integer("num_hidden_layers", "num_layers")
    n_heads = r.integer("num_attention_heads", "num_heads")
    if n_heads == 0 or hidden == 0 or n_layers == 0:
        raise ConfigError(f"hidden_size, num_hidden_layers and num_attention_heads must be > 0 in {source}")
    # Absent (or null) kv heads means multi-head attention (as Llama and the seeds read it); 0 is an error.
    if raw.get("num_key_value_heads") is not None:
        n_kv = r.integer("num_key_value_heads", "num_kv_heads")
        if n_kv == 0:
            raise ConfigError(f"num_key_value_heads must be > 0 in {source}, got 0")
    else:
        n_kv = r.derived("num_kv_heads", n_heads)
    if n_heads % n_kv:
        raise ConfigError(
            f"num_attention_heads={n_heads} is not a multiple of num_key_value_heads={n_kv}"
        )
    if raw.get("head_dim") is not None or "head_dim" in family.defaults:
        head_dim = r.integer("head_dim")
    else:
        if hidden % n_heads:
            raise ConfigError(
                f"hidden_size={hidden} is not divisible by num_attention_heads={n_heads} and head_dim is absent"
            )
        head_dim = r.derived("head_dim", hidden // n_heads)
    if head_dim == 0 or head_dim % 2:
        raise ConfigError(f"head_dim={head_dim} must be even and > 0 for rotary embeddings")
    vocab = r.integer("vocab_size")
    return {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": n_layers,
            "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim,
            "tie_word_embeddings": r.flag("tie_word_embeddings", "tie_embeddings")}


def _layer_windows(r: _Reader, n_layers: int) -> tuple:
    """(per layer its attention window, 0 = full; the rule in words), as the family reads them."""
    windows, rule = r.family.windows(r, n_layers)
    if len(windows) != n_layers:
        raise ConfigError(f"layer_types has {len(windows)} entries but num_hidden_layers={n_layers}")
    r.origin["windows"] = "derived"
    if r.raw.get("attention_bias") is not None:
        r.flag("attention_bias")  # the family's qkv_bias / o_bias read it raw
    return windows, rule


def _ffn(r: _Reader, sizes: dict, file_bytes: int | None, key_names: dict | None):
    """The family's FFN per layer (dense or MoE); `sizes` gains the FFN's, and the whole model must
    now fit the files."""
    n_layers = sizes["num_hidden_layers"]
    ffn = r.family.ffn(r, n_layers)
    n_moe = sum(ffn.moe_layers)
    sizes.update(intermediate_size=r.integer("intermediate_size"), num_experts=ffn.num_experts,
                 moe_intermediate_size=ffn.moe_intermediate_size)
    check_weights_fit(sizes, file_bytes, key_names, n_layers - n_moe, n_moe)
    return ffn


def _special_tokens(r: _Reader, gen: dict, vocab: int, key_names: dict | None) -> tuple:
    """(bos id or None, eos ids): EOS from config.json and generation_config.json together, else the
    family's default; every id inside the vocabulary."""
    raw, source = r.raw, r.source
    eos = _eos_ids((raw.get("eos_token_id"), source), (gen.get("eos_token_id"), "generation_config.json"))
    if eos:
        r.origin["eos_token_ids"] = source if raw.get("eos_token_id") is not None else "generation_config.json"
    elif "eos_token_id" in r.family.defaults:
        eos = _eos_ids((r.get("eos_token_id", "eos_token_ids"), "the family defaults"))
    bos = r.integer("bos_token_id", optional=True)
    # a special token beyond the embedding table: the config and the weights disagree
    for key, ids in (("bos_token_id", [] if bos is None else [bos]), ("eos_token_id", eos)):
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise ConfigError(f"{(key_names or {}).get(key, key)}={bad[0]} is outside the vocabulary "
                              f"(vocab_size={vocab})")
    return bos, eos


def _blocks(r: _Reader, windows, ffn, head_dim: int) -> tuple:
    """(one Block per layer: its attention, RoPE and FFN; the rule that chose the RoPEs, in words)."""
    family, raw = r.family, r.raw
    ropes, rope_rule = family.ropes(r, windows, rope_reader(r))
    rotary_dim = family.rotary_dim(r, head_dim)
    attention = dict(qk_norm=family.qk_norm, qkv_bias=family.qkv_bias(raw), o_bias=family.o_bias(raw),
                     scale=family.attention_scale(r, head_dim), output_gate=family.output_gate, rotary_dim=rotary_dim,
                     sinks=family.sinks)
    act = _activation(r, family.activation_key)
    mixers = family.mixers(r, len(windows))

    def mixer(i: int) -> Attention:  # a linear-attention layer has no softmax attention, hence no RoPE
        return Attention(rope=None) if mixers[i] else Attention(window=int(windows[i]), rope=ropes[i], **attention)

    def ffn_of(i: int) -> Ffn:  # the router's and experts' options where the layer has experts
        moe = ffn.moe_layers[i]
        extra = dict(router=ffn.router, router_bias=ffn.router_bias, expert_bias=ffn.expert_bias,
                     swiglu_limit=ffn.swiglu_limit, swiglu_alpha=ffn.swiglu_alpha) if moe else {}
        return Ffn(moe, act, shared_expert=ffn.shared_intermediate_size > 0, **extra)

    blocks = tuple(Block(mixer(i), ffn_of(i), sandwich=family.sandwich, linear=mixers[i]) for i in range(len(windows)))
    rotated, what = (rotary_dim, f"its {rotary_dim} rotated dimensions") if rotary_dim else (head_dim, f"head_dim {head_dim}")
    for rope in {b.attention.rope for b in blocks} - {None}:
        for name, values in (("factors", rope.factors), ("long factors", rope.long_factors)):
            if values and len(values) != rotated // 2:
                raise ConfigError(f"the RoPE's {len(values)} {name} do not fit {what}: it needs one "
                                  f"per frequency, {rotated // 2}")
    return blocks, rope_rule


def _activation(r: _Reader, key: str) -> str:
    name = r.get(key, "activation")
    for act, spellings in ACTIVATIONS.items():
        if name in spellings:
            return act
    known = ", ".join(s for spellings in ACTIVATIONS.values() for s in spellings)
    raise ConfigError(f"{key}={name!r} is not supported; supported: {known}")


def _softcap(r: _Reader, key: str | None) -> float:
    if key is None or r.raw.get(key) is None:
        return 0.0
    cap = r.number(key, "final_softcap")
    if cap <= 0:
        raise ConfigError(f"{key} must be > 0 or null, got {cap!r}")
    return cap


def _rms_norm_eps(r: _Reader) -> float:
    eps = r.number("rms_norm_eps")
    if eps < 0:
        raise ConfigError(f"rms_norm_eps must be >= 0, got {eps!r}")
    return eps


def load_hf_config(model_dir: Path, file_bytes: int | None = None) -> ModelConfig:
    """config.json (+ generation_config.json) of a model directory; file_bytes: its weight files' size."""
    raw = read_object(model_dir / "config.json", error=ConfigError)
    generation = read_object(model_dir / "generation_config.json", required=False, error=ConfigError)
    return located(str(model_dir / "config.json"), lambda: from_hf_config(raw, generation, file_bytes=file_bytes))
