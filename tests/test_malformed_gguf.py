"""Malformed GGUF files, systematically: cut at every structural boundary, every value type in
place of every key fuel reads, byte flips anywhere, huge counts and sizes. Each is read as the CLI
reads a model (tests/malformed.py: run_pipeline) and must end in a FuelError whose message is one
line naming the file or key; anything else escaping is a bug."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuelcli.errors import FuelError, InputError
from fuelcli.formats import BY_GGML_TYPE, GGML_TYPE_NAMES
from fuelcli.weights.gguf import read_gguf
from fuelcli.weights.gguf_meta import ARCH_KEYS, KEYS

import malformed as M

LACKING = max(t for t in GGML_TYPE_NAMES if t not in BY_GGML_TYPE)  # a ggml type fuel does not read

# one value of every GGUF value type (arrays: of strings, of ints, of floats, of arrays)
EVERY_TYPE = [(M.U8, 3), (M.I8, -3), (M.U16, 3), (M.I16, -3), (M.U32, 3), (M.I32, -3), (M.F32, 0.5),
              (M.BOOL, True), (M.STRING, "x y"), (M.U64, 3), (M.I64, -3), (M.F64, 0.5),
              (M.ARRAY, (M.STRING, ["a b", "b c"])), (M.ARRAY, (M.I32, [1, 2])), (M.ARRAY, (M.F32, [0.5])),
              (M.ARRAY, (M.ARRAY, [(M.U8, [1])]))]
UNSIGNED = {M.U8, M.U16, M.U32, M.U64}
SIGNED = {M.I8, M.I16, M.I32, M.I64}


def accepted(spec, vtype, value) -> bool:
    """Whether gguf_meta's schema takes this value for a key of this spec."""
    want = spec[0]
    if want == "a string":
        return vtype == M.STRING
    if want == "true or false":
        return vtype == M.BOOL
    if want == "a non-negative integer":
        return vtype in UNSIGNED or (vtype in SIGNED and value >= 0)
    if want.startswith("a non-negative integer or"):
        return (vtype in UNSIGNED or (vtype in SIGNED and value >= 0)
                or (vtype == M.ARRAY and value[0] in UNSIGNED | SIGNED and value[1][0] >= 0))
    if want == "a finite number":
        return vtype in UNSIGNED | SIGNED | {M.F32, M.F64}
    if want == "an array of strings":
        return vtype == M.ARRAY and value[0] == M.STRING
    if want == "an array of integers":
        return vtype == M.ARRAY and value[0] in UNSIGNED | SIGNED
    if want == "an array of numbers":
        return vtype == M.ARRAY and value[0] in UNSIGNED | SIGNED | {M.F32, M.F64}
    raise AssertionError(want)


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def expect_error(path, *needles) -> str:
    with pytest.raises(FuelError) as e:
        M.run_pipeline(path)
    text = one_line(e.value)
    for n in needles:
        assert n in text, text
    return text


def test_the_tiny_file_is_good(tmp_path):
    """The positive control: every test below breaks this file, which reads and runs."""
    p = tmp_path / "m.gguf"
    p.write_bytes(M.gguf_bytes()[0])
    assert M.run_pipeline(p).shape == (3, M.V)


def test_truncated_at_every_boundary(tmp_path):
    data, bounds = M.gguf_bytes()
    cuts = sorted({b for b, _ in bounds} | {b + 1 for b, _ in bounds} | {len(data) - 1})
    p = tmp_path / "cut.gguf"
    for cut in cuts:
        if cut >= len(data):
            continue
        p.write_bytes(data[:cut])
        with pytest.raises(InputError) as e:
            read_gguf(p)
        assert str(p) in one_line(e.value), cut


@pytest.mark.parametrize("key", [*KEYS, *(f"llama.{k}" for k in ARCH_KEYS)])
def test_every_value_type_for_every_key(tmp_path, key):
    spec = KEYS.get(key) or ARCH_KEYS[key.split(".", 1)[1]]
    base = [m for m in M.tiny_gguf_meta() if m[0] != key]
    p = tmp_path / "t.gguf"
    for vtype, value in EVERY_TYPE:
        p.write_bytes(M.gguf_bytes(base + [(key, vtype, value)])[0])
        try:
            M.run_pipeline(p)
        except FuelError as e:
            text = one_line(e)
            if not accepted(spec, vtype, value):
                assert f"GGUF key {key} must be" in text and str(p) in text, (vtype, text)
        else:
            assert accepted(spec, vtype, value), (key, vtype, value)


