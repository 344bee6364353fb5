"""The readable oracle: a plain numpy forward over the whole prefix, no cache, f32.

It interprets the same per-layer blocks (block.py) and ModelWeights as the engines, so a family's
semantics is written once; only the arithmetic is written twice, slowly and plainly here.
"""

import math

import numpy as np

from . import delta_rule
from ..model.block import Block, Ffn
from ..model.config import ModelConfig
from ..model.finite import first_bad_row, require_finite
from ..model.rope import cos_sin
from ..formats import dequantize
from ..weights.build import ModelWeights
from ..weights.tensor import Tensor


def rows(t: Tensor, ids) -> np.ndarray:
    return dequantize(Tensor(t.name, t.fmt, (len(ids), t.shape[-1]), t.data[np.asarray(ids)]))


def linear(x: np.ndarray, t: Tensor, bias: np.ndarray | None = None) -> np.ndarray:
    if t.columns is not None:
        x = x[..., t.columns]
    y = x @ dequantize(t).T
    return y if bias is None else y + bias


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """transformers' gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    c = np.float32(math.sqrt(2 / math.pi))
    return np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


ACT = {"silu": silu, "gelu_tanh": gelu_tanh}


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


def rotate(a, x: np.ndarray) -> np.ndarray:
    """RoPE over the leading rotary_dim of each head (all of it when 0)."""
    if a.rope is None:
        return x
    R = a.rotary_dim or x.shape[-1]
    cos, sin = cos_sin(a.rope, R, x.shape[0])
    return np.concatenate([rotate_half(x[..., :R], cos, sin), x[..., R:]], axis=-1)


def keys_values(cfg: ModelConfig, block: Block, layer, x: np.ndarray):
    """The layer's k (normed, rotated) and v [T, kv_heads, D], as a cache would keep them."""
    a, T = block.attention, x.shape[0]
    k = linear(x, layer.k, layer.k_bias).reshape(T, cfg.num_kv_heads, cfg.head_dim)
    v = k if a.v_is_k else linear(x, layer.v, layer.v_bias).reshape(T, cfg.num_kv_heads, cfg.head_dim)
    if a.qk_norm:
        k = rmsnorm(k, layer.k_norm, cfg.rms_norm_eps)
    if a.v_norm:
        v = rmsnorm(v, np.float32(1), cfg.rms_norm_eps)
    return rotate(a, k), v


def attention(cfg: ModelConfig, block: Block, layer, x: np.ndarray, kv: dict | None = None,
              index: int = 0) -> np.ndarray:
    """kv: layer index -> its (k, v), filled here and read by the layers that share a layer's
    (Attention.kv_from)."""
    a = block.attention
    cfg = cfg.at(block)
    T, D = x.shape[0], cfg.head_dim
    q = linear(x, layer.q, layer.q_bias).reshape(T, cfg.num_heads, D)
    if a.qk_norm:
        q = rmsnorm(q, layer.q_norm, cfg.rms_norm_eps)
    q = rotate(a, q)
    if a.kv_from is not None:
        k, v = kv[a.kv_from]
    else:
        k, v = keys_values(cfg, block, layer, x)
        if kv is not None:
            kv[index] = (k, v)
    group = cfg.num_heads // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # GQA: kv head h // group
    scale = np.float32(1 / np.sqrt(np.float32(D)) if a.scale is None else a.scale)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    scores = np.where(causal_mask(T, a.window)[None], scores, -np.inf)
    p = softmax_with_sinks(scores, layer.sinks) if a.sinks else softmax(scores)
    out = np.einsum("hts,shd->thd", p, v).reshape(T, cfg.num_heads * D)
    if a.output_gate:
        out = out * sigmoid(linear(x, layer.q_gate))
    return linear(out, layer.o, layer.o_bias)


def softmax(scores: np.ndarray) -> np.ndarray:
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def softmax_with_sinks(scores: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """scores [heads, T, S]: each head's sink logit joins the denominator and takes no value."""
    sink = sinks.astype(np.float32)[:, None, None]
    top = np.maximum(scores.max(-1, keepdims=True), sink)
    p = np.exp(scores - top)
    return p / (p.sum(-1, keepdims=True) + np.exp(sink - top))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x).astype(np.float32)


