"""The CUDA engine: the shared decoder (ModelConfig, ModelWeights, the layer plan: `layer_plan`, the one
place that reads the blocks' windows and FFN kinds; make_engine refuses the block features it lacks)
run by numba.cuda kernels on weights kept packed on the device.

A decode step takes the token id as a kernel argument: the embedding row (normed for layer 0 in the
same launch), then 5 launches per dense layer: the q|k|v matvec (one per format when q, k and v
differ); attention with QK-norm, RoPE and the cache store fused; o_proj added to the residual, its
last block writing the FFN's normed input; gate|up with SiLU fused; down added to the residual, its
last block writing the next layer's normed input (the final norm after the last layer). A MoE layer
runs the router matvec, the chosen experts' gate|up (routing fused), their down and an RMSNorm
instead of the last two (6 launches). The products are one kernel per weight format (matvec.py). Only
the logits (`decode`) or one id (`decode_argmax`) come back.
Prefill runs the tiled matmul on chunks of up to n_batch tokens; activations and the KV cache are
allocated once per engine.
"""

from __future__ import annotations

import numpy as np

from types import SimpleNamespace

from ...errors import InputError
from ...model.config import ModelConfig
from ...model.rope import cos_sin
from ...model.sizes import engine_bytes, human
from ...weights.build import ModelWeights
from ..base import Engine
from ..kv_cache import KVCache
from .activations import allocate
from .device_weights import DeviceWeights
from .launcher import Prepared
from .runtime import GPU, SIMULATOR, Launch, require, simulator

N_BATCH = 512  # tokens per prefill chunk


