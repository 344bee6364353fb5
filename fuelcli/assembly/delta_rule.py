"""The gated delta rule of linear-attention layers (Qwen3.5's gated DeltaNet), plainly in numpy f32.

Per value head a [d_k, d_v] state S, zero at the start of a sequence; for each token t:

    S <- S * exp(g_t);  u = S^T k_t;  S <- S + k_t (beta_t (v_t - u))^T;  o_t = S^T q_t

with q and k L2-normalised and q scaled by 1/sqrt(d_k). `recurrent` runs it token by token (decode);
`chunked` runs the same maths 64 tokens at a time as transformers' torch_chunk_gated_delta_rule does
(prefill): within a chunk the updates are solved at once as a unit lower-triangular system. The two
differ by rounding only (transformers' own two forms: 1.1e-4 apart on a tiny dense hybrid, f32).
"""

from __future__ import annotations

import numpy as np

CHUNK = 64


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis (the FLA library's form, which transformers follows)."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(eps))


def _prepare(q, k):
    """Heads first, f32; q and k normalised, q scaled."""
    q = l2norm(q.astype(np.float32)) * np.float32(q.shape[-1] ** -0.5)
    k = l2norm(k.astype(np.float32))
    return q, k


def recurrent(q, k, v, g, beta, state=None):
    """q, k [T, heads, d_k]; v [T, heads, d_v]; g, beta [T, heads] (k heads already repeated to the
    value heads). Returns (o [T, heads, d_v], the final state [heads, d_k, d_v])."""
    q, k = _prepare(q, k)
    T, heads, dk = k.shape
    S = np.zeros((heads, dk, v.shape[-1]), np.float32) if state is None else state.astype(np.float32).copy()
    out = np.empty(v.shape, np.float32)
    for t in range(T):
        S *= np.exp(g[t]).astype(np.float32)[:, None, None]
        u = np.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - u) * beta[t][:, None]
        S += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    return out, S


def chunked(q, k, v, g, beta, state=None, chunk: int = CHUNK):
    """The same as `recurrent`, `chunk` tokens at a time (the sequence padded to whole chunks)."""
    q, k = _prepare(q, k)
    T, heads, dk = k.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    v, g, beta = v.astype(np.float32), g.astype(np.float32), beta.astype(np.float32)
    if pad:
        q, k, v = (np.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)]) for x in (q, k, v))
        g, beta = (np.concatenate([x, np.zeros((pad, heads), np.float32)]) for x in (g, beta))
    n = (T + pad) // chunk
    # [heads, chunks, chunk, ...]
    q, k, v = (x.reshape(n, chunk, heads, -1).transpose(2, 0, 1, 3) for x in (q, k, v))
    g, beta = (x.reshape(n, chunk, heads).transpose(2, 0, 1) for x in (g, beta))
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = np.cumsum(g, axis=-1)
    lower = np.tril(np.ones((chunk, chunk), bool))
    decay = np.exp(np.where(lower, cum[..., :, None] - cum[..., None, :], -np.inf)).astype(np.float32)
    strictly = np.tril(np.ones((chunk, chunk), bool), -1)
    system = np.where(strictly, (k_beta @ k.transpose(0, 1, 3, 2)) * decay, 0).astype(np.float32)
    attn = ((q @ k.transpose(0, 1, 3, 2)) * decay).astype(np.float32)
    # (I + strictly lower part) X = rhs, by forward substitution row by row
    eye = np.eye(chunk, dtype=np.float32)
    inverse = np.broadcast_to(eye, system.shape).copy()
    for i in range(1, chunk):
        inverse[..., i, :] -= np.einsum("...j,...jc->...c", system[..., i, :i], inverse[..., :i, :])
    new_values = inverse @ v_beta
    k_cumdecay = inverse @ (k_beta * np.exp(cum)[..., None])
    q_decayed = q * np.exp(cum)[..., None]
    k_decayed = k * np.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = np.exp(cum[..., -1])
    S = np.zeros((heads, dk, dv), np.float32) if state is None else state.astype(np.float32).copy()
    out = np.empty((heads, n, chunk, dv), np.float32)
    for c in range(n):
        v_new = new_values[:, c] - k_cumdecay[:, c] @ S
        out[:, c] = q_decayed[:, c] @ S + attn[:, c] @ v_new
        S = S * chunk_decay[:, c][:, None, None] + k_decayed[:, c].transpose(0, 2, 1) @ v_new
    return out.transpose(1, 2, 0, 3).reshape(n * chunk, heads, dv)[:T], S