def causal_conv(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x [T, channels] through a causal depthwise conv of weight [channels, taps], then SiLU."""
    taps = weight.shape[1]
    padded = np.concatenate([np.zeros((taps - 1, x.shape[1]), np.float32), x])
    out = sum(padded[j:j + len(x)] * weight[:, j] for j in range(taps))
    return silu(out)


def linear_attention(cfg: ModelConfig, block: Block, layer, x: np.ndarray, chunk: int = delta_rule.CHUNK):
    """Gated DeltaNet (block.LinearAttention) over the whole prefix: the chunked delta rule, as
    transformers' prefill runs it."""
    s, T = block.linear, x.shape[0]
    qkv = causal_conv(linear(x, layer.lin_qkv), layer.lin_conv)
    q = qkv[:, :s.key_dim].reshape(T, s.k_heads, s.k_head_dim)
    k = qkv[:, s.key_dim:2 * s.key_dim].reshape(T, s.k_heads, s.k_head_dim)
    v = qkv[:, 2 * s.key_dim:].reshape(T, s.v_heads, s.v_head_dim)
    group = s.v_heads // s.k_heads  # value head h reads key head h // group
    q, k = np.repeat(q, group, axis=1), np.repeat(k, group, axis=1)
    beta = sigmoid(linear(x, layer.lin_b))
    g = -np.exp(layer.lin_a_log) * softplus(linear(x, layer.lin_a) + layer.lin_dt_bias)
    o, _ = delta_rule.chunked(q, k, v, g.astype(np.float32), beta.astype(np.float32), chunk=chunk)
    z = linear(x, layer.lin_z).reshape(T, s.v_heads, s.v_head_dim)
    o = gated_norm(o, z, layer.lin_norm, cfg.rms_norm_eps)
    return linear(o.reshape(T, s.value_dim), layer.lin_out)


def gated_norm(o: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm(o) * w, then the gate silu(z) (the gate after the norm)."""
    return rmsnorm(o, weight, eps) * silu(z)


def glu(x, gate: Tensor, up: Tensor, down: Tensor, activation: str) -> np.ndarray:
    return linear(ACT[activation](linear(x, gate)) * linear(x, up), down)


def route(cfg: ModelConfig, logits: np.ndarray, router: str = "softmax"):
    """(chosen experts, their weights) per token: block.Ffn.router's rule."""
    if router == "topk_softmax":
        return route_topk_softmax(cfg, logits)
    return route_softmax(cfg, logits)


def route_topk_softmax(cfg: ModelConfig, logits: np.ndarray):
    """the top-k logits, softmax over those k only."""
    top = np.argsort(-logits, axis=-1, kind="stable")[:, : cfg.experts_per_tok]
    return top, softmax(np.take_along_axis(logits, top, axis=-1))


def route_softmax(cfg: ModelConfig, logits: np.ndarray):
    """softmax over all experts (f32), top-k, divided by their sum only if norm_topk_prob."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, : cfg.experts_per_tok]
    w = np.take_along_axis(p, top, axis=-1)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
    return top, w


def clamped_swiglu(gate: np.ndarray, up: np.ndarray, limit: float, alpha: float) -> np.ndarray:
    """gpt-oss's: (clip(up, ±limit) + 1) · g · sigmoid(alpha · g), g = min(gate, limit)."""
    g = np.minimum(gate, np.float32(limit))
    u = np.clip(up, np.float32(-limit), np.float32(limit))
    return (u + 1) * (g * sigmoid(g * np.float32(alpha)))


def expert(ffn: Ffn, layer, e: int, x: np.ndarray) -> np.ndarray:
    """Expert e of a MoE layer on rows x (with its biases and clamped SwiGLU where the block says)."""
    def bias(role):
        return getattr(layer, role)[e] if ffn.expert_bias else None

    gate = linear(x, layer.gate_exps[e], bias("gate_exps_bias"))
    up = linear(x, layer.up_exps[e], bias("up_exps_bias"))
    h = clamped_swiglu(gate, up, ffn.swiglu_limit, ffn.swiglu_alpha) if ffn.swiglu_limit else ACT[ffn.activation](gate) * up
    return linear(h, layer.down_exps[e], bias("down_exps_bias"))


def moe(cfg: ModelConfig, layer, x: np.ndarray, ffn: Ffn) -> np.ndarray:
    top, w = route(cfg, linear(x, layer.router, layer.router_bias if ffn.router_bias else None), ffn.router)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, we in zip(top[t], w[t]):
            out[t] += we * expert(ffn, layer, e, x[t : t + 1])[0]
    return out


def moe_beside(cfg: ModelConfig, block: Block, layer, x: np.ndarray) -> np.ndarray:
    """Gemma 4's FFN of the residual stream x: norm(dense GLU(norm(x))) + norm(experts(norm(x))),
    routed by softmax(proj(rmsnorm(x) * scale / sqrt(hidden))) over all experts, the top-k
    renormalised, then times their per-expert scales."""
    eps, act = cfg.rms_norm_eps, block.ffn.activation
    dense = rmsnorm(glu(rmsnorm(x, layer.ffn_norm, eps), layer.gate, layer.up, layer.down, act),
                    layer.post_ffn_norm_1, eps)
    n = rmsnorm(x, np.float32(1), eps) * layer.router_scale * np.float32(cfg.hidden_size ** -0.5)
    logits = linear(n, layer.router)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, : cfg.experts_per_tok]
    w = np.take_along_axis(p, top, axis=-1)
    w = w / w.sum(-1, keepdims=True) * layer.per_expert_scale[top]
    xe = rmsnorm(x, layer.ffn_norm_2, eps)
    experts = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, we in zip(top[t], w[t]):
            experts[t] += we * glu(xe[t:t + 1], layer.gate_exps[e], layer.up_exps[e], layer.down_exps[e], act)[0]
    return dense + rmsnorm(experts, layer.post_ffn_norm_2, eps)


def per_layer_inputs(cfg: ModelConfig, weights: ModelWeights, tokens, x: np.ndarray) -> np.ndarray:
    """Gemma 4's per-layer inputs [T, layers, width]: the token's rows of the packed table (times
    sqrt(width)) and the normed projection of the scaled embedding x (times 1/sqrt(hidden)), their
    sum times 1/sqrt(2)."""
    T, P = x.shape[0], cfg.per_layer_input_size
    own = rows(weights.per_layer_embed, tokens).reshape(T, cfg.num_layers, P) * np.float32(P ** 0.5)
    projected = linear(x, weights.per_layer_proj) * np.float32(cfg.hidden_size ** -0.5)
    projected = rmsnorm(projected.reshape(T, cfg.num_layers, P), weights.per_layer_proj_norm, cfg.rms_norm_eps)
    return (projected + own) * np.float32(2 ** -0.5)


def per_layer_input(cfg: ModelConfig, block: Block, layer, x: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """What a layer adds from its input row: norm(proj(act(gate(x)) * input))."""
    h = ACT[block.ffn.activation](linear(x, layer.pl_gate)) * inputs
    return rmsnorm(linear(h, layer.pl_proj), layer.pl_norm, cfg.rms_norm_eps)


def ffn(cfg: ModelConfig, block: Block, layer, x: np.ndarray) -> np.ndarray:
    if block.ffn.moe:
        out = moe(cfg, layer, x, block.ffn)
        if block.ffn.shared_expert:
            shared = glu(x, layer.shared_gate, layer.shared_up, layer.shared_down, block.ffn.activation)
            out = out + sigmoid(linear(x, layer.shared_expert_gate)) * shared
        return out
    return glu(x, layer.gate, layer.up, layer.down, block.ffn.activation)


@np.errstate(all="ignore")  # NaN/inf weights or float32 overflow: no warnings, the caller checks (finite.py)
def trunk(cfg: ModelConfig, weights: ModelWeights, tokens, hidden: bool = False):
    """The final-normed hidden states [T, H] (what the output head reads); with hidden=True also the
    residual stream after the embedding and after each layer, [L+1, T, H]."""
    tokens = list(tokens)
    eps = cfg.rms_norm_eps
    x = rows(weights.embed, tokens)
    if cfg.embed_scale != 1.0:
        x = x * np.float32(cfg.embed_scale)
    states, kv = [x], {}
    inputs = per_layer_inputs(cfg, weights, tokens, x) if cfg.per_layer_input_size else None
    for i, (block, layer) in enumerate(zip(cfg.blocks, weights.layers)):
        if block.linear is None:
            h = attention(cfg, block, layer, rmsnorm(x, layer.attn_norm, eps), kv, i)
        else:
            h = linear_attention(cfg, block, layer, rmsnorm(x, layer.attn_norm, eps))
        x = x + (rmsnorm(h, layer.post_attn_norm, eps) if block.sandwich else h)
        if block.ffn.moe_beside:
            h = moe_beside(cfg.at(block), block, layer, x)
        else:
            h = ffn(cfg.at(block), block, layer, rmsnorm(x, layer.ffn_norm, eps))
        x = x + (rmsnorm(h, layer.post_ffn_norm, eps) if block.sandwich else h)
        if block.per_layer_input:
            x = x + per_layer_input(cfg, block, layer, x, inputs[:, i])
        if block.layer_scalar:
            x = x * layer.layer_scalar
        states.append(x)
    out = rmsnorm(x, weights.final_norm, cfg.rms_norm_eps)
    return (out, np.stack(states).astype(np.float32)) if hidden else out


@np.errstate(all="ignore")
def head(cfg: ModelConfig, weights: ModelWeights, x: np.ndarray, output: np.ndarray | None = None) -> np.ndarray:
    """Logits [T, vocab] float32 of final-normed states (softcapped when the model says so);
    `output` is the dequantised output matrix when the caller keeps it across calls (a long text's
    rows go through in slices)."""
    w = dequantize(weights.output) if output is None else output
    logits = (x @ w.T).astype(np.float32)
    if cfg.final_softcap:
        cap = np.float32(cfg.final_softcap)
        logits = (np.tanh(logits / cap) * cap).astype(np.float32)
    return logits


def forward(cfg: ModelConfig, weights: ModelWeights, tokens, hidden: bool = False):
    """Logits [T, vocab] for every position; with hidden=True also the residual stream after the
    embedding and after each layer, [L+1, T, H] (the engine's hidden_out)."""
    out = trunk(cfg, weights, tokens, hidden)
    x, states = out if hidden else (out, None)
    logits = head(cfg, weights, x)
    return (logits, states) if hidden else logits


def check_reference_logits(cfg, weights, logits: np.ndarray, tokens, first_pos: int = 0) -> None:
    """require_finite for logits the reference computed for the last len(logits) of `tokens`."""
    if first_bad_row(logits) is None:
        return
    require_finite(logits, "reference", lambda: forward(cfg, weights, tokens, hidden=True)[1], weights,
                   cfg.num_layers, first_pos)
