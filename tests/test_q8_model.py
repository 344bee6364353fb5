"""`--activations q8` through whole models: its logits against the numpy reference (the file's model in
f32) and against the default int16 path.

Measured (this host): SmolLM2-135M Q4_1 (real weights, q8_0 blocks), the 32 tokens here: mean KL
5.0e-3 (prefill) and 5.3e-3 (decode), top-1 0.96 and 1.0, where int16 gives 1.6e-6 (64 tokens:
4.3e-3, p99 2.1e-2, max |dlogit| 1.3, top-1 0.978; matmul.py's note measured 3.6e-3 for llama.cpp's
8-bit activations on the same model). The tiny llama of test_quant_types (one layer of random
weights, llama.cpp's own quantiser; q8_k blocks, q8_0 for q8_0): largest KL 1.7e-3 (q4_k), 3.1e-3
(q6_k), 2.2e-3 (q5_k), 5.9e-4 (q8_0), against int16's 1e-8 to 1e-7. Negative control: the int16
path's KL is orders of magnitude smaller on the same tokens, so the bounds see the 8 bits'
rounding, and the q8 logits differ from the int16 ones.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_quant_types import FTYPES, IDS, QUANTIZE, _write  # noqa: E402

from fuelcli.assembly.forward_paths import logits_by_path  # noqa: E402
from fuelcli.assembly.loader import open_model  # noqa: E402
from fuelcli.errors import InputError  # noqa: E402


def _kl_rows(ref, got):
    def logp(x):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lr, lg = logp(ref), logp(got)
    return (np.exp(lr) * (lr - lg)).sum(-1)


def test_smollm2_q8(smollm2_gguf):
    m = open_model(str(smollm2_gguf))
    ids = m.tokenizer.encode("The quick brown fox jumps over the lazy dog. In 1905, Albert Einstein published "
                             "four papers that changed physics.")[:32]
    ref = logits_by_path(m, ids, "reference")
    int16 = logits_by_path(m, ids, "prefill")
    for path in ("prefill", "decode"):
        got = logits_by_path(m, ids, path, activations="q8")
        kl, kl16 = _kl_rows(ref, got), _kl_rows(ref, int16)
        top1 = (ref.argmax(-1) == got.argmax(-1)).mean()
        print(f"smollm2 q8 {path}: mean KL {kl.mean():.2e} p99 {np.quantile(kl, 0.99):.2e} "
              f"max |d| {np.abs(ref - got).max():.3f} top-1 {top1:.3f}; int16 mean KL {kl16.mean():.2e}")
        assert kl.mean() < 1e-2 and top1 >= 0.9, (path, kl.mean(), top1)
        assert kl.mean() > 100 * kl16.mean()  # negative control: the 8 bits are what the bound sees


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q5_k", "q8_0"])
def test_tiny_k_quants_q8(tmp_path, fmt):
    src, dst = tmp_path / "f32.gguf", tmp_path / f"{fmt}.gguf"
    _write(src)
    r = subprocess.run([sys.executable, "-c", QUANTIZE, str(src), str(dst), str(FTYPES[fmt])],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    m = open_model(str(dst))
    ref = logits_by_path(m, IDS, "reference")
    int16 = logits_by_path(m, IDS, "decode")
    for path in ("decode", "prefill"):
        got = logits_by_path(m, IDS, path, activations="q8")
        kl, kl16 = _kl_rows(ref, got).max(), _kl_rows(ref, int16).max()
        print(f"{fmt} q8 {path}: max KL {kl:.2e} (int16 {kl16:.2e}), max |d| {np.abs(ref - got).max():.3f}")
        assert kl < 1e-2 and kl > 10 * kl16, (fmt, path, kl, kl16)
        assert (ref.argmax(-1) == got.argmax(-1)).mean() >= 0.9  # a random model's near-ties may flip


def test_refused_in_one_line(tmp_path):
    from fuelcli.backends import resolve_activations

    assert resolve_activations(None) == "int16"
    with pytest.raises(InputError, match="unknown activations 'q4'"):
        resolve_activations("q4")
    with pytest.raises(InputError, match="the cuda backend has no 8-bit"):
        resolve_activations("q8", "cuda")


def test_engine_tables(tmp_path):
    """An engine with q8 says so in its backend (bench tables, diff provenance), leaves its kernel
    modules in the on-disk cache (tables.py's child compiles them beside the forward), and its
    logits are the int16 engine's to within 8 bits' rounding but not equal to them."""
    import gguf

    from fuelcli.backends import make_engine
    from fuelcli.backends.cpu import q8_tables
    from fuelcli.backends.cpu.llvm import host_isa
    from test_gguf_model import _tiny_llama

    path = tmp_path / "tiny.gguf"
    _tiny_llama(path, np.random.default_rng(0), qtype=gguf.GGMLQuantizationType.Q8_0)
    m = open_model(str(path))
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int64)
    got = {}
    for act in ("int16", "q8"):
        e = make_engine(m.cfg, m.weights, n_ctx=32, activations=act)
        assert e.backend.endswith(" act q8") == (act == "q8")
        got[act] = e.prefill(tokens, all_logits=True)
    assert q8_tables.cached(make_engine(m.cfg, m.weights, n_ctx=32).codes, host_isa())
    assert not np.array_equal(got["int16"], got["q8"])
    assert _kl_rows(got["int16"], got["q8"]).max() < 5e-2  # measured 1.4e-2: random weights, 16 tokens


@pytest.mark.parametrize("qtype", ["BF16", "Q8_0", "Q2_K"])
def test_moe_experts_q8(tmp_path, qtype):
    """A MoE layer's experts on the q8 tiles that read x by chunks: the pair rows' gathered inputs
    (BF16: rounded to bf16; Q8_0 and Q2_K: their rows' quantisation copied, then packed as bytes;
    Q2_K's tiles also read the 16-element sums, the chunk stride in another slot) and the
    gate's output. The q8 engine's prefill logits are the int16 engine's to within the rounding, and
    its own decode rows' (one-token kernels, no chunks). Negative control: every row's experts
    shifted by one."""
    import gguf

    from fuelcli.backends import make_engine
    from fuelcli.backends.cpu import kernels_prefill_bf16 as bf16
    from fuelcli.backends.cpu import llvm
    from fuelcli.backends.cpu import matmul as M
    from fuelcli.formats import FORMATS
    from test_moe_engine import PROMPT, _shift_experts, write_tiny_qwen3moe

    code = FORMATS[qtype.lower()].code
    if qtype == "BF16" and not bf16.takes(llvm.host_isa(), code):
        pytest.skip("CPU lacks avx512vnni with avx512bf16")
    dims = {"hidden": 256, "head_dim": 64, "expert_ff": 256} if qtype == "Q2_K" else {}  # rows of 256
    m = open_model(str(write_tiny_qwen3moe(tmp_path / "moe.gguf", getattr(gguf.GGMLQuantizationType, qtype), **dims)))
    e16 = make_engine(m.cfg, m.weights, n_ctx=64)
    e8 = make_engine(m.cfg, m.weights, n_ctx=64, activations="q8")
    if e8.kern[code, M.K_CHUNKS] == 0:
        pytest.skip("no q8 tiles that read chunks on this CPU")
    ref = e16.prefill(PROMPT, all_logits=True)
    got = e8.prefill(PROMPT, all_logits=True)
    e8.reset()
    dec = np.stack([e8.decode(t) for t in PROMPT])
    kl, kl_dec = _kl_rows(ref, got).max(), _kl_rows(dec, got).max()
    _shift_experts(e8)
    e8.reset()
    shifted = _kl_rows(dec, e8.prefill(PROMPT, all_logits=True)).max()
    print(f"{qtype}: q8 prefill against int16 prefill, max KL {kl:.2e}; against q8 decode {kl_dec:.2e}; "
          f"experts shifted {shifted:.2e}")
    # measured (random weights, 30 tokens): BF16 2.5e-3 and 2.5e-3 (the decode kernels read x
    # unrounded); Q8_0 5.2e-2 (8-bit activations) and 2.7e-13 (the same integers both ways); Q2_K
    # 1.9 (one scale per 256 activations: a few near-tie rows move far from int16's, the mean KL
    # 9.5e-2) and 1.0e-3, as before its tiles read chunks (the two paths' float sums upstream differ in
    # the last bits, and a value on an 8-bit rounding boundary flips: Q4_K's dense tiny model shows
    # 1.4e-4 so, its tiles and decode kernels agreeing to 1.5e-8 of the products' size)
    tol, tol_dec = {"BF16": (5e-3, 5e-3), "Q8_0": (1e-1, 1e-9), "Q2_K": (4.0, 5e-3)}[qtype]
    assert not np.array_equal(ref, got) and kl < tol and kl_dec < tol_dec
    assert shifted > 10 * tol_dec and shifted > min(10 * tol, 1.0)  # the control is against the decode rows
