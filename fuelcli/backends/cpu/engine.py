"""The CPU engine: the weights as an address table for forward.py, activations and KV cache once.

It flattens ModelWeights into the slot tables the forward reads (once, at load): matrices stay in
their stored format where they are (mmap'd files), norms and biases become one f32 array. Prefill
runs in chunks of `n_batch` tokens, so activations are sized once whatever the prompt length.
"""

from __future__ import annotations

import numpy as np

from ...process import threads  # configures numba's threading before numba is imported
from ...process.free_cpus import FreeCpus
from ...families.schema import EXPERT_ROLES, MATRICES, VECTORS
from ...model.block import rope_variants
from ...model.config import ModelConfig
from ...model.rope import cos_sin_tables
from ...weights.build import ModelWeights
from ...errors import InputError
from ..base import VERIFY_ROWS, Engine
from ..kv_cache import CACHE_TYPES, KVCache
from ..recurrent_state import RecurrentState
from . import amx
from . import engine_layers
from .activations import allocate
from .attention import KEY_BLOCK
from .jit import compile_elsewhere, load_cached
from .kernels import is_quant
from .llvm import host_isa
from .matmul import ACT_CLAMPED_SWIGLU, ACTIVATION_CODES, N_KERNEL_COLS, add_wide, core_table
from .tables import KernelTables

N_BATCH = 512  # tokens per forward call of a long prefill


def _forward_cached() -> bool:
    """Whether numba's on-disk cache holds the forward (private numba API: True when it cannot tell)."""
    from . import forward

    try:
        return bool(forward.forward._cache._cache_file._load_index())
    except Exception:
        return True


def kernels_cached(weights: ModelWeights | None = None, activations: str = "int16") -> bool:
    """Whether the forward (numba's on-disk cache) and the kernels of the weights' formats, with
    those of the activations (q8_tables.py), are compiled already (False: the first engine compiles
    them). Says True when it cannot tell."""
    from . import q8_tables
    from .kernels import cached

    try:
        codes = {t.format.code for t in weights.tensors()} if weights is not None else ()
        isa = host_isa()
        use_amx = amx.available(isa) and any(is_quant(c) for c in codes) and activations == "int16"
        return (_forward_cached() and cached(codes, isa, use_amx)
                and (activations == "int16" or q8_tables.cached(codes, isa)))
    except Exception:  # never let it break a run
        return True


def _bits(value: float, none: float) -> int:
    """value as the bits of an f32 for the forward's tables; 0 when it is `none` (nothing to do)."""
    return 0 if value == none else int(np.float32(value).view(np.int32))


