"""Every block format through a whole model, as users' files are written: llama.cpp's own quantiser
(llama-cpp-python's llama_model_quantize, `pure`: every matrix and the embedding in the one type)
turns a tiny f32 llama GGUF into each type fuel reads (iq3_xxs and the iq2 and iq1 types, which it
refuses without an importance matrix: ggml's row quantiser through libgguf writes the matrices, with a
uniform one where the type needs it); fuel's decode and prefill paths on it against
its numpy reference path on the same file (whose weights are the numpy decode, bit-exact against
gguf-py's: test_formats.py), with the host's instruction set.

Tolerance: the largest KL over positions <= KL_TOL and top-1 agreement 1.0. Measured on this model
(logits of magnitude ~5-10): largest KL 1.6e-7 on every type and path (the int16 activations'
rounding). Negative control, per type: the same engine logits against the reference of the f32
source (the quantisation's own error, the size of a decode that misreads one bit field or scale) are
far outside KL_TOL, so the comparison sees an error of that size.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import gguf
import numpy as np
import pytest

from fuelcli.backends.cpu.unpack import record
from fuelcli.formats import FORMATS
from fuelcli.assembly.forward_paths import logits_by_path
from fuelcli.assembly.loader import open_model
from test_cpu_engine import _kl

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")

# llama_ftype of each block format (llama.h); with `pure` the _S mixes are their one K-quant; None:
# quantised row by row with libgguf
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k": 11, "q4_k": 14, "q5_k": 16,
          "q6_k": 18, "iq4_nl": 25, "iq4_xs": 30, "iq3_xxs": None, "iq3_s": 26, "iq2_xxs": None, "iq2_xs": None,
          "iq2_s": None, "iq1_s": None, "iq1_m": None, "tq1_0": 36, "tq2_0": 37,
          "mxfp4": 38}
QUANT = [f for f in FORMATS if record(FORMATS[f].code).quant]
KL_TOL = 1e-4
IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]
H, NH, NKV, FF, V = 256, 4, 2, 512, 64  # rows of 256 and 512: every K-quant without fallbacks

QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.pure, p.allow_requantize, p.nthread = int(sys.argv[3]), True, True, 1
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""


def test_every_block_format_is_here():
    assert set(FTYPES) == set(QUANT)


def _write(path, fmt=None):
    """The tiny llama in f32, or with every matrix in `fmt` (libgguf's row quantiser)."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 1), (w.add_embedding_length, H), (w.add_feed_forward_length, FF),
                   (w.add_head_count, NH), (w.add_head_count_kv, NKV), (w.add_rope_freq_base, 10000.0),
                   (w.add_layer_norm_rms_eps, 1e-5), (w.add_context_length, 128), (w.add_tokenizer_model, "gpt2")):
        add(v)
    w.add_token_list([chr(ord("a") + i) for i in range(V)])
    w.add_token_merges([])
    D = H // NH

    def mat(*shape, s=1.0):
        return (rng.standard_normal(shape) * s / np.sqrt(shape[-1])).astype(np.float32)

    for name, a in (("token_embd.weight", mat(V, H, s=16)), ("output_norm.weight", 1 + 0.1 * mat(H)),
                    ("output.weight", mat(V, H, s=4)), ("blk.0.attn_norm.weight", 1 + 0.1 * mat(H)),
                    ("blk.0.ffn_norm.weight", 1 + 0.1 * mat(H)), ("blk.0.attn_q.weight", mat(NH * D, H)),
                    ("blk.0.attn_k.weight", mat(NKV * D, H)), ("blk.0.attn_v.weight", mat(NKV * D, H)),
                    ("blk.0.attn_output.weight", mat(H, H)), ("blk.0.ffn_gate.weight", mat(FF, H)),
                    ("blk.0.ffn_up.weight", mat(FF, H)), ("blk.0.ffn_down.weight", mat(H, FF))):
        if fmt is None or a.ndim == 1:
            w.add_tensor(name, a)
        else:
            import libgguf

            qt = gguf.GGMLQuantizationType(FORMATS[fmt].ggml_type)
            imatrix = np.ones(a.shape[-1], np.float32) if libgguf.quantize_requires_imatrix(qt) else None
            w.add_tensor(name, libgguf.quantize_rows(a, qt, imatrix=imatrix), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant_types")
    src = d / "f32.gguf"
    _write(src)
    made = {}

    def get(fmt):
        if fmt not in made:
            dst = d / f"{fmt}.gguf"
            if FTYPES[fmt] is None:
                _write(dst, fmt)
                made[fmt] = dst
                return dst
            r = subprocess.run([sys.executable, "-c", QUANTIZE, str(src), str(dst), str(FTYPES[fmt])],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr[-2000:]
            made[fmt] = dst
        return made[fmt]

    get.source = src
    return get


@pytest.fixture(scope="module")
def source_reference(files):
    return logits_by_path(open_model(str(files.source)), IDS, "reference")


@pytest.mark.parametrize("fmt", QUANT)
def test_quantised_model(files, source_reference, fmt):
    model = open_model(str(files(fmt)))
    types = {t.fmt for n, t in model.gguf.tensors.items() if n.endswith("weight") and "norm" not in n}
    assert types == {fmt}, types
    ref = logits_by_path(model, IDS, "reference")
    for path in ("decode", "prefill"):
        got = logits_by_path(model, IDS, path)
        kl = float(_kl(ref, got))
        print(f"{fmt} {path}: max KL {kl:.2e}, against the f32 source {_kl(source_reference, got):.2e}")
        assert kl <= KL_TOL and np.array_equal(ref.argmax(-1), got.argmax(-1)), (fmt, path, kl)
        assert _kl(source_reference, got) > 10 * KL_TOL, (fmt, path)  # negative control
