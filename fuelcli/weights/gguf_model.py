"""GGUF metadata -> ModelConfig, GGUF tensor names -> ModelWeights.

The metadata is first turned into an HF-style config.json dict so that `config.from_hf_config`
stays the one place where a config is validated and resolved, whatever the file kind.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model.config import ModelConfig, from_hf_config
from ..errors import ConfigError, located
from ..families import BY_GGUF_ARCH, FAMILIES
from .gguf import GGUFFile
from .gguf_meta import positions
from .build import Lookup, ModelWeights, build_weights
from .tensor import Tensor

# GGUF key suffix (after "{arch}.") -> HF config.json key
_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "context_length": "max_position_embeddings",
    "attention.key_length": "head_dim",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}


def _scalar(v, key: str):
    # head_count(_kv) may be a per-layer array in some files; a uniform one is fine.
    if isinstance(v, list):
        if len(set(v)) != 1:
            raise ConfigError(f"GGUF key {key} holds per-layer values {v[:4]}{'...' if len(v) > 4 else ''}: "
                              "fuel needs the same value for every layer")
        return v[0]
    return v


# RoPE factors llama.cpp's converter writes as tensors: per-frequency divisors (llama3 scaling), and
# LongRoPE's long and short ones (Phi-3); the config reads them, the weights do not
ROPE_FREQS, ROPE_LONG, ROPE_SHORT = "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"
ROPE_TENSORS = (ROPE_FREQS, ROPE_LONG, ROPE_SHORT)
# "{arch}.rope.scaling." key suffix -> rope_scaling key (what convert_hf_to_gguf writes from it)
_SCALING_KEYS = {"factor": "factor", "original_context_length": "original_max_position_embeddings",
                 "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow", "yarn_attn_factor": "attention_factor",
                 "attn_factor": "attention_factor"}


def config_from_gguf(meta: dict, tensor_names=None, rope_tensors: dict | None = None) -> dict:
    """GGUF metadata (+ the tensor names, which say tying and biases, and the values of the RoPE
    factor tensors the file holds, ROPE_TENSORS) -> HF config.json dict."""
    arch = meta.get("general.architecture")
    family = BY_GGUF_ARCH.get(arch)
    if family is None:
        raise ConfigError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(BY_GGUF_ARCH)}"
        )
    names = set(tensor_names or ())
    d: dict = {"model_type": family.model_type}
    for key, hf in {**_KEYS, **family.gguf_keys}.items():
        if f"{arch}.{key}" in meta:
            value = meta[f"{arch}.{key}"]
            d[hf] = value if key in family.gguf_per_layer else _scalar(value, f"{arch}.{key}")
    mtp = meta.get(f"{arch}.nextn_predict_layers", 0)
    if mtp and isinstance(d.get("num_hidden_layers"), int):
        # llama.cpp counts a multi-token-prediction head's layers (after the model's) in block_count
        if mtp >= d["num_hidden_layers"]:
            raise ConfigError(f"{arch}.nextn_predict_layers={mtp} leaves no layers of {arch}.block_count="
                              f"{d['num_hidden_layers']}")
        d["num_hidden_layers"] -= mtp
        d["mtp_num_hidden_layers"] = mtp
    vlen = meta.get(f"{arch}.attention.value_length")
    if vlen is not None and vlen != d.get("head_dim", vlen):
        raise ConfigError(f"key_length {d['head_dim']} != value_length {vlen} is not supported")
    if "intermediate_size" not in d and "moe_intermediate_size" in d:
        d["intermediate_size"] = d["moe_intermediate_size"]  # all-MoE files may omit the dense size
    d.update(family.gguf_defaults)

    stype = meta.get(f"{arch}.rope.scaling.type")
    scaling = {hf: meta[f"{arch}.rope.scaling.{key}"] for key, hf in _SCALING_KEYS.items()
               if f"{arch}.rope.scaling.{key}" in meta}
    if stype not in (None, "none"):
        # linear, yarn and longrope are supported; others fail in from_hf_config with the list
        d["rope_scaling"] = {"rope_type": stype, **scaling}
    rope_tensors = rope_tensors or {}
    if rope_tensors and stype not in (None, "none", "longrope"):
        raise ConfigError(f"both {arch}.rope.scaling.type {stype} and RoPE factor tensors: which RoPE is meant?")
    if ROPE_FREQS in rope_tensors:
        # llama.cpp's converter writes llama3 scaling as one divisor per frequency (Llama-3.1/3.2)
        d["rope_scaling"] = {"rope_type": "factors", "factors": rope_tensors[ROPE_FREQS]}
    elif ROPE_LONG in rope_tensors or ROPE_SHORT in rope_tensors:
        missing = ROPE_SHORT if ROPE_LONG in rope_tensors else ROPE_LONG
        if missing not in rope_tensors:
            raise ConfigError(f"LongRoPE needs both factor tensors: {missing} is missing")
        # Phi-3 files: the factors as tensors, the original context and attention factor as keys
        d["rope_scaling"] = {**scaling, "rope_type": "longrope", "long_factor": rope_tensors[ROPE_LONG],
                             "short_factor": rope_tensors[ROPE_SHORT]}
    if family.gguf_config is not None:
        family.gguf_config(meta, d)
    if family.gguf_tensors_config is not None and tensor_names is not None:
        family.gguf_tensors_config(names, d)

    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None:
        d["vocab_size"] = len(tokens)
    elif f"{arch}.vocab_size" in meta:
        d["vocab_size"] = meta[f"{arch}.vocab_size"]
    if tensor_names is not None:
        schema = family.weights
        d["tie_word_embeddings"] = schema.role("output").name("gguf") not in names
        d["attention_bias"] = schema.role("q_bias").name("gguf") in names  # families with fixed biases ignore it
    if "tokenizer.ggml.bos_token_id" in meta:
        d["bos_token_id"] = meta["tokenizer.ggml.bos_token_id"]
    eos = [meta[f"tokenizer.ggml.{k}_token_id"] for k in ("eos", "eot", "eom") if f"tokenizer.ggml.{k}_token_id" in meta]
    # llama.cpp also ends generation on control tokens it knows by text (Qwen's file names only
    # <|im_end|>, yet a base-style continuation ends in <|endoftext|>, which hub generation_config lists)
    tokens, types = meta.get("tokenizer.ggml.tokens") or [], meta.get("tokenizer.ggml.token_type") or []
    eos += [i for i in positions(types, 3, len(tokens)) if tokens[i] in END_OF_GENERATION]
    if eos:
        d["eos_token_id"] = list(dict.fromkeys(eos))
    return d


END_OF_GENERATION = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                     "<|end_of_text|>", "<EOT>"}


def gguf_key_names(meta: dict) -> dict:
    """HF config key -> the GGUF key it came from, for error messages."""
    arch = meta.get("general.architecture")
    names = {hf: f"{arch}.{key}" for key, hf in _KEYS.items()}
    names["vocab_size"] = ("the length of tokenizer.ggml.tokens" if "tokenizer.ggml.tokens" in meta
                           else f"{arch}.vocab_size")
    names["bos_token_id"] = "tokenizer.ggml.bos_token_id"
    return names


def _rope_tensors(gf: GGUFFile) -> dict:
    """The RoPE factor tensors of the file (ROPE_TENSORS): name -> factors (f32, 1-D, each finite
    and > 0)."""
    out = {}
    for name in ROPE_TENSORS:
        t = gf.tensors.get(name)
        if t is None:
            continue
        if t.fmt != "f32" or len(t.shape) != 1:
            raise ConfigError(f"{name} must be a 1-D f32 tensor, got {t.fmt} {list(t.shape)}")
        factors = np.frombuffer(t.data.tobytes(), np.float32)
        if not (np.isfinite(factors).all() and (factors > 0).all()):
            raise ConfigError(f"{name} holds a factor that is not a finite number > 0")
        out[name] = [float(f) for f in factors]
    return out


def gguf_config(gf: GGUFFile) -> ModelConfig:
    def build():
        raw = config_from_gguf(gf.meta, gf.tensors.keys(), _rope_tensors(gf))
        return from_hf_config(raw, source="gguf", file_bytes=gf.size, key_names=gguf_key_names(gf.meta))

    return located(gf.path, build)


def unpermute_rows(a: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's q/k permute (HF rotate-half -> ggml adjacent pairs) on rows.

    Inverse of llama.cpp's permute; the same formula as transformers' `_reverse_permute_weights`.
    Works on the uint8 row matrix of any block format (rows are independent) and on 1-D biases.
    """
    half = a.shape[0] // n_head // 2
    return np.ascontiguousarray(a.reshape(n_head, half, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape))


