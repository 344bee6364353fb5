"""Compare fuel's fast path with an oracle: per position max|Δ| of the logits, top-1 agreement and
KL(oracle ‖ fuel); optionally per layer max|Δ| of the residual stream, naming the first layer out of
tolerance. The oracles:

  self          fuel's own numpy reference (reference.py): one full-prefix forward, which by causality
                gives at position t exactly what a forward over ids[:t+1] gives.
  transformers  HF transformers, eager attention, float32, on the same weights (directory, or the .gguf
                file through `gguf_file=`).
  PATH          saved logits [seq, vocab]: .npy, .npz (key `logits` or the first array), .safetensors
                (key `logits` or the only tensor).

The fuel side ("decode" path, the default) prefills all but the last `decode_steps` tokens in one batch
(at least one token) and then decodes the rest one at a time through the KV cache, so both the batched
and the persistent-decode kernels are on trial; the "prefill" path runs the whole sequence as one batch.

Default tolerances were measured on the tiny random f32 checkpoints of tests/tiny_models.py and on
SmolLM2-135M Q4_1: see DEFAULT_TOL and DEFAULT_LAYER_RTOL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError, MissingDependency, NonFinite

# The verdict is on KL(oracle ‖ fuel) per position, which does not grow with the logits' scale
# (max|Δ| does: SmolLM2's residual stream reaches |x| ≈ 2.3e4). Measured, largest KL at any position:
#   tiny f32 checkpoints (tests/tiny_models.py) vs self or transformers: ≤ 1e-10
#   SmolLM2-135M bf16 directory, tokens 1..12, vs self: 1.6e-8 (max|Δ| 2.0e-3)
#   SmolLM2-135M Q4_1 GGUF, tokens 1..12, vs self: 1.5e-6 (max|Δ| 1.3e-2; int16 activations on decode)
#   SmolLM2-135M Q4_1 GGUF, tokens 1..8, vs self: 6.2e-5 (the worst seen: special-token ids drive
#     the massive activations of SmolLM2's residual stream, which int16 activations round hardest)
#   Qwen2.5-Coder-0.5B Q4_K_M, tokens 1..12, vs self: 2.1e-8 (max|Δ| 1.3e-3)
# Every semantic break we tried (window direction, top-k routing, RoPE scaling) gives a max KL of
# 3e-2 or more and usually flips top-1 somewhere; 1e-3 sits 16x above the worst correct case and
# 30x below the mildest break.
DEFAULT_TOL = 1e-3
DEFAULT_MIN_TOP1 = 1.0
# per-layer max|Δ| / max|oracle state|. Measured worst: 8.3e-4 (SmolLM2 Q4_1, int16 activations,
# layer 9), ≤ 4e-5 in f32; the breaks give ≥ 7e-2 at the first bad layer.
DEFAULT_LAYER_RTOL = 1e-2
DEFAULT_DECODE_STEPS = 3


@dataclass
class PositionDiff:
    pos: int
    token: int
    step: str  # "prefill" | "decode"
    max_abs: float
    top1_fuel: int
    top1_oracle: int
    kl: float

    @property
    def top1_agree(self) -> bool:
        return self.top1_fuel == self.top1_oracle


@dataclass
class LayerDiff:
    layer: int  # -1 = the embeddings (input to layer 0); i = the residual stream after layer i
    max_abs: float
    scale: float  # max|oracle state| of that layer
    rel: float  # max_abs / scale
    ok: bool  # rel <= layer_tol


@dataclass
class DiffResult:
    oracle: str
    path: str
    tokens: list
    prefill_len: int
    positions: list
    tol: float  # largest allowed KL at any position
    min_top1: float
    atol: float | None = None  # optional bound on max|Δ| of the logits
    layers: list = field(default_factory=list)
    layer_tol: float | None = None
    layer_oracle: str | None = None

    @property
    def max_abs(self) -> float:
        return max(p.max_abs for p in self.positions)

    @property
    def mean_kl(self) -> float:
        return float(np.mean([p.kl for p in self.positions]))

    @property
    def max_kl(self) -> float:
        return max(p.kl for p in self.positions)

    @property
    def top1_rate(self) -> float:
        return sum(p.top1_agree for p in self.positions) / len(self.positions)

    @property
    def first_bad_layer(self) -> int | None:
        return next((lay.layer for lay in self.layers if not lay.ok), None)

    @property
    def passed(self) -> bool:
        return not self.reasons()

    def position_ok(self, p: PositionDiff) -> bool:
        return p.kl <= self.tol and p.top1_agree and (self.atol is None or p.max_abs <= self.atol)

    def reasons(self) -> list:
        out = []  # `not x <= tol`: a NaN never passes
        if not self.max_kl <= self.tol:
            out.append(f"max KL {self.max_kl:.3g} > tol {self.tol:g}")
        if self.atol is not None and not self.max_abs <= self.atol:
            out.append(f"max|Δ| {self.max_abs:.3g} > atol {self.atol:g}")
        if self.top1_rate < self.min_top1:
            out.append(f"top-1 agreement {self.top1_rate:.3f} < {self.min_top1:g}")
        return out

    def to_json(self) -> dict:
        return {
            "oracle": self.oracle,
            "path": self.path,
            "tokens": list(self.tokens),
            "prefill_len": self.prefill_len,
            "decode_steps": len(self.tokens) - self.prefill_len if self.path == "decode" else 0,
            "positions": [{**asdict(p), "top1_agree": p.top1_agree} for p in self.positions],
            "summary": {
                "max_abs": self.max_abs,
                "mean_kl": self.mean_kl,
                "max_kl": self.max_kl,
                "top1_rate": self.top1_rate,
            },
            "tol": self.tol,
            "atol": self.atol,
            "min_top1": self.min_top1,
            "layers": [asdict(lay) for lay in self.layers] if self.layers else None,
            "layer_oracle": self.layer_oracle,
            "layer_tol": self.layer_tol,
            "first_bad_layer": self.first_bad_layer,
            "passed": self.passed,
            "verdict": "pass" if self.passed else "mismatch",
            "reasons": self.reasons(),
        }


# ---------------------------------------------------------------- metrics


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl_div(oracle: np.ndarray, fuel: np.ndarray) -> np.ndarray:
    """KL(oracle ‖ fuel) per row, in nats, computed in float64."""
    lo, lf = _log_softmax(oracle), _log_softmax(fuel)
    return np.maximum((np.exp(lo) * (lo - lf)).sum(-1), 0.0)


def compare_logits(fuel: np.ndarray, oracle: np.ndarray, ids, prefill_len: int) -> list:
    if fuel.shape != oracle.shape:
        raise InputError(f"logits shapes differ: fuel {list(fuel.shape)} vs oracle {list(oracle.shape)}")
    diff = np.abs(fuel.astype(np.float64) - oracle.astype(np.float64)).max(-1)
    kl = kl_div(oracle, fuel)
    tf, to = fuel.argmax(-1), oracle.argmax(-1)
    return [
        PositionDiff(t, int(ids[t]), "prefill" if t < prefill_len else "decode", float(diff[t]), int(tf[t]),
                     int(to[t]), float(kl[t]))
        for t in range(len(ids))
    ]


def compare_layers(fuel_states: np.ndarray, oracle_states: np.ndarray, rtol: float) -> list:
    """[L+1, T, H] each: entry 0 = embeddings, entry i+1 = after layer i. The residual stream grows
    with depth (|x| ~ 50-100 on the tiny models, hundreds on real ones), so a layer is judged by
    max|Δ| relative to max|oracle state| of that layer."""
    if fuel_states.shape != oracle_states.shape:
        raise InputError(f"hidden-state shapes differ: fuel {list(fuel_states.shape)} vs "
                         f"oracle {list(oracle_states.shape)}")
    n = len(fuel_states)
    f, o = fuel_states.astype(np.float64).reshape(n, -1), oracle_states.astype(np.float64).reshape(n, -1)
    m, scale = np.abs(f - o).max(-1), np.maximum(np.abs(o).max(-1), 1e-30)
    rel = m / scale
    return [LayerDiff(i - 1, float(m[i]), float(scale[i]), float(rel[i]), bool(rel[i] <= rtol)) for i in range(n)]


# ---------------------------------------------------------------- fuel side


def split(n: int, path: str, decode_steps: int) -> int:
    """How many tokens the fuel side prefills in one batch."""
    if path == "prefill":
        return n
    if n < 2:
        raise InputError(f"the decode path needs at least 2 tokens (1 prefilled + decoded ones), got {n}")
    return max(1, n - decode_steps)


def fuel_side(model, ids: list, path: str, decode_steps: int = DEFAULT_DECODE_STEPS, hidden: bool = False,
              device: str | None = None):
    """Logits [T, V] (and residual stream [L+1, T, H]) from the engine; returns (logits, states, prefill_len)."""
    from .backends import make_engine
    from .finite import check_engine_logits
    from .forward_paths import logits_by_path

    # ids are validated by diff(); logits_by_path's "prefill" is exactly our prefill path.
    if path == "prefill":
        out = logits_by_path(model, ids, "prefill", hidden=hidden, device=device)
        logits, states = out if hidden else (out, None)
        return np.asarray(logits, np.float32), states, len(ids)
    n_pre = split(len(ids), path, decode_steps)
    engine = make_engine(model.cfg, model.weights, n_ctx=len(ids), device=device)
    out = engine.prefill(ids[:n_pre], all_logits=True, hidden=hidden)
    rows, states = ([out[0]], [out[1]]) if hidden else ([out], [])
    for t in ids[n_pre:]:
        o = engine.decode(t, hidden=hidden)
        if hidden:
            rows.append(o[0][None, :])
            states.append(o[1])
        else:
            rows.append(o[None, :])
    logits = np.concatenate(rows).astype(np.float32)
    check_engine_logits(engine, logits, ids, path)
    return logits, (np.concatenate(states, axis=1) if hidden else None), n_pre


# ---------------------------------------------------------------- oracles


def self_oracle(model, ids: list, hidden: bool = False):
    from . import reference
    from .finite import check_reference_logits

    out = reference.forward(model.cfg, model.weights, ids, hidden=hidden)
    check_reference_logits(model.cfg, model.weights, out[0] if hidden else out, ids)
    return out if hidden else (out, None)


def _hf_load(model):
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        pkg = "torch" if "torch" in str(e) else "transformers"
        raise MissingDependency(
            f"--oracle transformers needs the `{pkg}` package: pip install torch transformers"
            + (" gguf" if model.source.kind == "gguf" else "")
        ) from None
    import torch
    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars on stderr
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    src = model.source
    try:
        if src.kind == "gguf":
            try:
                import gguf  # noqa: F401
            except ImportError:
                raise MissingDependency("--oracle transformers on a .gguf file needs the `gguf` package: "
                                        "pip install gguf") from None
            hf = AutoModelForCausalLM.from_pretrained(str(src.path.parent), gguf_file=src.path.name, **kw)
        else:
            hf = AutoModelForCausalLM.from_pretrained(str(src.path), **kw)
    except MissingDependency:
        raise
    except Exception as e:  # an architecture transformers does not know, a broken file, ...
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise InputError(f"transformers could not load {src.name}: {type(e).__name__}: {first}") from None
    hf.eval()
    return hf


def transformers_oracle(model, ids: list, hidden: bool = False):
    """Logits [T, V] and, with hidden, the residual stream [L+1, T, H] like the engine's: transformers'
    output_hidden_states[:-1] (embeddings, after layers 0..L-2) plus the last decoder layer's own output
    taken with a forward hook (hidden_states[-1] is after the final norm, not comparable)."""
    from .finite import first_bad_row

    hf = _hf_load(model)
    import torch

    captured = {}
    handle = None
    if hidden:
        layers = hf.model.layers

        def hook(_mod, _inp, out):
            captured["last"] = out[0] if isinstance(out, (tuple, list)) else out

        handle = layers[-1].register_forward_hook(hook)
    try:
        with torch.inference_mode():
            out = hf(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False,
                     output_hidden_states=hidden)
    finally:
        if handle is not None:
            handle.remove()
    logits = out.logits[0].float().numpy().astype(np.float32)
    bad = first_bad_row(logits)
    if bad is not None:
        raise NonFinite(f"the transformers oracle's logits at position {bad} are NaN or inf")
    if not hidden:
        return logits, None
    hs = [h[0].float().numpy() for h in out.hidden_states[:-1]]
    last = captured["last"]
    hs.append((last[0] if last.dim() == 3 else last).float().numpy())
    return logits, np.stack(hs).astype(np.float32)


def load_saved_logits(path: Path, n_tokens: int, vocab: int) -> np.ndarray:
    from .files import is_present, open_regular

    if not is_present(path):
        raise InputError(f"{path}: no such file (--oracle takes self, transformers or a .npy/.npz/.safetensors file)")
    open_regular(path).close()  # a FIFO or a directory is refused here, before a reader blocks on it
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                if not z.files:
                    raise InputError(f"{path}: empty .npz")
                arr = z["logits"] if "logits" in z.files else z[z.files[0]]
        elif suffix == ".safetensors":
            from safetensors.numpy import load_file

            tensors = load_file(str(path))
            if "logits" in tensors:
                arr = tensors["logits"]
            elif len(tensors) == 1:
                arr = next(iter(tensors.values()))
            else:
                raise InputError(f"{path}: {len(tensors)} tensors and none named 'logits'")
        else:
            raise InputError(f"{path}: unknown logits file type {suffix!r} (use .npy, .npz or .safetensors)")
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"{path}: cannot read logits: {type(e).__name__}: {e}") from None
    if arr.ndim != 2 or arr.shape != (n_tokens, vocab):
        raise InputError(f"{path}: logits of shape {list(arr.shape)}, expected [seq={n_tokens}, vocab={vocab}]")
    if not np.issubdtype(arr.dtype, np.floating):
        raise InputError(f"{path}: logits dtype {arr.dtype} is not floating point")
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        row = int(np.argmax(~np.isfinite(arr).all(-1)))
        raise InputError(f"{path}: the saved logits at position {row} are NaN or inf (or beyond float32)")
    return arr


# ---------------------------------------------------------------- the command's library entry


def diff(model, ids: list, oracle: str = "self", path: str = "decode", tol: float = DEFAULT_TOL,
         min_top1: float = DEFAULT_MIN_TOP1, layers: bool = False, layer_tol: float = DEFAULT_LAYER_RTOL,
         decode_steps: int = DEFAULT_DECODE_STEPS, atol: float | None = None,
         device: str | None = None) -> DiffResult:
    if path not in ("decode", "prefill"):
        raise InputError(f"--path must be decode or prefill, got {path!r}")
    if decode_steps < 1:
        raise InputError(f"--decode-steps must be at least 1, got {decode_steps}")
    from .forward_paths import validate_ids

    validate_ids(model, ids)
    fuel_logits, fuel_states, n_pre = fuel_side(model, ids, path, decode_steps, hidden=layers, device=device)
    if oracle == "self":
        ref_logits, ref_states = self_oracle(model, ids, hidden=layers)
        name, layer_oracle = "self (reference.py, full-prefix numpy forward)", "reference.py"
    elif oracle == "transformers":
        ref_logits, ref_states = transformers_oracle(model, ids, hidden=layers)
        name, layer_oracle = "transformers (eager, float32)", "transformers"
    else:
        if layers:
            raise InputError("--layers needs hidden states: use --oracle self or --oracle transformers "
                             "(saved logits carry none)")
        ref_logits, ref_states = load_saved_logits(Path(oracle), len(ids), model.cfg.vocab_size), None
        name, layer_oracle = f"saved logits {oracle}", None
    if ref_logits.shape != fuel_logits.shape:
        raise InputError(f"oracle logits {list(ref_logits.shape)} vs fuel {list(fuel_logits.shape)}")
    result = DiffResult(name, path, list(ids), n_pre, compare_logits(fuel_logits, ref_logits, ids, n_pre),
                        tol, min_top1, atol)
    if layers:
        result.layers = compare_layers(fuel_states, ref_states, layer_tol)
        result.layer_tol, result.layer_oracle = layer_tol, layer_oracle
    return result
