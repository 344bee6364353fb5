"""Malformed JSON documents and safetensors files, systematically: every JSON file fuel reads
(config.json, generation_config.json, tokenizer_config.json, the shard index, a safetensors
header) gets the same hostile documents and the same file-system surprises; safetensors files are
cut at every structural boundary, byte-flipped and given impossible headers. Each ends in a
FuelError of one line naming the file; anything else escaping is a bug."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuelcli.errors import FuelError, InputError
from fuelcli.fileio.jsondoc import parse_object, read_object
from fuelcli.weights.safetensors import read_checkpoint, read_safetensors

import malformed as M

HOSTILE = {
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "deep object nesting": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "a 5000-digit integer": '{"hidden_size": ' + "9" * 5000 + "}",
    "not UTF-8": b'{"a": "\xff\xfe"}',
    "UTF-16": '{"a": 1}'.encode("utf-16"),
    "an array": "[1, 2]",
    "a string": '"config"',
    "a number": "1e999",
    "null": "null",
    "empty": "",
    "cut short": '{"a": [1, 2',
    "trailing garbage": '{"a": 1} x',
}


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def _documents(d: Path) -> dict:
    """Where each JSON document of a model directory lives -> how to read it as fuel does."""
    from fuelcli.model.config import load_hf_config
    from fuelcli.text.tokenizer import Tokenizer

    return {
        "config.json": lambda: load_hf_config(d),
        "generation_config.json": lambda: load_hf_config(d),
        "tokenizer_config.json": lambda: Tokenizer.from_dir(d),
        "model.safetensors.index.json": lambda: read_checkpoint(d),
    }


@pytest.mark.parametrize("doc", ["config.json", "generation_config.json", "tokenizer_config.json",
                                 "model.safetensors.index.json"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_documents(tmp_path, doc, case):
    d = M.write_hf_dir(tmp_path / "m", tokenizer=True)
    text = HOSTILE[case]
    (d / doc).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError) as e:
        _documents(d)[doc]()
    assert doc in one_line(e.value)


@pytest.mark.parametrize("doc", ["config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
                                 "model.safetensors.index.json", "model.safetensors", "chat_template.jinja"])
@pytest.mark.parametrize("kind", ["directory", "fifo", "unreadable"])
def test_not_a_readable_regular_file(tmp_path, monkeypatch, doc, kind):
    d = M.write_hf_dir(tmp_path / "m", tokenizer=True)
    if kind == "directory":
        (d / doc).unlink(missing_ok=True)
        (d / doc).mkdir()
    elif kind == "fifo":
        (d / doc).unlink(missing_ok=True)
        os.mkfifo(d / doc)  # opened blocking, a read would wait for a writer forever
    else:
        if not (d / doc).exists():
            (d / doc).write_text("{}")
        real_open = os.open

        def denied(path, *a, **kw):  # chmod 0 does not stop root, so refuse the open itself
            if str(path).endswith(doc):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *a, **kw)

        monkeypatch.setattr(os, "open", denied)
    with pytest.raises(InputError) as e:
        M.run_pipeline(d)
    text = one_line(e.value)
    assert doc in text, text
    assert {"directory": "is a directory", "fifo": "is a FIFO", "unreadable": "Permission denied"}[kind] in text


def test_json_reader_limits(tmp_path):
    assert parse_object(b'{"a": 1}', "x") == {"a": 1}
    with pytest.raises(InputError, match="x is not a JSON object \\(it is null\\)"):
        parse_object("null", "x")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate((256 << 20) + 1)  # sparse: no disk used
    with pytest.raises(InputError, match="more than the 268435456 a file of this kind may have"):
        read_object(big)
    assert read_object(tmp_path / "absent.json", required=False) is None


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
                              max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_any_document_is_an_object_or_one_error(data):
    try:
        assert isinstance(parse_object(data, "doc.json"), dict)
    except InputError as e:
        assert one_line(e).startswith("doc.json")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(M.CONFIG) + ["rope_scaling", "rope_parameters", "layer_types", "head_dim",
                                               "attention_bias", "mlp_bias", "sliding_window"]),
       value=st.recursive(st.none() | st.booleans() | st.integers(-2, 2) | st.integers() | st.floats()
                          | st.text(max_size=8),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(
                              st.sampled_from(["rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                                               "original_max_position_embeddings", "rope_theta"]), c, max_size=4),
                          max_leaves=8))
def test_any_value_for_any_config_key(tmp_path, key, value):
    """Whatever a key of config.json holds, reading the model ends in a FuelError or runs."""
    d = tmp_path / "m"
    if not d.exists():
        M.write_hf_dir(d)
    (d / "config.json").write_text(json.dumps({**M.CONFIG, key: value}))
    try:
        M.run_pipeline(d)
    except FuelError as e:
        one_line(e)


# ------------------------------------------------------------------ safetensors


def test_the_tiny_directory_is_good(tmp_path):
    assert M.run_pipeline(M.write_hf_dir(tmp_path / "m", tokenizer=True)).shape == (3, M.V)


def test_truncated_at_every_boundary(tmp_path):
    data, bounds = M.safetensors_bytes(M.hf_tensors())
    d = M.write_hf_dir(tmp_path / "m")
    for cut, what in bounds + [(len(data) - 1, "last byte")]:
        (d / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(InputError) as e:
            M.run_pipeline(d)
        text = one_line(e.value)
        assert "model.safetensors" in text or "config.json" in text, (what, text)


def _header_file(tmp_path, header: dict, data: bytes) -> Path:
    h = json.dumps(header).encode()
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return p


def _f32(shape, begin):
    n = int(np.prod(shape)) * 4
    return {"dtype": "F32", "shape": list(shape), "data_offsets": [begin, begin + n]}


@pytest.mark.parametrize("name, header, size, needles", [
    ("a dim of 2^63", {"w": {"dtype": "F32", "shape": [1 << 63, 2], "data_offsets": [0, 8]}}, 8, ["wrong size"]),
    ("dims whose product wraps int64", {"w": {"dtype": "F32", "shape": [1 << 62, 4], "data_offsets": [0, 0]}}, 0,
     ["wrong size"]),
    ("a 100-digit dim", {"w": {"dtype": "F32", "shape": [10 ** 100], "data_offsets": [0, 8]}}, 8, ["wrong size"]),
    ("an offset of 2^64", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [1 << 64, (1 << 64) + 8]}}, 8,
     ["outside the file"]),
    ("overlapping tensors", {"a": _f32([2], 0), "b": _f32([2], 4)}, 12, ["tensors a and b overlap"]),
    ("two tensors on the same bytes", {"a": _f32([2], 0), "b": _f32([2], 0)}, 8, ["overlap"]),
    ("a hole", {"a": _f32([2], 0), "b": _f32([2], 12)}, 20, ["4 bytes before tensor b belong to no tensor"]),
    ("trailing bytes", {"a": _f32([2], 0)}, 9, ["1 bytes after the last tensor"]),
    ("a wrong-size I64 buffer", {"a": _f32([2], 0), "p": {"dtype": "I64", "shape": [3], "data_offsets": [8, 16]}},
     16, ["tensor p", "wrong size"]),
])
def test_impossible_headers(tmp_path, name, header, size, needles):
    p = _header_file(tmp_path, header, bytes(size))
    with pytest.raises(InputError) as e:
        read_safetensors(p)
    text = one_line(e.value)
    for n in needles:
        assert n in text, text


def test_header_length_limits(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 63) + b"{}")
    with pytest.raises(InputError, match="header length 9223372036854775808 exceeds the file size"):
        read_safetensors(p)
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 100_000_001))
        f.truncate(100_000_100)  # sparse
    with pytest.raises(InputError, match="over the format's limit of 100000000"):
        read_safetensors(p)


def test_shards_the_index_cannot_name(tmp_path):
    d = M.write_hf_dir(tmp_path / "m")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    with pytest.raises(InputError, match="not a shard file name"):
        read_checkpoint(d)
    # the same tensor in two shards: which one would win is an accident of the file order
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "a.safetensors",
                                                                               "b": "b.safetensors"}}))
    _header_file(tmp_path, {"a": _f32([2], 0)}, bytes(8)).rename(d / "a.safetensors")
    _header_file(tmp_path, {"a": _f32([2], 0)}, bytes(8)).rename(d / "b.safetensors")
    with pytest.raises(InputError, match="tensor a is in more than one shard"):
        read_checkpoint(d)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10 ** 9), st.integers(0, 255)), min_size=1, max_size=4),
       in_header=st.booleans())
def test_byte_flips_never_escape(tmp_path, flips, in_header):
    data, bounds = M.safetensors_bytes(M.hf_tensors())
    header_end = dict((w, b) for b, w in bounds)["data start"]
    data = bytearray(data)
    for pos, value in flips:
        data[pos % header_end if in_header else pos % len(data)] = value
    d = tmp_path / "m"
    if not d.exists():
        M.write_hf_dir(d)
    (d / "model.safetensors").write_bytes(bytes(data))
    try:
        M.run_pipeline(d)
    except FuelError as e:
        one_line(e)


entry = st.fixed_dictionaries({}, optional={
    "dtype": st.sampled_from(["F32", "F16", "BF16", "I64", "BOOL", "F4", 7, None]),
    "shape": st.lists(st.integers(-1, 1 << 65), max_size=3) | st.text(max_size=3),
    "data_offsets": st.lists(st.integers(-1, 1 << 65), max_size=3)})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.dictionaries(st.sampled_from(["a", "b", "model.norm.weight", "__metadata__"]),
                              entry | st.integers() | st.lists(st.integers(), max_size=2), max_size=3),
       size=st.integers(0, 64))
def test_any_header_never_escapes(tmp_path, header, size):
    p = _header_file(tmp_path, header, bytes(size))
    try:
        read_safetensors(p)
    except InputError as e:
        one_line(e)
