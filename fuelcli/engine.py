"""Engine: the KV cache and prefill / decode on the numba backend.

It flattens ModelWeights into the slot tables kernels/cpu.py reads (once, at load), keeps the
preallocated K/V cache, and returns logits. The layer plan (windows, MoE layers) comes from the
same ModelConfig the reference reads.
"""

import numpy as np

from . import threads  # noqa: F401  (configures numba's threading before numba is imported)
from .config import ModelConfig
from .errors import InputError
from .rope import cos_sin
from .weights.formats import FORMATS
from .weights.model import ModelWeights


def kernels_cached() -> bool:
    """Whether the forward kernel is in numba's on-disk cache for this source (False: the first
    call compiles, about a minute). Reads numba's cache index; says True when it cannot tell."""
    from .kernels import cpu

    try:
        return bool(cpu.forward._cache._cache_file._load_index())
    except Exception:  # private numba API: never let it break a run
        return True


class Engine:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, n_ctx: int | None = None):
        from .kernels import cpu

        self.cfg, self.weights, self._cpu = cfg, weights, cpu
        self.n_ctx = min(n_ctx or cfg.max_position, cfg.max_position)
        mats, vecs, vec_tab = [], [], []
        self._keep = []  # the arrays whose addresses the kernel reads must outlive it

        def mat(t):
            if t is None:
                return -1
            data = t.data
            if not data.flags.c_contiguous:
                raise ValueError(f"{t.name}: weight rows must be C-contiguous")
            self._keep.append(data)
            mats.append((data.ctypes.data, data.shape[0], data.shape[1], FORMATS[t.fmt].code))
            return len(mats) - 1

        def vec(a):
            if a is None:
                return -1
            vec_tab.append((sum(len(v) for v in vecs), len(a)))
            vecs.append(np.asarray(a, np.float32))
            return len(vec_tab) - 1

        L = cfg.num_layers
        self.mat_idx = np.full((L, cpu.N_MATS), -1, np.int64)
        self.vec_idx = np.full((L, cpu.N_VECS), -1, np.int64)
        self.exp_idx = np.full((L, max(cfg.num_experts, 1), 3), -1, np.int64)
        self.embed_i = mat(weights.embed)
        self.out_i = self.embed_i if weights.output is weights.embed else mat(weights.output)
        self.final_norm_i = vec(weights.final_norm)
        for l, w in enumerate(weights.layers):
            for slot, t in ((cpu.M_Q, w.q), (cpu.M_K, w.k), (cpu.M_V, w.v), (cpu.M_O, w.o), (cpu.M_GATE, w.gate),
                            (cpu.M_UP, w.up), (cpu.M_DOWN, w.down), (cpu.M_ROUTER, w.router)):
                self.mat_idx[l, slot] = mat(t)
            for e, (g, u, d) in enumerate(zip(w.gate_exps, w.up_exps, w.down_exps)):
                self.exp_idx[l, e] = (mat(g), mat(u), mat(d))
            for slot, a in ((cpu.V_ATTN_NORM, w.attn_norm), (cpu.V_FFN_NORM, w.ffn_norm), (cpu.V_QB, w.q_bias),
                            (cpu.V_KB, w.k_bias), (cpu.V_VB, w.v_bias), (cpu.V_OB, w.o_bias),
                            (cpu.V_QN, w.q_norm), (cpu.V_KN, w.k_norm)):
                self.vec_idx[l, slot] = vec(a)
        self.mats = np.array(mats, np.int64).reshape(-1, 4)
        self.vecs = np.concatenate(vecs).astype(np.float32)
        self.vec_tab = np.array(vec_tab, np.int64).reshape(-1, 2)
        dims = np.zeros(cpu.N_DIMS, np.int64)
        dims[cpu.D_H], dims[cpu.D_NH], dims[cpu.D_NKV] = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads
        dims[cpu.D_HD], dims[cpu.D_I], dims[cpu.D_MOE_I] = cfg.head_dim, cfg.intermediate_size, cfg.moe_intermediate_size
        dims[cpu.D_NEXP], dims[cpu.D_TOPK], dims[cpu.D_NORM_TOPK] = cfg.num_experts, cfg.experts_per_tok, cfg.norm_topk_prob
        dims[cpu.D_VOCAB] = cfg.vocab_size
        self.dims = dims
        self.windows = np.array(cfg.windows, np.int64)
        self.cos, self.sin = cos_sin(cfg.rope, cfg.head_dim, self.n_ctx)
        shape = (L, self.n_ctx, cfg.num_kv_heads, cfg.head_dim)
        self.k_cache = np.zeros(shape, np.float32)
        self.v_cache = np.zeros(shape, np.float32)
        self.pos = 0

    @property
    def kv_bytes(self) -> int:
        return self.k_cache.nbytes + self.v_cache.nbytes

    def reset(self):
        self.pos = 0

    def _run(self, tokens, all_logits: bool, hidden: bool):
        tokens = np.asarray(tokens, np.int64)
        T = len(tokens)
        if T == 0:
            raise InputError("no tokens to run")
        if self.pos + T > self.n_ctx:
            raise InputError(f"{self.pos + T} tokens exceed the context of {self.n_ctx}")
        if tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size:
            raise InputError(f"token id out of range 0..{self.cfg.vocab_size - 1}")
        logits = np.empty((T if all_logits else 1, self.cfg.vocab_size), np.float32)
        H = self.cfg.hidden_size
        hidden_out = np.empty((self.cfg.num_layers + 1, T, H) if hidden else (0, T, H), np.float32)
        self._cpu.forward(tokens, self.pos, self.mats, self.mat_idx, self.exp_idx, self.vecs, self.vec_tab,
                          self.vec_idx, self.embed_i, self.out_i, self.final_norm_i, self.dims,
                          np.float32(self.cfg.rms_norm_eps), self.windows, self.cos, self.sin,
                          self.k_cache, self.v_cache, all_logits, logits, hidden_out)
        self.pos += T
        return (logits, hidden_out) if hidden else logits

    def prefill(self, tokens, all_logits: bool = False, hidden: bool = False):
        """Run the tokens as one batch after what the cache holds; logits of the last (or every) one."""
        return self._run(tokens, all_logits, hidden)

    def decode(self, token: int, hidden: bool = False):
        """One token through the KV cache; logits [vocab]."""
        out = self._run([token], False, hidden)
        return (out[0][0], out[1]) if hidden else out[0]
