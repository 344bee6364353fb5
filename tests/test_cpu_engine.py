"""The CPU engine end to end on every instruction set this machine runs, its compile-on-demand
kernels and its on-disk caches (kernel-level checks are in test_formats.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from fuelcli.backends.cpu import amx, llvm
from fuelcli.assembly import reference
from fuelcli.assembly.loader import open_model

sys.path.insert(0, str(Path(__file__).parent))
from test_gguf_model import _tiny_llama  # noqa: E402

Q = gguf.GGMLQuantizationType
ISAS = [pytest.param(n, marks=pytest.mark.skipif(not llvm.supported(n), reason=f"CPU lacks {n}")) for n in llvm.ISAS]
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7]


@pytest.fixture(scope="module", params=[Q.Q8_0, Q.Q4_0, Q.F32])
def tiny_gguf(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("engine") / f"tiny-{request.param.name}.gguf"
    _tiny_llama(path, np.random.default_rng(0), qtype=request.param)
    return path


def _kl(ref, got):
    def logp(x):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lr, lg = logp(ref), logp(got)
    return (np.exp(lr) * (lr - lg)).sum(-1).max()


def _engine_logits(model, path):
    from fuelcli.backends.cpu.engine import CpuEngine

    e = CpuEngine(model.cfg, model.weights, len(TOKENS))
    if path.startswith("prefill"):
        return e, e.prefill(TOKENS, all_logits=True)
    return e, np.stack([e.decode(t) for t in TOKENS])


# measured on these random-weight models (sharp: logits up to ~28): largest KL over positions 1.0e-5
# (q8_0) and 4.8e-6 (q4_0) with int16 activations, prefill and decode alike on every ISA (main's
# int16 decode gave the same: 1.0e-5, 4.4e-6); f32 weights 1e-10
KL_TOL = {"Q8_0": 1e-4, "Q4_0": 1e-4, "F32": 1e-8}


@pytest.mark.parametrize("path", ["prefill", "prefill-vector", "decode"])
@pytest.mark.parametrize("isa", ISAS)
def test_engine_matches_reference_on_every_isa(tiny_gguf, isa, path, monkeypatch):
    """FUEL_ISA picks the kernels; the numba forward is the same for all of them. Where the CPU has
    AMX, "prefill" runs on its tiles (amx.py) and "prefill-vector" on the ISA's vector kernels."""
    monkeypatch.setenv("FUEL_ISA", isa)
    monkeypatch.setenv("FUEL_AMX", "0" if path == "prefill-vector" else "")
    model = open_model(str(tiny_gguf))
    ref = reference.forward(model.cfg, model.weights, TOKENS)
    e, got = _engine_logits(model, path)
    kl, tol = _kl(ref, got), KL_TOL[tiny_gguf.stem.split("-")[1]]
    print(f"{tiny_gguf.name} {isa} {path}: max KL {kl:.2e}, max|d| {np.abs(ref - got).max():.2e}")
    assert (ref.argmax(-1) == got.argmax(-1)).all() and kl <= tol
    # negative control: the same comparison fails when the kernels misread (f32 rows through the
    # f16 kernels) or get no activations (block formats: the int16 quantisation and the AMX split
    # switched off)
    from fuelcli.backends.cpu import forward as F
    from fuelcli.backends.cpu.matmul import C_SPLIT, K_DECODE, K_PREFILL, K_UNPACK, kernel_table
    from fuelcli.formats import FORMATS

    code = int(e.mats[0, 3])
    if code == FORMATS["f32"].code:
        f16 = FORMATS["f16"].code
        cols = [K_DECODE, K_PREFILL, K_UNPACK]
        e.kern[code, cols] = kernel_table([f16], llvm.host_isa())[f16, cols]
    else:
        e.dims[F.D_QUANT] = e.core[C_SPLIT] = 0
        e.act.qx.xq[:] = 0
        e.act.qx.xp[:] = 0
    e.reset()
    bad = e.prefill(TOKENS, all_logits=True) if path == "prefill" else np.stack([e.decode(t) for t in TOKENS])
    assert not np.isfinite(bad).all() or _kl(ref, bad) > 100 * tol


# measured, f16 cache against f32 on these sharp models (decode, every position's KL, the largest):
# 3.8e-5 (q8_0), 1.7e-4 (q4_0), 3.0e-4 (f32 weights); its prefill against its decode 1e-8 and less
KL_F16_CACHE = 1e-3


