"""Own GGUF reader vs gguf.GGUFReader on small written files, and every bad-file error."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
import pytest

from fuelcli.errors import InputError
from fuelcli.formats import BY_GGML_TYPE, GGML_TYPE_NAMES, dequantize
from fuelcli.weights.gguf import read_gguf

Q = gguf.GGMLQuantizationType


def _write(path: Path, tensors: dict, meta: bool = True, alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    if meta:
        w.add_uint32("test.u32", 7)
        w.add_int8("test.i8", -3)
        w.add_float32("test.f32", 0.5)
        w.add_float64("test.f64", 1e-300)
        w.add_bool("test.bool", True)
        w.add_uint64("test.u64", 1 << 40)
        w.add_string("test.str", "héllo")
        w.add_array("tokenizer.ggml.tokens", ["a", "Ġb", "<|im_end|>", "", "日本"])
        w.add_array("tokenizer.ggml.token_type", [1, 1, 3, 4, 1])
        w.add_array("test.floats", [0.25, -1.5])
    if alignment:
        w.add_custom_alignment(alignment)
    for name, (arr, qtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensors(rng):
    w = rng.standard_normal((6, 64)).astype(np.float32)
    e = rng.standard_normal((2, 3, 256)).astype(np.float32)
    k = rng.integers(0, 256, (4, 2 * 144), dtype=np.uint8)  # K-quants: gguf has no quantizer
    for off in (0, 2):  # finite d / dmin for every block
        k.reshape(-1, 144)[:, off : off + 2] = np.array([0.01 * (off + 1)], np.float16).view(np.uint8)
    k6 = rng.integers(0, 256, (3, 210), dtype=np.uint8)
    k6[:, 208:210] = np.array([0.02], np.float16).view(np.uint8)
    return {
        "t.f32": (w, Q.F32),
        "t.f16": (w.astype(np.float16), Q.F16),
        "t.bf16": (gguf.quants.quantize(w, Q.BF16), Q.BF16),
        "t.q8_0": (gguf.quants.quantize(w, Q.Q8_0), Q.Q8_0),
        "t.q4_0": (gguf.quants.quantize(w, Q.Q4_0), Q.Q4_0),
        "t.q4_1": (gguf.quants.quantize(w, Q.Q4_1), Q.Q4_1),
        "t.q5_0": (gguf.quants.quantize(w, Q.Q5_0), Q.Q5_0),
        "t.experts": (gguf.quants.quantize(e, Q.Q8_0), Q.Q8_0),
        "t.q4_k": (k, Q.Q4_K),
        "t.q6_k": (k6, Q.Q6_K),
        "t.vec": (rng.standard_normal(64).astype(np.float32), Q.F32),
    }


def _check_against_gguf_reader(path: Path):
    ours = read_gguf(path)
    ref = gguf.GGUFReader(str(path))
    ref_meta = {f.name: f.contents() for f in ref.fields.values() if not f.name.startswith("GGUF.")}
    assert set(ours.meta) == set(ref_meta)
    for k, v in ref_meta.items():
        assert ours.meta[k] == v, k
        assert type(ours.meta[k]) is type(v), k
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for rt in ref.tensors:
        t = ours.tensors[rt.name]
        assert t.fmt == BY_GGML_TYPE[int(rt.tensor_type)].name
        assert t.shape == tuple(int(d) for d in reversed(rt.shape))
        assert t.data.dtype == np.uint8 and t.data.flags.c_contiguous and not t.data.flags.writeable
        expect = gguf.quants.dequantize(rt.data, rt.tensor_type).reshape(t.shape)
        assert np.array_equal(dequantize(t).view(np.uint32), expect.view(np.uint32)), rt.name
    return ours


def test_reader_matches_gguf_reader(tmp_path):
    path = _write(tmp_path / "m.gguf", _tensors(np.random.default_rng(0)))
    g = _check_against_gguf_reader(path)
    assert g.version == 3 and g.alignment == 32 and g.path == str(path)
    assert g.meta["test.str"] == "héllo" and g.meta["test.bool"] is True
    assert g.meta["tokenizer.ggml.tokens"][4] == "日本"
    assert g.tensors["t.experts"].shape == (2, 3, 256)
    assert g.tensors["t.vec"].shape == (64,)
    assert g.tensors["t.q8_0"].data.shape == (6, 2 * 34)
    assert np.shares_memory(g.tensors["t.f32"].data, g.tensors["t.f16"].data) is False
    assert g.tensors["t.f32"].data.base is not None  # a view, not a copy


def test_custom_alignment(tmp_path):
    path = _write(tmp_path / "a.gguf", _tensors(np.random.default_rng(1)), alignment=64)
    g = _check_against_gguf_reader(path)
    assert g.alignment == 64 and g.data_offset % 64 == 0


# ----------------------------------------------------------------- bad files


@pytest.fixture
def small(tmp_path) -> Path:
    w = np.arange(64, dtype=np.float32).reshape(2, 32)
    return _write(tmp_path / "s.gguf", {"w": (w, Q.F32), "q": (gguf.quants.quantize(w, Q.Q8_0), Q.Q8_0)})


def _tensor_info_pos(data: bytes, name: bytes) -> int:
    """Byte offset just after the tensor name `name` in the header (n_dims follows)."""
    key = struct.pack("<Q", len(name)) + name
    i = data.index(key, 24)
    return i + len(key)


def _raises(path, *words):
    with pytest.raises(InputError) as e:
        read_gguf(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_bad_magic(small):
    data = bytearray(small.read_bytes())
    data[:4] = b"GGML"
    small.write_bytes(data)
    _raises(small, "not a GGUF file")


def test_bad_version(small):
    data = bytearray(small.read_bytes())
    data[4:8] = struct.pack("<I", 99)
    small.write_bytes(data)
    _raises(small, "version 99")


@pytest.mark.parametrize("keep", [0, 6, 30, 200])
def test_truncated_header(small, keep):
    small.write_bytes(small.read_bytes()[:keep])
    _raises(small, "truncated")


def test_truncated_data(small):
    small.write_bytes(small.read_bytes()[:-40])  # > the 32-byte end padding
    _raises(small, "outside the file")


def test_offset_beyond_end(small):
    data = bytearray(small.read_bytes())
    p = _tensor_info_pos(bytes(data), b"q")
    # n_dims u32, 2 dims u64, type u32, then offset u64
    off_pos = p + 4 + 2 * 8 + 4
    data[off_pos : off_pos + 8] = struct.pack("<Q", 1 << 30)
    small.write_bytes(data)
    _raises(small, "'q'", "outside the file")


# every ggml type fuel does not read yet (none once it reads them all: the test is then vacuous)
LACKING = [t for t in GGML_TYPE_NAMES if t not in BY_GGML_TYPE]


@pytest.mark.parametrize("gtype", LACKING)
def test_unsupported_type(small, gtype):
    """One line naming the tensor and the ggml type; negative control: a type fuel reads loads."""
    assert read_gguf(small).tensors["q"].fmt == "q8_0"
    data = bytearray(small.read_bytes())
    p = _tensor_info_pos(bytes(data), b"q")
    data[p + 4 + 16 : p + 4 + 16 + 4] = struct.pack("<I", gtype)
    small.write_bytes(data)
    _raises(small, "'q'", f"unsupported type {GGML_TYPE_NAMES[gtype]} ", "q4_k")


def test_missing_file(tmp_path):
    _raises(tmp_path / "nope.gguf", "cannot open")


# ----------------------------------------------------------------- real file


REAL = {  # fixture -> (vocabulary size, the tensor types the file must hold)
    "smollm2_gguf": (49152, {Q.Q4_1, Q.Q8_0, Q.F32}),
    "qwen_coder_gguf": (151936, {Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.F32}),
}


@pytest.mark.slow
@pytest.mark.parametrize("fixture", list(REAL))
def test_real_files(fixture, request):
    """Every tensor type of both real files dequantises bit for bit as gguf.quants does."""
    path = str(request.getfixturevalue(fixture))
    vocab, types = REAL[fixture]
    read_gguf(path)  # page cache warm, as on any second start
    t0 = time.perf_counter()
    g = read_gguf(path)
    dt = time.perf_counter() - t0
    assert dt < 1.0, f"header parse took {dt:.2f} s"
    assert len(g.meta["tokenizer.ggml.tokens"]) == vocab
    ref = gguf.GGUFReader(path)
    for key in ("general.architecture", "tokenizer.ggml.model"):
        assert g.meta[key] == ref.fields[key].contents()
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        assert g.meta[k] == ref.fields[k].contents(), k
    seen = set()
    for rt in ref.tensors:  # one tensor of each type, fully; the rest shape/format only
        t = g.tensors[rt.name]
        assert t.shape == tuple(int(d) for d in reversed(rt.shape))
        assert np.shares_memory(t.data, rt.data) is False and t.data.nbytes == rt.data.nbytes
        if rt.tensor_type in seen:
            continue
        seen.add(rt.tensor_type)
        expect = gguf.quants.dequantize(rt.data, rt.tensor_type).reshape(t.shape)
        assert np.array_equal(dequantize(t), expect), rt.name
    assert seen == types
