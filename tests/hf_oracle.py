"""HF transformers as the oracle: eager attention, float32, one full forward (no KV-cache tricks).

    hf_logits(model_dir, token_ids, gguf_file=None)         -> np.float32 [T, vocab]
    hf_hidden_states(model_dir, token_ids, gguf_file=None)  -> list of np.float32 [T, hidden],
        length num_hidden_layers + 1:
          [0]      = the token embeddings (input to layer 0)
          [i]      = output of decoder layer i-1 (residual stream, pre-norm), for 1 <= i < L
          [L] = [-1] = output of the LAST layer AFTER the final RMSNorm (model.norm) - transformers
                       replaces the last layer's raw output by last_hidden_state; the raw (pre-norm)
                       output of the last layer is not returned.
    hf_greedy(model_dir, token_ids, n, gguf_file=None, stop_at_eos=False) -> list[int] (new tokens)

Models are loaded once per (dir, gguf_file) (functools.lru_cache). Loading forces f32 even for
bf16 checkpoints, so "transformers reading the same bf16 directory" means bf16 weights widened to f32.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=8)
def _load(model_dir: str, gguf_file: str | None = None):
    import torch
    from transformers import AutoModelForCausalLM

    kw = dict(dtype=torch.float32, attn_implementation="eager")
    if gguf_file is not None:
        kw["gguf_file"] = gguf_file
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw)
    model.eval()
    return model


def load_model(model_dir, gguf_file: str | None = None):
    """The cached transformers model (f32, eager). Do not mutate it."""
    return _load(str(Path(model_dir)), gguf_file)


def _ids(token_ids):
    import torch

    return torch.tensor([list(map(int, token_ids))], dtype=torch.long)


def hf_logits(model_dir, token_ids: list[int], gguf_file: str | None = None) -> np.ndarray:
    import torch

    model = load_model(model_dir, gguf_file)
    with torch.inference_mode():
        out = model(input_ids=_ids(token_ids), use_cache=False)
    return out.logits[0].float().numpy().astype(np.float32, copy=True)


def hf_hidden_states(model_dir, token_ids: list[int], gguf_file: str | None = None) -> list[np.ndarray]:
    """num_hidden_layers + 1 arrays [T, hidden]; the last one is post-final-norm (see module doc)."""
    import torch

    model = load_model(model_dir, gguf_file)
    with torch.inference_mode():
        out = model(input_ids=_ids(token_ids), use_cache=False, output_hidden_states=True)
    return [h[0].float().numpy().astype(np.float32, copy=True) for h in out.hidden_states]


def eos_ids(model_dir, gguf_file: str | None = None) -> list[int]:
    """All EOS ids from the model's generation_config (int or list)."""
    model = load_model(model_dir, gguf_file)
    e = model.generation_config.eos_token_id
    if e is None:
        e = model.config.eos_token_id
    if e is None:
        return []
    return [int(e)] if isinstance(e, int) else [int(x) for x in e]


def hf_greedy(
    model_dir,
    token_ids: list[int],
    n: int,
    gguf_file: str | None = None,
    stop_at_eos: bool = False,
) -> list[int]:
    """Greedy continuation via generate(do_sample=False) with the KV cache; returns only new ids.

    Any sampling defaults of the checkpoint's generation_config (temperature/top_p/top_k,
    repetition_penalty, ...) are ignored: a fresh GenerationConfig is used. With
    stop_at_eos=False exactly ``n`` tokens are produced (EOS is not special); with True, generation
    stops after the first EOS id (included in the result).
    """
    import torch
    from transformers import GenerationConfig

    model = load_model(model_dir, gguf_file)
    eos = eos_ids(model_dir, gguf_file) if stop_at_eos else None
    pad = eos[0] if eos else 0
    gc = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=int(n),
        min_new_tokens=0,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        repetition_penalty=1.0,
        use_cache=True,
    )
    ids = _ids(token_ids)
    # generate() fills every unset field from model.generation_config (eos ids, suppress_tokens,
    # no_repeat_ngram_size, ...): swap in a pristine one so only `gc` counts.
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    finally:
        model.generation_config = saved
    return [int(t) for t in out[0, ids.shape[1]:].tolist()]


def clear_cache() -> None:
    _load.cache_clear()
