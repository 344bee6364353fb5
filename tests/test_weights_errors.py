"""Broken or surprising weight files end in an InputError naming the file and tensor (one `error:`
line and exit 2 from the CLI), never a traceback; harmless extras (an unused I64 buffer) are fine."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fuelcli.model.config import load_hf_config
from fuelcli.errors import InputError
from fuelcli.weights.hf import load_hf_weights
from fuelcli.weights.build import Lookup
from fuelcli.weights.safetensors import read_checkpoint, read_safetensors


def _write_st(path: Path, header, data: bytes = b"") -> Path:
    """A safetensors file with exactly this header (any JSON) and data."""
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def _f32(name: str, shape: list, begin: int = 0) -> dict:
    n = int(np.prod(shape)) * 4
    return {name: {"dtype": "F32", "shape": shape, "data_offsets": [begin, begin + n]}}


# ------------------------------------------------------------------ malformed headers


@pytest.mark.parametrize("header, needles", [
    ([1, 2], ["safetensors header is not a JSON object (it is an array)"]),
    ({"w": {"shape": [2], "data_offsets": [0, 8]}}, ["tensor w", "no 'dtype'"]),
    ({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, ["tensor w", "no 'shape'"]),
    ({"w": {"dtype": "F32", "shape": [2]}}, ["tensor w", "no 'data_offsets'"]),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, ["tensor w", "data_offsets [0]"]),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", 8]}}, ["tensor w", "data_offsets"]),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, ["tensor w", "data_offsets"]),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 800]}}, ["tensor w", "outside the file"]),
    ({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, ["tensor w", "shape '2'"]),
    ({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}}, ["tensor w", "shape"]),
    ({"w": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]}}, ["tensor w", "dtype 7"]),
    ({"w": [1, 2]}, ["tensor w", "not an object"]),
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, ["tensor w", "wrong size"]),
])
def test_malformed_header_entries(tmp_path, header, needles):
    f = _write_st(tmp_path / "model.safetensors", header, bytes(8))
    with pytest.raises(InputError) as e:
        read_safetensors(f)
    assert "model.safetensors" in str(e.value)
    for n in needles:
        assert n in str(e.value)


def test_good_header_still_reads(tmp_path):
    data = np.arange(6, dtype=np.float32).tobytes()
    f = _write_st(tmp_path / "model.safetensors", {"__metadata__": {"format": "pt"}, **_f32("w", [2, 3])}, data)
    t = read_safetensors(f)["w"]
    assert t.shape == (2, 3) and t.fmt == "f32" and t.data.shape == (2, 12)


@pytest.mark.parametrize("weight_map, needles", [
    ({"w": None}, ["weight_map entry for tensor w is None"]),
    ({"w": 3}, ["weight_map entry for tensor w is 3"]),
    ([["w", "a.safetensors"]], ["weight_map is not a JSON object"]),
])
def test_bad_index(tmp_path, weight_map, needles):
    _write_st(tmp_path / "a.safetensors", _f32("w", [2]), bytes(8))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(InputError) as e:
        read_checkpoint(tmp_path)
    assert "model.safetensors.index.json" in str(e.value)
    for n in needles:
        assert n in str(e.value)


def test_index_not_an_object(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text("[1]")
    with pytest.raises(InputError, match=r"index.json is not a JSON object \(it is an array\)"):
        read_checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(InputError, match="has no valid weight_map"):
        read_checkpoint(tmp_path)


# ------------------------------------------------------------------ unsupported dtypes


def test_unsupported_dtype_is_skipped_until_needed(tmp_path):
    header = {**_f32("w", [2]), "pos": {"dtype": "I64", "shape": [2], "data_offsets": [8, 24]}}
    _write_st(tmp_path / "model.safetensors", header, bytes(24))
    table = read_checkpoint(tmp_path)
    assert set(table) == {"w"} and table.unsupported == {"pos": "I64"}
    w = Lookup(table, "m")
    assert w.vector("w", 2).shape == (2,) and w.has("pos")
    with pytest.raises(InputError, match="m: tensor pos has dtype I64, which fuel does not read"):
        w.matrix("pos", (2,))
    with pytest.raises(InputError, match="tensor pos has dtype I64"):
        w.vector("pos", 2)
    with pytest.raises(InputError, match="missing tensor nope"):
        w.matrix("nope", (2,))


def _rewrite(d: Path, change):
    """Re-save d/model.safetensors after change(dict of numpy arrays)."""
    from safetensors.numpy import load_file, save_file

    st = d / "model.safetensors"
    tensors = load_file(str(st))
    change(tensors)
    save_file(tensors, str(st), metadata={"format": "pt"})


@pytest.fixture
def llama2(tiny, tmp_path) -> Path:
    d = tmp_path / "llama2"
    shutil.copytree(tiny("llama2"), d)
    return d


def test_unused_i64_buffer_loads_and_needed_one_fails(llama2):
    _rewrite(llama2, lambda t: t.update({"model.rotary_emb.position_ids": np.arange(8, dtype=np.int64)[None]}))
    cfg = load_hf_config(llama2)
    assert len(load_hf_weights(llama2, cfg).layers) == 2

    def norm_to_i64(t):
        t["model.norm.weight"] = t["model.norm.weight"].astype(np.int64)

    _rewrite(llama2, norm_to_i64)
    with pytest.raises(InputError, match=r"llama2: tensor model\.norm\.weight has dtype I64"):
        load_hf_weights(llama2, cfg)


# ------------------------------------------------------------------ more layers than the config


def test_more_layers_in_the_file_than_the_config(llama2):
    conf = json.loads((llama2 / "config.json").read_text())
    (llama2 / "config.json").write_text(json.dumps({**conf, "num_hidden_layers": 1}))
    with pytest.raises(InputError) as e:
        load_hf_weights(llama2, load_hf_config(llama2))
    assert "the weights hold 2 layers" in str(e.value) and "num_hidden_layers=1" in str(e.value)
    assert "model.layers.1." in str(e.value)


def test_more_blocks_in_a_gguf_than_block_count(tmp_path):
    gguf = pytest.importorskip("gguf")
    from fuelcli.weights.gguf import read_gguf
    from fuelcli.weights.gguf_model import gguf_config, load_gguf_weights

    H, NH, I, V = 32, 2, 48, 8
    rng = np.random.default_rng(0)
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    for add, v in ((w.add_block_count, 1), (w.add_embedding_length, H), (w.add_feed_forward_length, I),
                   (w.add_head_count, NH), (w.add_head_count_kv, NH), (w.add_rope_freq_base, 10000.0),
                   (w.add_layer_norm_rms_eps, 1e-5), (w.add_context_length, 64)):
        add(v)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(ord("a") + i) for i in range(V)])
    names = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    for b in (0, 1):  # block 1 is one more than block_count says
        names.update({f"blk.{b}.attn_norm.weight": (H,), f"blk.{b}.ffn_norm.weight": (H,),
                      f"blk.{b}.attn_q.weight": (H, H), f"blk.{b}.attn_k.weight": (H, H),
                      f"blk.{b}.attn_v.weight": (H, H), f"blk.{b}.attn_output.weight": (H, H),
                      f"blk.{b}.attn_q.bias": (H,), f"blk.{b}.attn_k.bias": (H,), f"blk.{b}.attn_v.bias": (H,),
                      f"blk.{b}.ffn_gate.weight": (I, H), f"blk.{b}.ffn_up.weight": (I, H),
                      f"blk.{b}.ffn_down.weight": (H, I)})
    for name, shape in names.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gf = read_gguf(path)
    with pytest.raises(InputError, match=r"the weights hold 2 layers \(blk\.1\..*\) but block_count=1"):
        load_gguf_weights(gf, gguf_config(gf))


# ------------------------------------------------------------------ CLI: one line, exit 2


def fuel(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "/tmp/numba_cache_T")}
    return subprocess.run([sys.executable, "-m", "fuelcli", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_logits_out_unwritable_or_a_directory(llama2, tmp_path):
    args = ("logits", str(llama2), "--tokens", "1,2", "--path", "reference", "--out")
    one_line_error(fuel(*args, "/proc/nope/o.npy"), "/proc/nope/o.npy")
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    one_line_error(fuel(*args, str(outdir)), str(outdir), "is a directory")
    assert list(outdir.iterdir()) == [] and not (tmp_path / "outdir.partial").exists()
    one_line_error(fuel(*args, str(tmp_path / "sub" / "o.npy")), "does not exist")  # no directories made
    assert not (tmp_path / "sub").exists()
    r = fuel(*args, str(tmp_path / "o.npy"))  # the good path still writes, atomically
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "o.npy").shape == (2, 256)
    assert not (tmp_path / "o.npy.partial").exists()


def test_cli_wrong_type_config_and_extra_layers(llama2, tmp_path):
    conf = json.loads((llama2 / "config.json").read_text())
    args = ("logits", str(llama2), "--tokens", "1,2", "--path", "reference", "--out", str(tmp_path / "o.npy"))
    (llama2 / "config.json").write_text(json.dumps({**conf, "rms_norm_eps": "abc"}))
    one_line_error(fuel(*args), "rms_norm_eps must be a number")
    (llama2 / "config.json").write_text(json.dumps({**conf, "mlp_bias": True}))
    one_line_error(fuel(*args), "mlp_bias")
    (llama2 / "config.json").write_text(json.dumps({**conf, "num_hidden_layers": 1}))
    one_line_error(fuel(*args), "the weights hold 2 layers", "num_hidden_layers=1")
    _write_st(llama2 / "model.safetensors", [1, 2])
    one_line_error(fuel(*args), "model.safetensors", "not a JSON object (it is an array)")
    assert not (tmp_path / "o.npy").exists()
