"""llama.cpp (llama-cpp-python) on the same .gguf file, in its own process (child.py).

For bench: `Llama.eval` of the whole prompt for pp (one batch: n_batch >= N), one-token `eval`
calls for tg, `reset()` (n_tokens = 0: the next eval drops the cache past it) between runs; the
seconds are timed here, around the calls alone. Tests of B sequences run on a second context with
n_seq_max = B (llama-batched-bench's setting: a KV cache per sequence), one llama_decode a step
over a batch of one token of each sequence, every token's logits asked for.
For the oracle: llama_decode over slices of at most n_batch tokens with the logits of every token,
the KV cache cleared at the start of each window.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import InputError


class LlamaCppPeer:
    def __init__(self, path: str, name: str, threads: int, n_ctx: int, n_batch: int = 512, seqs: int = 1):
        import llama_cpp

        self.lc, self.threads, self.n_batch = llama_cpp, threads, n_batch
        try:
            self.llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                       n_threads=threads, n_threads_batch=threads, verbose=False)
        except Exception as e:  # llama.cpp refuses the file (an architecture it lacks, ...)
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise InputError(f"llama.cpp could not load {name}: {first}") from None
        self.version = getattr(llama_cpp, "__version__", "?")
        self._batch = None
        self._seqs = None if seqs == 1 else self._seq_context(seqs, n_ctx)

    def _seq_context(self, seqs: int, n_ctx: int):
        """(context, batch) for tests of up to `seqs` sequences of n_ctx positions each."""
        lc = self.lc
        p = lc.llama_context_default_params()
        p.n_ctx = seqs * -(-n_ctx // 256) * 256  # llama.cpp splits it into seqs caches of whole 256s
        p.n_batch = p.n_ubatch = max(self.n_batch, seqs)
        p.n_seq_max = seqs
        p.n_threads = p.n_threads_batch = self.threads
        ctx = lc.llama_init_from_model(self.llm.model, p)
        if not ctx:
            raise InputError(f"llama.cpp could not make a context of {seqs} sequences")
        return ctx, lc.llama_batch_init(p.n_batch, 0, 1)

    def info(self) -> dict:
        return {"version": self.version, "threads": self.threads,
                "detail": f"llama-cpp-python {self.version}, n_batch {self.n_batch}, KV cache f16 (its default)",
                "system_info": self.lc.llama_print_system_info().decode("utf-8", "replace").strip()}

    # ---------------------------------------------------------------- bench

    def prepare(self, depth_ids, seqs: int = 1):
        if seqs > 1:
            return self._prepare_seqs(depth_ids, seqs)
        self.llm.reset()
        if len(depth_ids):
            self.llm.eval([int(t) for t in depth_ids])

    def pp(self, ids) -> float:
        toks = [int(t) for t in ids]
        t0 = time.perf_counter()
        self.llm.eval(toks)
        return time.perf_counter() - t0

    def tg(self, ids) -> float:
        if ids.ndim == 2:
            return self._tg_seqs(ids)
        ev = self.llm.eval
        toks = [[int(t)] for t in ids]
        t0 = time.perf_counter()
        for t in toks:
            ev(t)
        return time.perf_counter() - t0

    def _decode(self, ctx, b, rows):
        """rows: (token, position, sequence) into batch b, one llama_decode."""
        b.n_tokens = len(rows)
        for k, (t, p, s) in enumerate(rows):
            b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = int(t), int(p), 1, 1
            b.seq_id[k][0] = int(s)
        rc = self.lc.llama_decode(ctx, b)
        if rc != 0:
            raise InputError(f"llama.cpp llama_decode failed (code {rc})")

    def _prepare_seqs(self, depth_ids, seqs: int):
        ctx, b = self._seqs
        self.lc.llama_memory_clear(self.lc.llama_get_memory(ctx), True)
        for s in range(seqs):
            for k in range(0, len(depth_ids), self.n_batch):
                self._decode(ctx, b, [(t, k + i, s) for i, t in enumerate(depth_ids[k:k + self.n_batch])])
        self._depth = len(depth_ids)

    def _tg_seqs(self, ids) -> float:
        ctx, b = self._seqs
        steps = [[(t, self._depth + i, s) for s, t in enumerate(row)] for i, row in enumerate(ids)]
        t0 = time.perf_counter()
        for rows in steps:
            self._decode(ctx, b, rows)
        return time.perf_counter() - t0

    def greedy(self, ids, n: int, lookup: int = 0):
        """Greedy decoding of up to n tokens after the prompt ids through `Llama.generate` (top-k 1),
        with lookup > 0 through its prompt-lookup speculation (`LlamaPromptLookupDecoding`,
        num_pred_tokens = lookup, on a Llama of its own: speculation needs every token's logits).
        Returns (the tokens, the seconds from the first token to the last): the decode steps alone."""
        llm = self.llm
        if lookup:
            if getattr(self, "_lookup", (0, None))[0] != lookup:
                from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

                self._lookup = (lookup, self.lc.Llama(
                    model_path=self.llm.model_path, n_ctx=self.llm.n_ctx(), n_batch=self.n_batch,
                    n_ubatch=self.n_batch, n_threads=self.threads, n_threads_batch=self.threads, verbose=False,
                    draft_model=LlamaPromptLookupDecoding(num_pred_tokens=lookup)))
            llm = self._lookup[1]
        eos = llm.token_eos()
        tokens, t_first = [], 0.0
        for t in llm.generate([int(i) for i in ids], top_k=1, temp=0.0, reset=True):
            if not tokens:
                t_first = time.perf_counter()
            if t == eos:
                break
            tokens.append(int(t))
            if len(tokens) >= n:
                break
        return tokens, time.perf_counter() - t_first

    # ---------------------------------------------------------------- oracle

    def clear(self):
        lc = self.lc
        lc.llama_memory_clear(lc.llama_get_memory(self.llm.ctx), True)

    def logits(self, block, start: int):
        """(logits [len(block), vocab] float32 of every token of block at positions start.., seconds)."""
        lc = self.lc
        if self._batch is None:
            self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
            self._n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.llm.model))
        b = self._batch
        b.n_tokens = len(block)
        for k, t in enumerate(block):
            b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = int(t), start + k, 1, 1
            b.seq_id[k][0] = 0
        t0 = time.perf_counter()
        rc = lc.llama_decode(self.llm.ctx, b)
        dt = time.perf_counter() - t0
        if rc != 0:
            raise InputError(f"llama.cpp llama_decode failed (code {rc}) at position {start}")
        ptr = lc.llama_get_logits(self.llm.ctx)
        return np.ctypeslib.as_array(ptr, shape=(len(block), self._n_vocab)).copy(), dt


# `fuel bench --first-token --compare llama.cpp`: llama.cpp's load + first token in a fresh process
# (python -c FIRST_TOKEN PATH THREADS PROMPT), nothing of fuel imported
FIRST_TOKEN = r"""
import sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]),
                      n_ctx=512, verbose=False)
out = llm.create_chat_completion([{"role": "user", "content": sys.argv[3]}], max_tokens=1, temperature=0)
sys.stdout.write(out["choices"][0]["message"]["content"] or "-")
sys.stdout.flush()
"""
