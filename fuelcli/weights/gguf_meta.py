"""GGUF metadata: the value type of every key fuel reads, checked once as the file is read.

The header parser returns whatever value types the file holds; a file with `general.architecture`
as an array or the vocabulary as integers would otherwise fail deep inside config or tokenizer
code. Here each key fuel reads is held to its type (any integer width for counts: converters
differ), the arrays that run parallel to the vocabulary to its length and special token ids to the
vocabulary, in time independent of the vocabulary's size: GGUF arrays hold one element type, so an
array's first element tells its type. BPE merges are checked only when tokenizers refuses them
(check_merges: a scan of 151k merges costs 0.1 s, too much for every start).
"""

from __future__ import annotations

import math

from ..errors import InputError

DEFAULT_ALIGNMENT = 32


def positions(values: list, value, stop: int) -> list[int]:
    """The indices below `stop` at which the list `values` holds `value`: list.index scans at C speed
    (a 151k-entry token_type array in ~1 ms, where a Python loop over it takes ~12)."""
    out, i = [], -1
    try:
        while True:
            i = values.index(value, i + 1, stop)
            out.append(i)
    except ValueError:
        return out


def _uint(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _array_of(test):
    return lambda v: isinstance(v, list) and (not v or test(v[0]))


def _uint_or_uints(v) -> bool:
    return _uint(v) or _array_of(_uint)(v)


STRING = ("a string", lambda v: isinstance(v, str))
BOOL = ("true or false", lambda v: isinstance(v, bool))
UINT = ("a non-negative integer", _uint)
NUMBER = ("a finite number", _number)
UINTS = ("a non-negative integer or an array of them (one per layer)", _uint_or_uints)
STRINGS = ("an array of strings", _array_of(lambda v: isinstance(v, str)))
INTS = ("an array of integers", _array_of(lambda v: isinstance(v, int) and not isinstance(v, bool)))
NUMBERS = ("an array of numbers", _array_of(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)))

SPECIAL_IDS = tuple(f"tokenizer.ggml.{k}_token_id" for k in
                    ("bos", "eos", "eot", "eom", "unknown", "padding", "seperator", "mask"))

KEYS = {
    "general.architecture": STRING,
    "general.alignment": UINT,
    "tokenizer.ggml.model": STRING,
    "tokenizer.ggml.pre": STRING,
    "tokenizer.ggml.tokens": STRINGS,
    "tokenizer.ggml.merges": STRINGS,
    "tokenizer.ggml.token_type": INTS,
    "tokenizer.ggml.scores": NUMBERS,
    "tokenizer.ggml.add_bos_token": BOOL,
    "tokenizer.ggml.add_eos_token": BOOL,
    "tokenizer.ggml.add_space_prefix": BOOL,
    "tokenizer.chat_template": STRING,
    **{k: UINT for k in SPECIAL_IDS},
}

# keys under "{general.architecture}."
ARCH_KEYS = {
    "block_count": UINT,
    "context_length": UINT,
    "embedding_length": UINT,
    "vocab_size": UINT,
    "feed_forward_length": UINTS,
    "attention.head_count": UINTS,
    "attention.head_count_kv": UINTS,
    "attention.key_length": UINT,
    "attention.value_length": UINT,
    "attention.layer_norm_rms_epsilon": NUMBER,
    "rope.freq_base": NUMBER,
    "rope.dimension_count": UINT,
    "rope.scaling.type": STRING,
    "rope.scaling.factor": NUMBER,
    "rope.scaling.original_context_length": UINT,
    "expert_count": UINT,
    "expert_used_count": UINT,
    "expert_feed_forward_length": UINT,
    "nextn_predict_layers": UINT,
}


def describe(v) -> str:
    """A metadata value as an error message shows it (arrays by length and element type)."""
    if isinstance(v, list):
        inner = "values" if not v else describe(v[0]).split(" ")[1] + "s"
        return f"an array of {len(v)} {inner}"
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}" + ("..." if len(v) > 40 else "")
    if isinstance(v, int):
        return f"the integer {v}"
    return f"the {type(v).__name__} {v!r}"


def _require(path: str, meta: dict, key: str, spec) -> None:
    expected, test = spec
    if key in meta and not test(meta[key]):
        raise InputError(f"{path}: GGUF key {key} must be {expected}, got {describe(meta[key])}")


def check_metadata(path: str, meta: dict) -> None:
    for key, spec in KEYS.items():
        _require(path, meta, key, spec)
    arch = meta.get("general.architecture")
    if arch is not None:
        for suffix, spec in ARCH_KEYS.items():
            _require(path, meta, f"{arch}.{suffix}", spec)

    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if alignment == 0 or alignment & (alignment - 1):
        raise InputError(f"{path}: GGUF key general.alignment must be a power of two, got {alignment}")

    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in meta and len(meta[key]) != len(tokens):
            raise InputError(f"{path}: GGUF key {key} has {len(meta[key])} entries, "
                             f"tokenizer.ggml.tokens {len(tokens)}: one per token is expected")
    for key in SPECIAL_IDS:
        if key in meta and meta[key] >= len(tokens):
            raise InputError(f"{path}: GGUF key {key} is {meta[key]}, outside the vocabulary of "
                             f"{len(tokens)} tokens")


def check_merges(vocab, merges: list) -> None:
    """Name the first BPE merge that is not "a b" joining two tokens of `vocab` into a third (the
    diagnosis after tokenizers refused, or panicked on, the merges: too slow to run on every start)."""
    for m in merges:
        i = m.find(" ", 1)  # llama.cpp splits at the first space after the first character
        if i < 1:
            raise InputError(f"GGUF key tokenizer.ggml.merges holds {m[:40]!r}, expected two tokens separated "
                             "by a space")
        for t in (m[:i], m[i + 1:], m[:i] + m[i + 1:]):
            if t not in vocab:
                raise InputError(f"GGUF key tokenizer.ggml.merges holds {m[:40]!r}, which needs {t[:40]!r}, "
                                 "not a token of tokenizer.ggml.tokens")