def test_f16_kv_cache(tiny_gguf):
    """--cache-type f16: half the cache's bytes; decode and prefill over it agree as on the f32
    cache (KL_TOL), and with the f32 cache's logits within KL_F16_CACHE but not bit for bit: the
    values are rounded (the control that the f16 kernels run at all)."""
    from fuelcli.backends.cpu.engine import CpuEngine

    model = open_model(str(tiny_gguf))
    e32, e16 = (CpuEngine(model.cfg, model.weights, len(TOKENS), cache_type=c) for c in ("f32", "f16"))
    assert e16.kv_bytes * 2 == e32.kv_bytes and e16.backend.endswith("kv f16")
    d32, d16 = (np.stack([e.decode(t) for t in TOKENS]) for e in (e32, e16))
    e16.reset()
    p16 = e16.prefill(TOKENS, all_logits=True)
    assert _kl(d16, p16) <= KL_TOL[tiny_gguf.stem.split("-")[1]]
    assert not np.array_equal(d16, d32) and _kl(d32, d16) <= KL_F16_CACHE
    assert (d16.argmax(-1) == d32.argmax(-1)).mean() >= 0.9


@pytest.mark.skipif(not amx.available(llvm.host_isa()), reason="no AMX (or FUEL_AMX=0) here")
def test_amx_prefill_matches_reference(tiny_gguf):
    """A prompt of AMX_MIN_TOKENS tokens or more: block formats on the tiles, within the same KL of
    the reference as the vector path; negative control: the planes not prepared (the split off)."""
    from fuelcli.backends.cpu.amx import AMX_MIN_TOKENS
    from fuelcli.backends.cpu.engine import CpuEngine
    from fuelcli.backends.cpu.matmul import C_SPLIT

    model = open_model(str(tiny_gguf))
    tokens = (TOKENS * 3)[:AMX_MIN_TOKENS + 10]
    ref = reference.forward(model.cfg, model.weights, tokens)
    e = CpuEngine(model.cfg, model.weights, len(tokens))
    got = e.prefill(tokens, all_logits=True)
    kl, tol = _kl(ref, got), KL_TOL[tiny_gguf.stem.split("-")[1]]
    print(f"{tiny_gguf.name} AMX prefill of {len(tokens)}: max KL {kl:.2e}")
    assert (ref.argmax(-1) == got.argmax(-1)).all() and kl <= tol
    if e.core[C_SPLIT] == 0:  # f32 weights: no block format, no tiles
        return
    e.core[C_SPLIT] = 0
    e.reset()
    bad = e.prefill(tokens, all_logits=True)
    assert not np.isfinite(bad).all() or _kl(ref, bad) > 100 * tol