class CpuEngine(Engine):
    device = "cpu"
    backend = "cpu numba"

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, n_ctx: int | None = None,
                 n_batch: int = N_BATCH, cache_type: str = "f32", slots: int = 1, activations: str = "int16"):
        from . import forward as F

        super().__init__(cfg, n_ctx, np.dtype(CACHE_TYPES[cache_type]).itemsize, slots)
        self.weights, self._forward = weights, F.forward
        # the default thread count follows the CPUs other processes leave free (free_cpus.py); None:
        # a fixed count (-t, FUEL_THREADS, a benchmark's). The logits do not depend on it.
        self.free_cpus = None if threads.explicit() else FreeCpus(threads.pool_size())
        mats, vecs, vec_tab = [], [], []
        self._keep = []  # the arrays whose addresses the kernel reads must outlive it

        def mat(t):
            if t is None:
                return -1
            data = t.data
            if not data.flags.c_contiguous:
                raise ValueError(f"{t.name}: weight rows must be C-contiguous")
            self._keep.append(data)
            mats.append((data.ctypes.data, data.shape[0], data.shape[1], t.format.code))
            return len(mats) - 1

        def vec(a):
            if a is None:
                return -1
            vec_tab.append((sum(len(v) for v in vecs), len(a)))
            vecs.append(np.asarray(a, np.float32).reshape(-1))
            return len(vec_tab) - 1

        L = cfg.num_layers
        self.mat_idx = np.full((L, F.N_MATS), -1, np.int64)
        self.vec_idx = np.full((L, F.N_VECS), -1, np.int64)
        self.exp_idx = np.full((L, max(cfg.num_experts, 1), len(EXPERT_ROLES)), -1, np.int64)
        self.embed_i = mat(weights.embed)
        self.out_i = self.embed_i if weights.output is weights.embed else mat(weights.output)
        self.final_norm_i = vec(weights.final_norm)
        for l, w in enumerate(weights.layers):
            for slot, role in enumerate(MATRICES):
                self.mat_idx[l, slot] = mat(getattr(w, role))
            for e, mats_e in enumerate(zip(*(getattr(w, role) for role in EXPERT_ROLES))):
                self.exp_idx[l, e] = [mat(t) for t in mats_e]
            for slot, role in enumerate(VECTORS):
                value = getattr(w, role)
                if role == "router_scale" and value is not None:  # the router's input norm, times 1/sqrt(hidden)
                    value = np.asarray(value, np.float32) * np.float32(cfg.hidden_size ** -0.5)
                self.vec_idx[l, slot] = vec(value)
        engine_layers.follow_blocks(self.mat_idx, self.vec_idx, cfg, F)
        self._layered = layered = engine_layers.per_layer(cfg)
        widest = engine_layers.widest(cfg) if layered else cfg
        ones_i = vec(np.ones(widest.head_dim, np.float32)) if any(b.attention.v_norm for b in cfg.blocks) else -1
        # the per-layer inputs' table stays as stored: the forward reads the tokens' rows of it
        per_layer_in = ((mat(weights.per_layer_embed), mat(weights.per_layer_proj), vec(weights.per_layer_proj_norm))
                        if cfg.per_layer_input_size else ())
        self.mats = np.array(mats, np.int64).reshape(-1, 4)
        self.codes = sorted({int(c) for c in self.mats[:, 3]})
        isa = host_isa()
        # several sequences: no AMX, whose use follows how many rows a product has: a row's result
        # must not depend on the rows beside it (matmul.describe_product)
        # (nor with q8 activations: AMX's int8 tiles are not used yet, its bf16 ones would not be q8's)
        use_amx = (amx.available(isa) and any(is_quant(c) for c in self.codes) and slots == 1
                   and activations == "int16")
        if use_amx:  # bench tables and diff provenance say which kernels ran
            self.backend = "cpu numba amx"
        if cache_type != "f32":  # bench tables and diff provenance say which cache ran
            self.backend += f" kv {cache_type}"
        self.activations = activations
        if activations != "int16":  # the same for the activations (q8_tables.py)
            self.backend += f" act {activations}"
        self._tables = KernelTables(self.codes, isa, cfg.head_dim, use_amx, cache_type,
                                    background=not _forward_cached(), activations=activations)
        self._isa, self._wide = isa, False
        self._use_amx, self._cache_type = use_amx, cache_type  # the B-wide decode kernels: at the first step of several sequences
        self.vecs = np.concatenate(vecs).astype(np.float32)
        self.vec_tab = np.array(vec_tab, np.int64).reshape(-1, 2)
        dims = np.zeros(F.N_DIMS, np.int64)
        dims[F.D_NH], dims[F.D_NKV] = cfg.num_heads, cfg.num_kv_heads
        dims[F.D_HD], dims[F.D_TOPK], dims[F.D_NORM_TOPK] = cfg.head_dim, cfg.experts_per_tok, cfg.norm_topk_prob
        dims[F.D_QUANT] = any(is_quant(c) for c in self.codes)
        dims[F.D_EMBED_SCALE] = _bits(cfg.embed_scale, 1.0)
        dims[F.D_SOFTCAP] = _bits(cfg.final_softcap, 0.0)
        if cfg.per_layer_input_size:
            dims[F.D_PL_WIDTH:F.D_PL_NORM + 1] = (cfg.per_layer_input_size, *per_layer_in)
        lin = cfg.linear
        if lin is not None:
            dims[F.D_LKH], dims[F.D_LDK], dims[F.D_LDV], dims[F.D_LTAPS] = (lin.k_heads, lin.k_head_dim,
                                                                            lin.v_head_dim, lin.conv_kernel)
        self.dims = dims
        self.moe_idx = self.exp_idx if cfg.num_experts else None  # None: numba compiles no MoE code
        ropes = rope_variants(cfg)
        self.lay = np.zeros((L, F.N_LAY), np.int64)
        lo_order = np.zeros(0, np.int64)
        for l, b in enumerate(cfg.blocks):
            a = b.attention
            self.lay[l, F.L_WINDOW] = a.window
            self.lay[l, F.L_ROPE] = -1 if a.rope is None else ropes.index(a.rope)
            # q times scale * sqrt(head_dim): the attention kernel divides by sqrt(head_dim)
            self.lay[l, F.L_QSCALE] = 0 if a.scale is None else _bits(a.scale * np.sqrt(cfg.head_dim), 1.0)
            self.lay[l, F.L_ACT] = ACTIVATION_CODES[b.ffn.activation]
            if b.ffn.moe and b.ffn.swiglu_limit > 0:
                self.lay[l, F.L_ACT] = ACT_CLAMPED_SWIGLU
                self.lay[l, F.L_SWIGLU_LIMIT] = _bits(b.ffn.swiglu_limit, 0.0)
                self.lay[l, F.L_SWIGLU_ALPHA] = int(np.float32(b.ffn.swiglu_alpha).view(np.int32))
            self.lay[l, F.L_TOPK_SOFTMAX] = b.ffn.moe and b.ffn.router == "topk_softmax"
            self.lay[l, F.L_LINEAR] = b.linear is not None
            self.lay[l, F.L_ROTARY] = a.rotary_dim
            lin_out = weights.layers[l].lin_out
            if lin_out is not None and lin_out.columns is not None:  # one order: the config's
                self.lay[l, F.L_LOUT_ORDER] = 1
                lo_order = np.asarray(lin_out.columns, np.int64)
        attending = [l for l, b in enumerate(cfg.blocks) if b.linear is None]
        linear_layers = [l for l, b in enumerate(cfg.blocks) if b.linear is not None]
        for layers in (attending, linear_layers):
            for i, l in enumerate(layers):
                self.lay[l, F.L_CACHE] = i
        rotary = next((b.attention.rotary_dim for b in cfg.blocks if b.attention.rotary_dim), 0)
        k_values, v_values = engine_layers.fill(self.lay, cfg, self.n_ctx, slots, F, ones_i)
        self._own_kernels = []  # head_dims other than the model's: their kernels, at the first forward
        if layered:
            self.cos, self.sin = engine_layers.rope_tables(cfg, self.n_ctx, self.lay, F)
        else:
            self.cos, self.sin = cos_sin_tables(ropes, cfg.head_dim, self.n_ctx, rotary)
        self.state = RecurrentState(lin, len(linear_layers), slots)
        if layered:
            self.kv = engine_layers.LayerKV(k_values, v_values, cache_type)
        else:
            self.kv = KVCache(len(attending), self.n_ctx, cfg.num_kv_heads, cfg.head_dim, key_block=KEY_BLOCK,
                              cache_type=cache_type, slots=slots)
        self.n_batch = max(1, min(n_batch, self.n_ctx * slots))
        # decode-kernel rows: every slot's next token in a step, or one slot's verify (verify)
        experts = self.mats[self.exp_idx[self.exp_idx >= 0], 3]
        self.act = allocate(widest, self.n_batch, planes=use_amx, slots=max(slots, min(VERIFY_ROWS, self.n_batch)),
                            pool=threads.pool_size(), f32_experts=not all(is_quant(int(c)) for c in experts)
                            )._replace(lo_order=lo_order)

    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes

    @property
    def kern(self) -> np.ndarray:
        """The kernel table (matmul.kernel_table); the first use waits for its compile."""
        return self._tables.get()[0]

    @property
    def core(self) -> np.ndarray:
        return self._tables.get()[1]

    def _args(self, tokens: np.ndarray, segs: np.ndarray, all_logits: bool, logits: np.ndarray, states: np.ndarray,
              tables: tuple | None = None) -> tuple:
        """forward.forward's arguments for `tokens`, the rows of the segments `segs` (forward.py)."""
        kern, core = tables or (self.kern, self.core)
        if tables is None and self._layered and not self._own_kernels:
            from . import forward as F

            self._own_kernels = engine_layers.attention_kernels(
                self.lay, self.cfg, F, lambda hd: core_table(self._isa, hd, self._use_amx, self._cache_type)) or [None]
        return (tokens, segs, self.mats, self.mat_idx, self.moe_idx, self.vecs, self.vec_tab, self.vec_idx,
                self.embed_i, self.out_i, self.final_norm_i, self.dims,
                np.int64(np.float32(self.cfg.rms_norm_eps).view(np.int32)), self.lay, self.cos, self.sin,
                self.kv.k, self.kv.v, self.state.rec, self.state.conv, kern, core, self.act, all_logits, logits,
                states)

    def compiled(self) -> bool:
        return kernels_cached(self.weights, self.activations)

    def warm_up(self):
        """Loads the forward numba compiled for the argument types every prefill passes (or compiles
        it in a child process, jit.compile_elsewhere, while the kernels compile beside it: tables.py),
        without running it: a forward here would only also page in the weights, which the first
        prefill does as it goes (a start saves the ~0.1 s of a token). The tables' types are all the
        compile needs of them."""
        f = self._forward
        stand_in = (np.zeros((1, N_KERNEL_COLS), np.int64), np.zeros(1, np.int64))
        args = self._args(np.zeros(1, np.int64), self._segs([(0, 0, 1)]), False, self._logits(1),
                          np.empty((0, 1, 1), np.float32), stand_in)
        sig = tuple(f.typeof_pyval(a) for a in args)
        if not load_cached(f, sig) and not compile_elsewhere(f, sig):
            f.compile(sig)
        self._tables.get()

    def _run(self, *args):
        """One forward, on as many threads as the CPUs free now allow (free_cpus.py) unless fixed."""
        if self.free_cpus is not None:
            threads.use(self.free_cpus.threads())
        self._forward(*args)

    def _logits(self, rows: int) -> np.ndarray:
        """A fresh array for a forward's logits, handed to the caller as it is: no copy out of a buffer
        the next forward overwrites (a 4-row step of the Qwen demo copied 2.4 MB)."""
        return np.empty((rows, self.cfg.vocab_size), np.float32)

    @staticmethod
    def _segs(rows: list) -> np.ndarray:
        """forward.py's segment table: (slot, first position, tokens) per sequence of a step."""
        return np.array(rows, np.int64).reshape(-1, 3)

    def prefill(self, tokens, all_logits: bool = False, hidden: bool = False):
        tokens = self.check(tokens)
        T, cfg = len(tokens), self.cfg
        logits = self._logits(T if all_logits else 1)
        hidden_out = np.empty((cfg.num_layers + 1, T, cfg.hidden_size) if hidden else (0, 1, 1), np.float32)
        for s in range(0, T, self.n_batch):
            e = min(T, s + self.n_batch)
            states = np.empty((cfg.num_layers + 1, e - s, cfg.hidden_size), np.float32) if hidden else hidden_out
            segs = self._segs([(0, self.pos, e - s)])
            self._run(*self._args(tokens[s:e], segs, all_logits, logits[s:e] if all_logits else logits, states))
            if hidden:
                hidden_out[:, s:e] = states
            self.pos += e - s
        if T > 1:
            self.state.save(0, self.pos)
        return (logits, hidden_out) if hidden else logits

    def reset(self, slot: int | None = None):
        super().reset(slot)
        for s in range(self.slots) if slot is None else [slot]:
            self.state.clear(s)

    def rewind(self, pos: int, slot: int = 0) -> int:
        """base.Engine.rewind. A linear-attention state goes back to the state before the last verify
        and runs its accepted tokens again, as verify ran them (one-row segments: the same bits as
        decode steps), so speculative decoding keeps exactly what plain decoding would hold; further
        back, to its latest checkpoint."""
        held = self.positions[self._slot(slot)]
        pos = super().rewind(pos, slot)
        if self.state.layers and pos < held:
            replay = self.state.restore_verified(slot, pos)
            if replay is None:
                pos = self.positions[slot] = self.state.restore(slot, pos)
            elif len(replay):
                self._rows(np.asarray(replay, np.int64), slot, pos - len(replay),
                           np.empty((len(replay), self.cfg.vocab_size), np.float32))
        return pos

    def verify(self, tokens, slot: int = 0) -> np.ndarray:
        """base.Engine.verify in one forward: each token a one-row segment of the slot at its own
        position, so every row runs the decode kernels (a weight row read once for all of them) and
        the decode attention, the segments in order (each stores its K/V before the next attends)."""
        tokens = self.check(tokens, slot)
        T, held = len(tokens), self.positions[slot]
        if T > self.act.last.shape[0]:
            raise InputError(f"a verify step takes at most {self.act.last.shape[0]} tokens, got {T}")
        if T > 1:
            self.warm_up_rows()
        self.state.before_verify(slot, held, tokens)
        logits = np.empty((T, self.cfg.vocab_size), np.float32)
        self._rows(tokens, slot, held, logits)
        self.positions[slot] += T
        return logits

    def _rows(self, tokens, slot: int, held: int, logits: np.ndarray):
        """The tokens after `held` as one-row segments of the slot (verify's forward)."""
        self._run(*self._args(tokens, self._segs([(slot, held + i, 1) for i in range(len(tokens))]), False, logits,
                              np.empty((0, 1, 1), np.float32)))

    def warm_up_rows(self):
        """The B-wide decode kernels into the kernel table (compiled, or loaded from the cache, once)."""
        if not self._wide:
            add_wide(self.kern, self.codes, self._isa)
            if self.activations == "q8":
                from .q8_tables import apply_wide

                apply_wide(self.kern, self.codes, self._isa)
            self._wide = True

    def step(self, batch: list, hidden: bool = False) -> list:
        """One forward over the new tokens of several sequences (base.Engine.step): every product
        runs over all rows at once (each sequence's next token on the decode kernels, a weight row
        read once for all of them; prompt chunks on the tiles), each sequence's attention over its
        own slot. Up to n_batch rows a call; a longer batch is refused (the caller chunks prompts).
        hidden=True: also each entry's residual stream (the embeddings of several texts in one forward)."""
        slots = [slot for slot, _ in batch]
        if not batch or len(set(slots)) != len(slots):
            raise InputError(f"a step takes each sequence at most once, got slots {slots}")
        ids = [self.check(tokens, slot) for slot, tokens in batch]
        T = sum(len(t) for t in ids)
        if T > self.n_batch:
            raise InputError(f"a step of {T} tokens exceeds the engine's {self.n_batch} rows")
        if len(batch) > 1:  # several decode rows (at least the logits' rows)
            self.warm_up_rows()
        order = sorted(range(len(batch)), key=lambda i: len(ids[i]) > 1)  # one-token sequences first
        segs = self._segs([(slots[i], self.positions[slots[i]], len(ids[i])) for i in order])
        logits = self._logits(len(batch))
        cfg = self.cfg
        states = np.empty((cfg.num_layers + 1, T, cfg.hidden_size) if hidden else (0, 1, 1), np.float32)
        self._run(*self._args(np.concatenate([ids[i] for i in order]), segs, False, logits, states))
        for slot, t in zip(slots, ids):
            self.positions[slot] += len(t)
            if len(t) > 1:
                self.state.save(slot, self.positions[slot])
        out, r0 = [None] * len(batch), 0
        for row, i in enumerate(order):
            out[i] = logits[row]
            if hidden:
                out[i] = (out[i], states[:, r0:r0 + len(ids[i])])
                r0 += len(ids[i])
        return out