def _unpermuted(t: Tensor, n_head: int) -> Tensor:
    data = unpermute_rows(t.data, n_head)
    # Read-only like every other weight (views of the read-only mmap): the un-permuted copy is the
    # one weight that would otherwise be writable, so a stray in-place write fails here as it does
    # everywhere else instead of silently changing only llama q/k. (The engine reads addresses, so
    # nothing needs a uniform array type any more.)
    data.flags.writeable = False
    return Tensor(t.name, t.fmt, t.shape, data)


def _unpermute(x, n_head: int):
    return _unpermuted(x, n_head) if isinstance(x, Tensor) else unpermute_rows(x, n_head)


def load_gguf_weights(gf: GGUFFile, cfg: ModelConfig) -> ModelWeights:
    w = Lookup(gf.tensors, gf.path)
    w.taken.update(n for n in ROPE_TENSORS if n in gf.tensors)  # read into the config's RoPE (config_from_gguf)
    family = FAMILIES[cfg.family]
    mtp = gf.meta.get(f"{gf.meta.get('general.architecture')}.nextn_predict_layers", 0)
    schema = replace(family.weights, not_run=family.weights.not_run + tuple(
        (f"blk.{i}.", "the multi-token-prediction head") for i in range(cfg.num_layers, cfg.num_layers + mtp)))
    return build_weights(w, schema, "gguf", cfg, _unpermute if family.gguf_permuted_qk else None)
