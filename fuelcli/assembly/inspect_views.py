"""What `fuel inspect` shows, as plain data (dicts and lists) the CLI renders as tables or JSON.

    mask_plan_view(model)  one row per layer (attention, mask, RoPE, norms, FFN) + the distinct mask
                           variants and the rules (config only)
    config_view(model)     every resolved ModelConfig value with its origin; the blocks' properties
                           as one value when every layer agrees, else per layer
    weights_view(model)    the stored tensor table (name, shape, format, bytes), totals, parameter count
    rope_view(model)       per RoPE of the model (and the layers using it), per frequency index: base
                           and scaled inverse frequency, wavelength, band

Only weights_view touches the weight files, and only their headers (tensor data stays in the mmap).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from ..model.block import rope_variants
from ..model.plan import ACTIVATION_NAMES, mask_plan, rope_text
from ..model.rope import base_inv_freq, inv_freq, llama3_bands
from ..model.sizes import kv_values_per_token, state_bytes


def ranges(indices) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0–2, 5, 7–8'."""
    out, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


# ---------------------------------------------------------------- mask plan


def ffn_text(cfg, block) -> str:
    kind = f"MoE {cfg.experts_per_tok} of {cfg.num_experts}" if block.ffn.moe else "dense"
    kind += " + shared expert" if block.ffn.shared_expert else ""
    text = kind if block.ffn.activation == "silu" else f"{kind} {ACTIVATION_NAMES[block.ffn.activation]}"
    extras = [f"MoE {cfg.experts_per_tok} of {cfg.num_experts}" if block.ffn.moe_beside else "",
              "per-layer input" if block.per_layer_input else ""]
    return " + ".join([text] + [e for e in extras if e])


def mask_plan_view(model) -> dict:
    cfg = model.cfg
    plan = mask_plan(cfg)
    return {
        "model": model.source.name,
        "family": cfg.family,
        "num_layers": cfg.num_layers,
        "layers": [
            {
                "index": lp.index,
                "attention": lp.attention,
                "window": lp.window,
                "mask": plan.variant_of(lp.index),
                "rope": lp.rope,
                "norms": lp.norms,
                "ffn": ffn_text(cfg, lp.block),
                "moe": lp.moe,
            }
            for lp in plan.layers
        ],
        "variants": [
            {"name": v.name, "window": v.window, "layers": list(v.layers), "layer_ranges": ranges(v.layers)}
            for v in plan.variants
        ],
        "num_variants": len(plan.variants),
        "rule": plan.rule,
        "rope_rule": cfg.rope_rule,
        "moe_layers": [i for i, m in enumerate(cfg.moe_layers) if m],
        "nope_layers": [i for i, b in enumerate(cfg.blocks) if b.attention.rope is None],
        "sink_layers": [i for i, b in enumerate(cfg.blocks) if b.attention.sinks],
        # layer -> the earlier layer whose k/v it attends to (it keeps no cache)
        "shared_kv_layers": {str(i): b.attention.kv_from for i, b in enumerate(cfg.blocks)
                             if b.attention.kv_from is not None},
        "per_layer_input_layers": [i for i, b in enumerate(cfg.blocks) if b.per_layer_input],
    }


# ---------------------------------------------------------------- config

# Fields whose value no single config key gave: where they come from when `origin` does not say.
_FALLBACK_ORIGIN = {
    "family": "derived",  # model_type / architectures / general.architecture
    "qkv_bias": "family",
    "o_bias": "family",
    "qk_norm": "family",
    "attention_scale": "family",
    "sandwich_norms": "family",
    "norm_offset": "family",
    "embed_scale": "family",
    "window_rule": "derived",
    "rope_rule": "derived",
    "windows": "derived",
    "rope_layers": "derived",
    "moe_layers": "derived",
    "layer_head_dims": "derived",
    "layer_kv_heads": "derived",
    "kv_from": "derived",
    "kv_bytes_per_token_f32": "derived",
    "kv_bytes_per_token_saved_by_sharing": "derived",
}