def _blocks(n: int, per: int) -> int:
    return max(1, -(-n // per))


class CudaEngine(Engine):
    device = "cuda"
    backend = "cuda numba"

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, n_ctx: int | None = None,
                 n_batch: int = N_BATCH, launch: Launch | None = None):
        cuda = require()
        from .kernels import attention, dequant, matmul, matvec, moe, rows  # import numba.cuda: after require()

        self.cuda, self._weight_bytes, self._rows = cuda, sum(t.nbytes for t in weights.tensors()), n_batch
        super().__init__(cfg, n_ctx)  # checks the device's memory (check_fits) before anything is allocated
        if cfg.head_dim > attention.MAX_HEAD_DIM:
            raise InputError(f"head_dim {cfg.head_dim} exceeds the cuda backend's {attention.MAX_HEAD_DIM}")
        self.k = SimpleNamespace(att=attention, mm=matmul, mv=matvec, moe=moe, rows=rows, take_rows=dequant.take_rows)
        if cfg.num_experts > moe.MAX_EXPERTS or cfg.experts_per_tok > moe.MAX_TOPK:
            raise InputError(f"{cfg.num_experts} experts, top {cfg.experts_per_tok}: the cuda backend routes at most "
                             f"{moe.MAX_EXPERTS}, top {moe.MAX_TOPK}")
        self.launch = launch or (SIMULATOR if simulator() else GPU)
        self.w = DeviceWeights(cuda, cfg, weights)
        cos, sin = cos_sin(cfg.rope, cfg.head_dim, self.n_ctx)
        self.cos, self.sin = cuda.to_device(cos), cuda.to_device(sin)
        self.kv = KVCache(cfg.num_layers, self.n_ctx, cfg.num_kv_heads, cfg.head_dim,
                          alloc=lambda shape, dtype: cuda.device_array(shape, dtype))
        self.n_batch = max(1, min(n_batch, self.n_ctx))
        self.act = allocate(cuda, cfg, self.n_batch)
        self.eps = np.float32(cfg.rms_norm_eps)
        self.layer_plan = [(b.attention.window, b.ffn.moe) for b in cfg.blocks]
        self._decode_plan()

    def device_free(self) -> int | None:
        """Bytes free on the GPU now; None where the device does not say (the simulator)."""
        try:
            return int(self.cuda.current_context().get_memory_info()[0])
        except Exception:  # the simulator's context has no memory info
            return None

    def check_fits(self):
        """The weights, the KV cache of n_ctx positions, the activations and the RoPE tables live on the
        GPU: a one-line error before anything is uploaded when they exceed what it has free. The
        simulator's device memory is the host's: the host check."""
        free = self.device_free()
        if free is None:
            return super().check_fits()
        kv, rest = engine_bytes(self.cfg, self.n_ctx, rows=self._rows)
        if self._weight_bytes + kv + rest > free:
            cfg = self.cfg
            raise InputError(
                f"not enough GPU memory for a context of {self.n_ctx} tokens: the weights need "
                f"{human(self._weight_bytes)}, the KV cache {human(kv)} ({cfg.num_layers} layers × {cfg.num_kv_heads} "
                f"KV heads × head_dim {cfg.head_dim} × K and V in float32 per token) and the activations and RoPE "
                f"tables {human(rest)}, but {human(free)} is free on the GPU; ask for fewer tokens (-c, -n, -d)")

    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes

    # ------------------------------------------------------------------ public

    def prefill(self, tokens, all_logits: bool = False, hidden: bool = False):
        tokens = self.check(tokens)
        T, cfg = len(tokens), self.cfg
        logits = np.empty((T, cfg.vocab_size), np.float32) if all_logits else None
        states = np.empty((cfg.num_layers + 1, T, cfg.hidden_size), np.float32) if hidden else None
        for s in range(0, T, self.n_batch):
            e = min(T, s + self.n_batch)
            chunk = tokens[s:e]
            hid = self.cuda.device_array((cfg.num_layers + 1, e - s, cfg.hidden_size), np.float32) if hidden else None
            if len(chunk) == 1:
                self._decode_layers(int(chunk[0]), hid)
            else:
                self._prefill_layers(chunk, hid)
                self._norm_last(e - s)
            if all_logits:
                logits[s:e] = self._all_logits(e - s)
            if hidden:
                states[:, s:e] = hid.copy_to_host()
            self.pos += e - s
        if not all_logits:
            logits = self._last_logits().copy_to_host()
        return (logits, states) if hidden else logits

    def decode(self, token: int, hidden: bool = False):
        self.check([token])
        hid = self.cuda.device_array((self.cfg.num_layers + 1, 1, self.cfg.hidden_size), np.float32) if hidden else None
        self._decode_layers(int(token), hid)
        self.pos += 1
        logits = self._last_logits().copy_to_host()[0]
        return (logits, hid.copy_to_host()) if hidden else logits

    def decode_argmax(self, token: int) -> int:
        self.check([token])
        self._decode_layers(int(token), None)
        self.pos += 1
        A = self.act
        self.k.rows.argmax[1, self.launch.row](self._last_logits(), 0, A.argmax)
        return int(A.argmax.copy_to_host()[0])

    # ------------------------------------------------------------------ forward

    def _embed(self, T: int, token: int, norm: int = -1):
        """Embedding rows into act.x (token >= 0: one row, that id); norm >= 0: act.xn[0] normed too."""
        w, A = self.w, self.act
        base, _, row_bytes, code = self.w.mats_host[w.embed]
        self.k.take_rows[T, self.launch.row](w.w8, base, row_bytes, code, A.tokens, token, A.x, w.vecs, norm,
                                             self.eps, A.xn)

    def _keep(self, hid, l: int, T: int):
        if hid is not None:
            hid[l].copy_to_device(self.act.x[:T])

    def _decode_plan(self):
        """Every launch of a decode step, planned once (launcher.Prepared: after the first step each is
        issued with its arguments marshalled then): per layer the q|k|v products (one launch when
        they share a format), the attention, o_proj and the FFN's; the logits product and the
        embedding. (Configured at each launch on the simulator: its kernel[grid, block] sets the grid
        on the one kernel object.)"""
        mv, cfg, w, A, Lc = self.k.mv, self.cfg, self.w, self.act, self.launch
        block, code = (Lc.lanes, Lc.rows), lambda m: int(w.mats_host[m, 3])
        eps, none = self.eps, -1

        def product(m, nm, x, out, bias=-1, accumulate=0, norm=-1):
            rows = sum(w.rows(m + i) for i in range(nm))
            return Prepared(mv.matvec_kernel(code(m)), _blocks(rows, Lc.rows), block,
                            (w.w8, w.mats, m, nm, x, w.vecs, bias, out, accumulate, norm, eps, A.xn[0], A.done))

        x, xn = A.x[0], A.xn[0]
        self.plan = []
        for l, lw in enumerate(w.layers):
            norm_next = w.layers[l + 1].attn_norm if l + 1 < len(w.layers) else w.final_norm
            qkv, col, m = [], 0, lw.q
            while m < lw.q + 3:  # runs of q, k, v in one format
                nm = 1
                while m + nm < lw.q + 3 and code(m + nm) == code(m):
                    nm += 1
                bias = none if lw.q_bias < 0 else lw.q_bias + col  # q|k|v biases lie consecutively
                qkv.append(product(m, nm, xn, A.qkv[0][col:], bias))
                col += sum(w.rows(m + i) for i in range(nm))
                m += nm
            o = product(lw.o, 1, A.att[0], x, lw.o_bias, 1, lw.ffn_norm)
            if self.layer_plan[l][1]:
                ffn = (product(lw.router, 1, xn, A.router[0]), norm_next)
            else:
                swiglu = mv.swiglu_kernel(code(lw.gate), code(lw.up))
                ffn = (Prepared(swiglu, _blocks(cfg.intermediate_size, Lc.rows), block,
                                (w.w8, w.mats, lw.gate, lw.up, xn, A.gate[0])),
                       product(lw.down, 1, A.gate[0], x, none, 1, norm_next))
            # the position (argument 1) is set at each step
            attend = Prepared(self.k.att.attend_one, cfg.num_heads, Lc.attn,
                              (A.qkv, 0, self.layer_plan[l][0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, w.vecs,
                               lw.q_norm, lw.k_norm, eps, self.cos, self.sin, self.kv.k, self.kv.v, l, A.att))
            self.plan.append((qkv, attend, o, ffn))
        self.logits_product = product(w.output, 1, xn, A.logits[0])
        # the token id (argument 5) is set at each step; its row is normed for the first layer's input
        base, _, row_bytes, code_e = self.w.mats_host[w.embed]
        first_norm = w.layers[0].attn_norm if w.layers else w.final_norm
        self.embed_one = Prepared(self.k.take_rows, 1, Lc.row, (w.w8, base, row_bytes, code_e, A.tokens, 0, A.x,
                                                                w.vecs, first_norm, eps, A.xn))

    def _decode_layers(self, token: int, hid):
        """One token at self.pos through every layer (matvec kernels); leaves it in act.x[0] and its
        final-normed copy in act.xn[0]."""
        w, A, Lc, eps, pos = self.w, self.act, self.launch, self.eps, self.pos
        self.embed_one.set(5, token)()
        self._keep(hid, 0, 1)
        for l, (lw, (qkv, attend, o, ffn)) in enumerate(zip(w.layers, self.plan)):
            for product in qkv:
                product()
            attend.set(1, pos)()
            o()
            if self.layer_plan[l][1]:
                router, norm_next = ffn
                router()
                self._moe(l, lw, 1)
                self.k.rows.rmsnorm[1, Lc.row](A.x, w.vecs, norm_next, eps, A.xn)
            else:
                for product in ffn:
                    product()
            self._keep(hid, l + 1, 1)

    def _prefill_layers(self, tokens: np.ndarray, hid):
        """T > 1 tokens at self.pos.. through every layer (tiled matmul kernels)."""
        attention, mm, rk = self.k.att, self.k.mm, self.k.rows
        cfg, w, A, Lc, kv, eps, pos = self.cfg, self.w, self.act, self.launch, self.kv, self.eps, self.pos
        nh, nkv, hd, T = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, len(tokens)
        A.tokens[:T].copy_to_device(tokens.astype(np.int32))
        self._embed(T, -1)
        self._keep(hid, 0, T)
        tile = Lc.tile * mm.MT

        def matmul(m, x, out, col0=0, bias=-1, accumulate=0):
            N = w.rows(m)
            mm.matmul[(_blocks(N, tile), _blocks(T, tile)), (Lc.tile, Lc.tile)](w.w8, w.mats, m, x, T, w.vecs, bias,
                                                                                 out, col0, accumulate)

        for l, lw in enumerate(w.layers):
            rk.rmsnorm[T, Lc.row](A.x, w.vecs, lw.attn_norm, eps, A.h)
            qb = lw.q_bias  # q|k|v biases lie consecutively
            matmul(lw.q, A.h, A.qkv, 0, qb)
            matmul(lw.k, A.h, A.qkv, cfg.q_dim, -1 if qb < 0 else qb + cfg.q_dim)
            matmul(lw.v, A.h, A.qkv, cfg.q_dim + cfg.kv_dim, -1 if qb < 0 else qb + cfg.q_dim + cfg.kv_dim)
            attention.rope_store[(T, nh + nkv), Lc.head](A.qkv, pos, nh, nkv, hd, w.vecs, lw.q_norm, lw.k_norm, eps,
                                                         self.cos, self.sin, kv.k, kv.v, l)
            attention.attend[(T, nh), Lc.attn](A.qkv, pos, self.layer_plan[l][0], nh, nkv, hd, kv.k, kv.v, l, A.att)
            matmul(lw.o, A.att, A.x, 0, lw.o_bias, 1)
            rk.rmsnorm[T, Lc.row](A.x, w.vecs, lw.ffn_norm, eps, A.h)
            if self.layer_plan[l][1]:
                self._moe(l, lw, T)
            else:
                matmul(lw.gate, A.h, A.gate)
                matmul(lw.up, A.h, A.up)
                n = T * cfg.intermediate_size
                rk.silu_mul[_blocks(n, Lc.row), Lc.row](A.gate, A.up, T)
                matmul(lw.down, A.gate, A.x, 0, -1, 1)
            self._keep(hid, l + 1, T)

    def _moe(self, l: int, lw, T: int):
        """Sparse FFN of layer l added to act.x: the chosen experts of the router logits in act.router.
        Decode: the input is act.xn (normed by o_proj's epilogue), the router product ran already;
        prefill: act.h, normed, and the router product here."""
        mm, moe = self.k.mm, self.k.moe
        cfg, w, A, Lc, eps = self.cfg, self.w, self.act, self.launch, self.eps
        k, E, block = cfg.experts_per_tok, cfg.num_experts, (Lc.lanes, Lc.rows)
        x = A.xn if T == 1 else A.h
        if T > 1:
            tile = Lc.tile * mm.MT
            mm.matmul[(_blocks(E, tile), _blocks(T, tile)), (Lc.tile, Lc.tile)](w.w8, w.mats, lw.router, A.h, T,
                                                                                 w.vecs, -1, A.router, 0, 0)
        moe.moe_swiglu[(_blocks(cfg.moe_intermediate_size, Lc.rows), k, T), block](
            w.w8, w.mats, w.etab[l], A.router, k, cfg.norm_topk_prob, x, w.vecs, -1, eps, A.experts, A.expert_w, A.eg)
        moe.moe_down[(_blocks(cfg.hidden_size, Lc.rows), T), block](w.w8, w.mats, w.etab[l], A.experts, A.expert_w,
                                                                    A.eg, A.x)

    # ------------------------------------------------------------------ logits

    def _last_logits(self):
        """Logits of the token in act.xn[0] (final-normed: by the decode step's last product, or
        `_norm_last` after a prefill) into act.logits [1, vocab]."""
        self.logits_product()
        return self.act.logits

    def _norm_last(self, T: int):
        """act.xn[0] = the final RMSNorm of act.x[T - 1], after a prefill chunk."""
        A = self.act
        self.k.rows.rmsnorm[1, self.launch.row](A.x[T - 1 : T], self.w.vecs, self.w.final_norm, self.eps, A.xn)

    def _all_logits(self, T: int) -> np.ndarray:
        mm, w, A, Lc = self.k.mm, self.w, self.act, self.launch
        self.k.rows.rmsnorm[T, Lc.row](A.x, w.vecs, w.final_norm, self.eps, A.h)
        out = self.cuda.device_array((T, self.cfg.vocab_size), np.float32)
        tile = Lc.tile * mm.MT
        mm.matmul[(_blocks(self.cfg.vocab_size, tile), _blocks(T, tile)), (Lc.tile, Lc.tile)](
            w.w8, w.mats, w.output, A.h, T, w.vecs, -1, out, 0, 0)
        return out.copy_to_host()
