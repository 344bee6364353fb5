"""The readable oracle: a plain numpy forward over the whole prefix, no cache, f32.

It reads the same ModelConfig (windows, MoE layers, RoPE) and ModelWeights as the engine, so a
family's semantics is written once; only the arithmetic is written twice, slowly and plainly here.
"""

import numpy as np

from .config import ModelConfig
from .rope import cos_sin
from .formats import dequantize
from .weights.build import ModelWeights
from .weights.tensor import Tensor


def rows(t: Tensor, ids) -> np.ndarray:
    return dequantize(Tensor(t.name, t.fmt, (len(ids), t.shape[-1]), t.data[np.asarray(ids)]))


def linear(x: np.ndarray, t: Tensor, bias: np.ndarray | None = None) -> np.ndarray:
    y = x @ dequantize(t).T
    return y if bias is None else y + bias


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def rotate_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, D]; pairs (i, i + D/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def causal_mask(T: int, window: int) -> np.ndarray:
    """True where query i may see key j: j <= i, and i - w < j when the layer is windowed."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = j <= i
    return allowed & (j > i - window) if window > 0 else allowed


def attention(cfg: ModelConfig, layer, x: np.ndarray, window: int, cos, sin) -> np.ndarray:
    T, D = x.shape[0], cfg.head_dim
    q = linear(x, layer.q, layer.q_bias).reshape(T, cfg.num_heads, D)
    k = linear(x, layer.k, layer.k_bias).reshape(T, cfg.num_kv_heads, D)
    v = linear(x, layer.v, layer.v_bias).reshape(T, cfg.num_kv_heads, D)
    if cfg.qk_norm:
        q, k = rmsnorm(q, layer.q_norm, cfg.rms_norm_eps), rmsnorm(k, layer.k_norm, cfg.rms_norm_eps)
    q, k = rotate_half(q, cos, sin), rotate_half(k, cos, sin)
    group = cfg.num_heads // cfg.num_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # GQA: kv head h // group
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(np.float32(D))
    scores = np.where(causal_mask(T, window)[None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("hts,shd->thd", p, v).reshape(T, cfg.num_heads * D)
    return linear(out, layer.o, layer.o_bias)


def swiglu(x, gate: Tensor, up: Tensor, down: Tensor) -> np.ndarray:
    return linear(silu(linear(x, gate)) * linear(x, up), down)


def route(cfg: ModelConfig, logits: np.ndarray):
    """softmax over all experts (f32), top-k, divided by their sum only if norm_topk_prob."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, : cfg.experts_per_tok]
    w = np.take_along_axis(p, top, axis=-1)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    return top, w


def moe(cfg: ModelConfig, layer, x: np.ndarray) -> np.ndarray:
    top, w = route(cfg, linear(x, layer.router))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, we in zip(top[t], w[t]):
            out[t] += we * swiglu(x[t : t + 1], layer.gate_exps[e], layer.up_exps[e], layer.down_exps[e])[0]
    return out


@np.errstate(all="ignore")  # NaN/inf weights or float32 overflow: no warnings, the caller checks (finite.py)
def trunk(cfg: ModelConfig, weights: ModelWeights, tokens, hidden: bool = False):
    """The final-normed hidden states [T, H] (what the output head reads); with hidden=True also the
    residual stream after the embedding and after each layer, [L+1, T, H]."""
    tokens = list(tokens)
    T = len(tokens)
    cos, sin = cos_sin(cfg.rope, cfg.head_dim, T)
    x = rows(weights.embed, tokens)
    states = [x]
    for i, layer in enumerate(weights.layers):
        x = x + attention(cfg, layer, rmsnorm(x, layer.attn_norm, cfg.rms_norm_eps), cfg.windows[i], cos, sin)
        h = rmsnorm(x, layer.ffn_norm, cfg.rms_norm_eps)
        x = x + (moe(cfg, layer, h) if cfg.moe_layers[i] else swiglu(h, layer.gate, layer.up, layer.down))
        states.append(x)
    out = rmsnorm(x, weights.final_norm, cfg.rms_norm_eps)
    return (out, np.stack(states).astype(np.float32)) if hidden else out


@np.errstate(all="ignore")
def head(weights: ModelWeights, x: np.ndarray, output: np.ndarray | None = None) -> np.ndarray:
    """Logits [T, vocab] float32 of final-normed states; `output` is the dequantised output matrix
    when the caller keeps it across calls (a long text's rows go through in slices)."""
    w = dequantize(weights.output) if output is None else output
    return (x @ w.T).astype(np.float32)


def forward(cfg: ModelConfig, weights: ModelWeights, tokens, hidden: bool = False):
    """Logits [T, vocab] for every position; with hidden=True also the residual stream after the
    embedding and after each layer, [L+1, T, H] (the engine's hidden_out)."""
    out = trunk(cfg, weights, tokens, hidden)
    x, states = out if hidden else (out, None)
    logits = head(weights, x)
    return (logits, states) if hidden else logits