def _jsonable(v):
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def _per_layer(values: list, always_list: bool = False):
    """One value when every layer agrees (unless always_list), else the per-layer list."""
    return values if always_list or len(set(values)) > 1 else values[0]


def _block_rows(cfg) -> dict:
    """The blocks' properties as config rows: name -> value (one, or one per layer)."""
    att = [b.attention for b in cfg.blocks]
    variants = rope_variants(cfg)
    rows = {
        "windows": _per_layer([a.window for a in att], always_list=True),
        "qkv_bias": _per_layer([a.qkv_bias for a in att]),
        "o_bias": _per_layer([a.o_bias for a in att]),
        "qk_norm": _per_layer([a.qk_norm for a in att]),
        "attention_scale": _per_layer([a.scale for a in att]),
        "activation": _per_layer([b.ffn.activation for b in cfg.blocks]),
        "sandwich_norms": _per_layer([b.sandwich for b in cfg.blocks]),
        "moe_layers": _per_layer([b.ffn.moe for b in cfg.blocks], always_list=True),
    }
    geometry = [cfg.at(b) for b in cfg.blocks]
    if any(c is not cfg for c in geometry):
        rows["layer_head_dims"] = [c.head_dim for c in geometry]
        rows["layer_kv_heads"] = [c.num_kv_heads for c in geometry]
    if any(a.kv_from is not None for a in att):
        # K and V of every position in f32 (a windowed layer's cache may keep fewer positions)
        per_layer = [2 * c.num_kv_heads * c.head_dim * 4 for c in geometry]
        kept = sum(n for n, a in zip(per_layer, att) if a.kv_from is None)
        rows["kv_from"] = [a.kv_from for a in att]
        rows["kv_bytes_per_token_f32"] = kept
        rows["kv_bytes_per_token_saved_by_sharing"] = sum(per_layer) - kept
    if len(variants) > 1 or any(a.rope is None for a in att):
        # which RoPE each layer rotates with (rope_view lists them), None: no RoPE
        rows["rope_layers"] = [None if a.rope is None else rope_text(a.rope) for a in att]
    return rows


def config_view(model) -> dict:
    cfg = model.cfg
    origin = cfg.origin or {}
    rows = []

    def add(name, value):
        o = origin.get(name) or _FALLBACK_ORIGIN.get(name) or "default"
        rows.append({"name": name, "value": _jsonable(value), "origin": o})

    for f in dataclasses.fields(cfg):
        if f.name in ("origin", "blocks"):
            continue
        add(f.name, getattr(cfg, f.name))
    rope = cfg.rope
    for rf in dataclasses.fields(rope) if rope is not None else ():
        if rf.name == "theta":
            o = origin.get("rope_theta", "default")
        else:
            o = origin.get("rope_scaling") or ("default" if rope.type == "default" else "derived")
            o = origin.get(f"rope_{rf.name}", o)
        rows.append({"name": f"rope.{rf.name}", "value": _jsonable(getattr(rope, rf.name)), "origin": o})
    for name, value in _block_rows(cfg).items():
        add(name, value)
    for name in ("q_dim", "kv_dim"):
        rows.append({"name": name, "value": getattr(cfg, name), "origin": "derived"})
    # a sequence's memory: the KV cache grows with its tokens, a linear layer's state does not
    rows.append({"name": "kv_bytes_per_token", "value": 4 * kv_values_per_token(cfg),
                 "origin": "derived"})
    if cfg.linear is not None:
        rows.append({"name": "linear_layers", "value": [i for i, b in enumerate(cfg.blocks) if b.linear],
                     "origin": "derived"})
        rows.append({"name": "state_bytes_per_sequence", "value": state_bytes(cfg), "origin": "derived"})
    return {"model": model.source.name, "source_kind": model.source.kind, "values": rows}


# ---------------------------------------------------------------- weights