@pytest.mark.parametrize("name, change, needles", [
    ("architecture as an array", [("general.architecture", M.ARRAY, (M.STRING, ["llama"]))],
     ["GGUF key general.architecture must be a string, got an array of 1 strings"]),
    ("tokens as integers", [("tokenizer.ggml.tokens", M.ARRAY, (M.I32, list(range(8))))],
     ["GGUF key tokenizer.ggml.tokens must be an array of strings, got an array of 8 integers"]),
    ("merges as integers", [("tokenizer.ggml.merges", M.ARRAY, (M.U8, [1]))], ["tokenizer.ggml.merges must be"]),
    ("a merge without a space", [("tokenizer.ggml.merges", M.ARRAY, (M.STRING, ["ab"]))],
     ["tokenizer.ggml.merges holds 'ab', expected two tokens separated by a space"]),
    ("a merge of unknown tokens", [("tokenizer.ggml.merges", M.ARRAY, (M.STRING, ["b c"]))],
     ["tokenizer.ggml.merges holds 'b c', which needs 'bc'"]),
    ("template as an integer", [("tokenizer.chat_template", M.U32, 7)],
     ["GGUF key tokenizer.chat_template must be a string, got the integer 7"]),
    ("block_count 2^63", [("llama.block_count", M.U64, 1 << 63)], ["llama.block_count=9223372036854775808 is too large"]),
    ("embedding_length 10^12", [("llama.embedding_length", M.U64, 10 ** 12)], ["llama.embedding_length=1000000000000"]),
    ("context_length 0", [("llama.context_length", M.U32, 0)], ["max_position_embeddings must be > 0"]),
    ("head count per layer, uneven", [("llama.attention.head_count", M.ARRAY, (M.U32, [2, 4]))], ["per-layer"]),
    ("head count per layer, empty", [("llama.attention.head_count", M.ARRAY, (M.U32, []))], ["per-layer"]),
    ("alignment not a power of two", [("general.alignment", M.U32, 24)], ["general.alignment must be a power of two"]),
    ("alignment 0", [("general.alignment", M.U32, 0)], ["general.alignment must be a power of two"]),
    ("token types too few", [("tokenizer.ggml.token_type", M.ARRAY, (M.I32, [1]))], ["has 1 entries", "8"]),
    ("bos beyond the vocabulary", [("tokenizer.ggml.bos_token_id", M.U32, 8)],
     ["tokenizer.ggml.bos_token_id is 8, outside the vocabulary of 8 tokens"]),
    ("eos beyond the vocabulary", [("tokenizer.ggml.eos_token_id", M.U64, (1 << 64) - 1)], ["eos_token_id"]),
    ("rms eps NaN", [("llama.attention.layer_norm_rms_epsilon", M.F32, float("nan"))], ["a finite number"]),
    ("rope base inf", [("llama.rope.freq_base", M.F64, float("inf"))], ["a finite number"]),
])
def test_metadata_errors(tmp_path, name, change, needles):
    keys = {k for k, _, _ in change}
    p = tmp_path / "t.gguf"
    p.write_bytes(M.gguf_bytes([m for m in M.tiny_gguf_meta() if m[0] not in keys] + change)[0])
    text = expect_error(p, *needles)
    assert str(p) in text or "GGUF key" in text, text


def _f32_info(name: str, dims: list, offset: int = 0, n_dims: int | None = None, gtype: int = 0) -> bytes:
    return (M._str(name) + struct.pack("<I", len(dims) if n_dims is None else n_dims)
            + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", gtype, offset))


def _raw_file(infos: list, n_tensors: int | None = None, data: bytes = b"", n_kv: int = 0, kv: bytes = b"") -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos) if n_tensors is None else n_tensors, n_kv) + kv + b"".join(infos)
    return head + bytes(-len(head) % 32) + data