def test_only_the_formats_a_model_uses_are_compiled(tiny_gguf, tmp_path, monkeypatch):
    """A fresh cache after one engine holds the kernels of the model's formats and no others."""
    from fuelcli.backends.cpu import kernels

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    model = open_model(str(tiny_gguf))
    codes = {t.format.code for t in model.weights.tensors()}
    code = f"""
from fuelcli.assembly.loader import open_model
from fuelcli.backends.cpu.engine import CpuEngine
m = open_model({str(tiny_gguf)!r})
CpuEngine(m.cfg, m.weights, 8).kern
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    isa = llvm.host_isa()
    use_amx = amx.available(isa)
    assert kernels.cached(codes, isa, use_amx)
    others = {0, 1, 3, 4, 7, 8} - codes
    assert not any(kernels.cached([c], isa, use_amx) for c in others)


def test_cached_forward_in_a_fresh_process(tmp_path):
    """The second process loads the forward and the kernels from the cache: same logits, and no
    compile (a cached forward once jumped to address 0: numba's thread pool was not started)."""
    path = tmp_path / "tiny.gguf"
    _tiny_llama(path, np.random.default_rng(1), qtype=Q.Q8_0)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    outs = []
    for i in range(2):
        out = tmp_path / f"l{i}.npy"
        r = subprocess.run([sys.executable, "-m", "fuelcli", "logits", str(path), "--tokens", "1,2,3,4",
                            "--path", "decode", "--out", str(out)], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(np.load(out))
    assert np.array_equal(outs[0], outs[1])
    from fuelcli.backends.cpu import jit

    assert jit.SOURCE_DIGEST  # the cache keys cover the backend sources (jit.py, llvm.py)


# Warms an engine up in a fresh process with numba's refresh of its CPU target spied on, then
# saves its prefill logits; argv: model, out.npy, "fast" (as engines start: with an empty cache the
# forward compiles in a child, jit.compile_elsewhere) or "compile" (the control: numba's own
# Dispatcher.compile in this process, which refreshes the target before its cache load).
WARM_DRIVER = r"""
import json, sys
import numpy as np
import numba.core.base as base
from fuelcli.backends.cpu import engine as E, jit
from fuelcli.assembly.loader import open_model

refreshes = []
refresh = base.BaseContext.refresh
base.BaseContext.refresh = lambda self: (refreshes.append(1), refresh(self))[1]
if sys.argv[3] == "compile":
    E.load_cached = E.compile_elsewhere = lambda f, sig: False
m = open_model(sys.argv[1])
e = E.CpuEngine(m.cfg, m.weights, 8)
e.warm_up()
print(json.dumps({"refreshed": len(refreshes)}))
np.save(sys.argv[2], e.prefill([1, 2, 3, 4], all_logits=True))
"""


def test_warm_up_loads_the_cached_forward_without_refreshing_numba(tmp_path):
    """A warm start loads the forward from numba's cache without numba's target refresh (every
    registry imported and installed: ~0.1 s), and it computes the same logits as one loaded by
    numba's own path; the control shows the spy sees that path's refresh. A cold start (an empty
    cache) does not compile here either: a child compiles the forward into the cache (issue 47: a
    compile's memory stays with its process) and this process loads it, to the same logits."""
    path = tmp_path / "tiny.gguf"
    _tiny_llama(path, np.random.default_rng(2), qtype=Q.Q4_0)
    seen = {}
    # the first run fills cache "a"; "cold" starts from an empty cache of its own
    for mode, cache in (("compile", "a"), ("fast", "a"), ("cold", "b")):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / cache))
        r = subprocess.run([sys.executable, "-c", WARM_DRIVER, str(path), str(tmp_path / f"{mode}.npy"), mode],
                           check=False, capture_output=True, text=True, env=env, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        seen[mode] = json.loads(r.stdout.strip().splitlines()[-1])["refreshed"]
    assert seen["compile"] > 0 and seen["fast"] == 0 and seen["cold"] == 0
    for mode in ("fast", "cold"):
        assert np.array_equal(np.load(tmp_path / f"{mode}.npy"), np.load(tmp_path / "compile.npy"))


def test_cpu_backend_skips_numbas_blas_probe_and_numba_still_finds_blas():
    """Loading the CPU backend does not import scipy.linalg (numba's BLAS probe: 0.2 s of a warm
    start); np.dot compiled afterwards still finds BLAS, and np.correlate (the one user of the probe's
    answer) still computes right with its loop."""
    pytest.importorskip("scipy")
    code = ("import sys, numpy as np\n"
            "import fuelcli.backends.cpu.forward\n"
            "assert 'numba.np.arraymath' in sys.modules and 'scipy.linalg' not in sys.modules\n"
            "from numba import njit\n"
            "dot, corr = njit(lambda a, b: np.dot(a, b)), njit(lambda a, b: np.correlate(a, b, 'full'))\n"
            "a, b = np.arange(1.0, 6.0), np.array([2.0, -1.0, 0.5])\n"
            "assert dot(a, a) == np.dot(a, a) and np.allclose(corr(a, b), np.correlate(a, b, 'full'))\n"
            "assert 'scipy.linalg' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


def test_kernels_compile_in_a_child_beside_the_forward(tmp_path, monkeypatch):
    """Nothing cached: the kernel modules compile in a child process (tables.py) while this one
    would compile the forward; its modules land in the cache and the tables load from there. With
    everything cached there is no child."""
    from fuelcli.backends.cpu import kernels
    from fuelcli.backends.cpu.kernels import is_quant
    from fuelcli.backends.cpu.tables import KernelTables

    from fuelcli.backends.cpu import core as core_kernels

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    isa, codes = llvm.host_isa(), [8, 2]  # q8_0, q4_0
    use_amx = amx.available(isa) and any(is_quant(c) for c in codes)
    assert not kernels.cached(codes, isa, use_amx)
    tables = KernelTables(codes, isa, 64, use_amx, "f32", background=True)
    child = tables._child
    assert child is not None and child.wait(timeout=600) == 0
    assert kernels.cached(codes, isa, use_amx)  # the child's work: this process compiled nothing
    try:
        kern, core = tables.get()
        assert (kern[codes, :4] != 0).all() and (core != 0).sum() >= 7
        assert KernelTables(codes, isa, 64, use_amx, "f32", background=True)._child is None
    finally:  # this process now holds modules loaded from tmp_path: later tests in it must load their own
        # from the worker's cache, where kernels_cached() looks (else `fuel run` there says "compiling")
        kernels._compiled.cache_clear()
        core_kernels.addresses.cache_clear()
