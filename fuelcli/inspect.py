"""What `fuel inspect` shows, as plain data (dicts and lists) the CLI renders as tables or JSON.

    mask_plan_view(model)  one row per layer + the distinct mask variants and the rule (config only)
    config_view(model)     every resolved ModelConfig value with its origin
    weights_view(model)    the stored tensor table (name, shape, format, bytes), totals, parameter count
    rope_view(model)       per frequency index: base and scaled inverse frequency, wavelength, band

Only weights_view touches the weight files, and only their headers (tensor data stays in the mmap).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from .plan import mask_plan
from .rope import base_inv_freq, inv_freq, llama3_bands


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


def ffn_text(cfg, moe: bool) -> str:
    return f"MoE {cfg.experts_per_tok} of {cfg.num_experts}" if moe else "dense"


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
                "ffn": ffn_text(cfg, lp.moe),
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
        "moe_layers": [i for i, m in enumerate(cfg.moe_layers) if m],
    }


# ---------------------------------------------------------------- config

# Fields whose value no single config key gave: where they come from when `origin` does not say.
_FALLBACK_ORIGIN = {
    "family": "derived",  # model_type / architectures / general.architecture
    "qkv_bias": "family",
    "o_bias": "family",
    "qk_norm": "family",
    "window_rule": "derived",
    "windows": "derived",
    "moe_layers": "derived",
}


def _jsonable(v):
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def config_view(model) -> dict:
    cfg = model.cfg
    origin = cfg.origin or {}
    rows = []
    for f in dataclasses.fields(cfg):
        if f.name == "origin":
            continue
        value = getattr(cfg, f.name)
        if f.name == "rope":
            for rf in dataclasses.fields(value):
                if rf.name == "theta":
                    o = origin.get("rope_theta", "default")
                else:
                    o = origin.get("rope_scaling") or ("default" if value.type == "default" else "derived")
                    o = origin.get(f"rope_{rf.name}", o)
                rows.append({"name": f"rope.{rf.name}", "value": _jsonable(getattr(value, rf.name)), "origin": o})
            continue
        o = origin.get(f.name) or _FALLBACK_ORIGIN.get(f.name) or "default"
        rows.append({"name": f.name, "value": _jsonable(value), "origin": o})
    for name in ("q_dim", "kv_dim"):
        rows.append({"name": name, "value": getattr(cfg, name), "origin": "derived"})
    return {"model": model.source.name, "source_kind": model.source.kind, "values": rows}


# ---------------------------------------------------------------- weights


def _raw_tensors(model):
    """Every tensor in the file (norms and biases included) under its file name, from the file's own
    table: the GGUF tensor infos or the safetensors headers."""
    if model.gguf is not None:
        return list(model.gguf.tensors.values()), "gguf tensor table"
    from .weights.safetensors import read_checkpoint

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


def rope_view(model) -> dict:
    cfg = model.cfg
    rope, d = cfg.rope, cfg.head_dim
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
    if rope.type in ("linear", "llama3"):
        params["factor"] = rope.factor
    if rope.type == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor,
                      original_max_position=rope.original_max_position,
                      high_freq_wavelen=rope.original_max_position / rope.high_freq_factor,
                      low_freq_wavelen=rope.original_max_position / rope.low_freq_factor)
    counts = {}
    if bands is not None:
        for b in bands:
            counts[str(b)] = counts.get(str(b), 0) + 1
    return {"model": model.source.name, "head_dim": d, "rope": params, "frequencies": rows, "band_counts": counts}