def _raw_tensors(model):
    """Every tensor in the file (norms and biases included) under its file name, from the file's own
    table: the GGUF tensor infos or the safetensors headers."""
    if model.gguf is not None:
        return list(model.gguf.tensors.values()), "gguf tensor table"
    from ..weights.safetensors import read_checkpoint

    return list(read_checkpoint(model.source.path).values()), "safetensors headers"


def natural_key(name: str) -> tuple:
    """Sorts numbered names by their numbers: blk.2 before blk.10, as a file manager would."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name))


def weights_view(model) -> dict:
    tensors, table = _raw_tensors(model)
    tensors = sorted(tensors, key=lambda t: natural_key(t.name))
    rows, per_format = [], {}
    total_params = total_bytes = 0
    for t in tensors:
        numel, nbytes = t.numel, t.nbytes
        rows.append({"name": t.name, "shape": list(t.shape), "format": t.fmt, "bytes": nbytes, "params": numel})
        agg = per_format.setdefault(t.fmt, {"format": t.fmt, "tensors": 0, "params": 0, "bytes": 0})
        agg["tensors"] += 1
        agg["params"] += numel
        agg["bytes"] += nbytes
        total_params += numel
        total_bytes += nbytes
    for agg in per_format.values():
        agg["bits_per_weight"] = 8 * agg["bytes"] / agg["params"] if agg["params"] else 0.0
    tied = bool(model.cfg.tie_embeddings)
    return {
        "model": model.source.name,
        "table": table,
        "tensors": rows,
        "formats": sorted(per_format.values(), key=lambda a: -a["bytes"]),
        "num_tensors": len(rows),
        "params": total_params,
        "bytes": total_bytes,
        "tie_embeddings": tied,
    }


# ---------------------------------------------------------------- rope


def _rope_table(rope, d: int) -> dict:
    base = base_inv_freq(d, rope.theta)
    scaled = inv_freq(rope, d)
    bands = llama3_bands(rope, base) if rope.type == "llama3" else None
    rows = []
    for i in range(d // 2):
        rows.append({
            "index": i,
            "dims": [i, i + d // 2],
            "base_inv_freq": float(base[i]),
            "inv_freq": float(scaled[i]),
            "wavelength": 2 * math.pi / float(base[i]),
            "scaled_wavelength": 2 * math.pi / float(scaled[i]),
            "band": None if bands is None else str(bands[i]),
        })
    params = {"theta": rope.theta, "type": rope.type}
    if rope.type in ("linear", "llama3", "yarn"):
        params["factor"] = rope.factor
    if rope.type == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor,
                      original_max_position=rope.original_max_position,
                      high_freq_wavelen=rope.original_max_position / rope.high_freq_factor,
                      low_freq_wavelen=rope.original_max_position / rope.low_freq_factor)
    if rope.type == "yarn":
        params.update(original_max_position=rope.original_max_position, beta_fast=rope.beta_fast,
                      beta_slow=rope.beta_slow, attention_factor=rope.attention_factor)
    counts = {}
    if bands is not None:
        for b in bands:
            counts[str(b)] = counts.get(str(b), 0) + 1
    return {"rope": params, "frequencies": rows, "band_counts": counts}


def rope_view(model) -> dict:
    """The model's RoPE (of its full-attention layers) at the top; every RoPE it has in `variants`,
    each with the layers that rotate with it; `nope_layers`: the layers without RoPE."""
    cfg = model.cfg
    d = cfg.head_dim
    variants = []
    for rope in rope_variants(cfg):
        layers = [i for i, b in enumerate(cfg.blocks) if b.attention.rope == rope]
        variants.append({"layers": layers, "layer_ranges": ranges(layers), **_rope_table(rope, d)})
    main = _rope_table(cfg.rope, d) if cfg.rope is not None else {"rope": None, "frequencies": [], "band_counts": {}}
    return {"model": model.source.name, "head_dim": d, **main, "variants": variants,
            "nope_layers": [i for i, b in enumerate(cfg.blocks) if b.attention.rope is None], "rule": cfg.rope_rule}