@pytest.mark.parametrize("name, blob, needles", [
    ("tensor count 2^64-1", _raw_file([], n_tensors=(1 << 64) - 1), ["truncated"]),
    ("kv count 2^64-1", _raw_file([], n_kv=(1 << 64) - 1), ["truncated"]),
    ("key length 2^64-1", _raw_file([], n_kv=1, kv=struct.pack("<Q", (1 << 64) - 1)), ["truncated"]),
    ("string array count 2^63", _raw_file([], n_kv=1, kv=M._str("k") + struct.pack("<IIQ", 9, 8, 1 << 63)),
     ["truncated"]),
    ("u64 array count 2^61", _raw_file([], n_kv=1, kv=M._str("k") + struct.pack("<IIQ", 9, 10, 1 << 61)),
     ["truncated"]),
    ("unknown value type", _raw_file([], n_kv=1, kv=M._str("k") + struct.pack("<I", 13)), ["unknown value type 13"]),
    ("arrays nested 100 deep", _raw_file([], n_kv=1, kv=M._str("k") + struct.pack("<I", 9)
                                         + struct.pack("<IQ", 9, 1) * 100 + struct.pack("<IQ", 0, 0)),
     ["nested more than"]),
    ("a duplicate key", _raw_file([], n_kv=2, kv=(M._str("k") + struct.pack("<IB", 0, 1)) * 2), ["'k' appears twice"]),
    ("n_dims 2^32-1", _raw_file([_f32_info("w", [], n_dims=(1 << 32) - 1)]), ["dims"]),
    ("5 dims", _raw_file([_f32_info("w", [1] * 5)]), ["5 dims (at most 4)"]),
    ("a dim of 2^63", _raw_file([_f32_info("w", [1 << 63])]), ["more elements than ggml can count"]),
    ("dims whose product overflows int64", _raw_file([_f32_info("w", [1 << 32, 1 << 32])]),
     ["more elements than ggml can count"]),
    ("offset 2^64-1", _raw_file([_f32_info("w", [8], offset=(1 << 64) - 1)], data=bytes(32)), ["outside the file"]),
    ("unsupported type", _raw_file([_f32_info("w", [8], gtype=LACKING)], data=bytes(32)), [GGML_TYPE_NAMES[LACKING]]),
    ("two tensors on the same bytes", _raw_file([_f32_info("w", [8]), _f32_info("v", [8])], data=bytes(64)),
     ["tensor 'v' is at offset 0 of the data section, expected 32"]),
    ("the same name twice", _raw_file([_f32_info("w", [8]), _f32_info("w", [8], offset=32)], data=bytes(64)),
     ["'w' appears twice"]),
    ("a tensor count lower than the tensors written", _raw_file([_f32_info("w", [8]), _f32_info("v", [8], offset=32)],
                                                                  n_tensors=1, data=bytes(64)),
     ["bytes after the last of the header's 1 tensors"]),
    ("trailing bytes", _raw_file([_f32_info("w", [8])], data=bytes(32) + b"x"), ["1 bytes after the last"]),
])
def test_header_errors(tmp_path, name, blob, needles):
    p = tmp_path / "t.gguf"
    p.write_bytes(blob)
    with pytest.raises(InputError) as e:
        read_gguf(p)
    text = one_line(e.value)
    assert str(p) in text
    for n in needles:
        assert n in text, text


def test_a_row_not_a_multiple_of_the_block(tmp_path):
    p = tmp_path / "t.gguf"
    p.write_bytes(_raw_file([_f32_info("w", [30], gtype=8)], data=bytes(64)))  # Q8_0 blocks of 32
    with pytest.raises(InputError, match="not a multiple of the q8_0 block"):
        read_gguf(p)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10 ** 9), st.integers(0, 255)), min_size=1, max_size=4))
def test_byte_flips_never_escape(tmp_path, flips):
    """Any byte anywhere changed: a FuelError (one line) or a model that runs."""
    data = bytearray(M.gguf_bytes()[0])
    for pos, value in flips:
        data[pos % len(data)] = value
    p = tmp_path / "flip.gguf"
    p.write_bytes(bytes(data))
    try:
        M.run_pipeline(p)
    except FuelError as e:
        one_line(e)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from([m[0] for m in M.tiny_gguf_meta()]),
       value=st.one_of(st.tuples(st.sampled_from(sorted(UNSIGNED)), st.integers(0, 255)),
                       st.tuples(st.just(M.U64), st.integers(0, (1 << 64) - 1)),
                       st.tuples(st.just(M.I64), st.integers(-(1 << 63), (1 << 63) - 1)),
                       st.tuples(st.just(M.F64), st.floats()),
                       st.tuples(st.just(M.STRING), st.text(max_size=20)),
                       st.tuples(st.just(M.ARRAY), st.tuples(st.just(M.STRING), st.lists(st.text(max_size=4), max_size=9))),
                       st.tuples(st.just(M.ARRAY), st.tuples(st.just(M.U32), st.lists(st.integers(0, 2 ** 32 - 1),
                                                                                        max_size=9)))))
def test_any_value_for_any_key_never_escapes(tmp_path, key, value):
    vtype, v = value
    meta = [m if m[0] != key else (key, vtype, v) for m in M.tiny_gguf_meta()]
    p = tmp_path / "v.gguf"
    p.write_bytes(M.gguf_bytes(meta)[0])
    try:
        M.run_pipeline(p)
    except FuelError as e:
        one_line(e)


def test_nan_in_a_weight_is_named(tmp_path):
    """NaN in a weight: the forward runs on, the logits check names the layer and the tensor."""
    tensors = [(n, a.copy()) for n, a in M.tiny_gguf_tensors()]
    dict(tensors)["blk.0.attn_q.weight"][0, 0] = np.nan
    p = tmp_path / "nan.gguf"
    p.write_bytes(M.gguf_bytes(tensors=tensors)[0])
    expect_error(p, "NaN", "in layer 0 of 1", "blk.0.attn_q.weight holds NaN or inf")
