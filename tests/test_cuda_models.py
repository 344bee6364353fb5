"""The CUDA engine on tiny random checkpoints of the families it runs, prefill then decode through the
device KV cache, against transformers' eager f32 logits and the CPU engine; each case with a
negative control that breaks one semantic (window direction or presence, routing, QK-norm, llama3
RoPE bands, YaRN's attention factor, LongRoPE's long factors, the GGUF rope_freqs tensor) and must
fail the same comparison. Beyond the first families: Mistral's windows, Mixtral's routing, YaRN,
Phi-3 (fused qkv and gate_up, LongRoPE) and a Llama-3.1 GGUF written by llama.cpp's converter
(rope_freqs), which make_engine lets through on cuda (none is in block.features). On the simulator
here and in CI; on a GPU under NUMBA_ENABLE_CUDASIM=0 (examples/gpu-check.sh).

Tolerance: max|Δ| over all positions and the vocabulary <= the CPU oracle test's tol(case) (1e-4; 2e-4
for llama31, where transformers' own f32 logits are 7.2e-5 from its float64 ones). Measured on the
simulator, against transformers / the CPU engine: qwen2_yarn 3.2e-5 / 3.8e-5 (the largest), mixtral
2.4e-5 / 1.6e-5, llama31 and its GGUF 2.3e-5 / 2.3e-5, phi3_longrope 1.7e-5 / 1.2e-5, the Qwen cases
0.8e-5..1.3e-5 / 0.6e-5..1.4e-5, mistral 5.3e-6 / 8.1e-6. The broken variants miss by 0.33 (dense
routing) to 11 (unscaled RoPE).
"""

import cuda_sim  # noqa: I001  (first: sets up the simulator before numba.cuda is imported)

import dataclasses
import subprocess

import numpy as np
import pytest
from hf_oracle import hf_logits
from test_decoder_oracle import BREAKS, tol

from fuelcli.backends import make_engine
from fuelcli.assembly.loader import open_model

cuda_sim.speed_up()
pytestmark = cuda_sim.needs_numba_cuda

PREFILL, DECODE = 5, 2  # 7 positions: past the window of 4; the simulator costs ~1 s per token-layer
# phi3_longrope's original context is 16: 17 positions, so that the engine's table (n_ctx 17) and
# transformers (17 tokens) both take the long factors
PREFILL_OF = {"phi3_longrope": 15}

CASES = {
    # case: (write_tiny kwargs, negative control)
    "qwen2_window": ({}, "window direction inverted"),
    "qwen3_bias_headdim": ({}, "QK-norm skipped"),
    "qwen3_moe_norm_false": ({}, "dense routing over all experts"),
    "qwen3_moe_norm_true": ({"legacy_moe_key": True}, "renorm flipped"),
    "llama31": ({"legacy_rope": True}, "unscaled RoPE"),
    "mistral": ({}, "window dropped"),
    "mixtral": ({}, "renorm flipped"),
    "qwen2_yarn": ({}, "YaRN attention factor dropped"),
    "phi3_longrope": ({}, "LongRoPE's short factors past the original context"),
    # llama31 through llama.cpp's converter: the llama3 factors as a rope_freqs tensor; against
    # transformers on the source directory
    "llama31_gguf": ({"legacy_rope": True}, "unscaled RoPE"),
}


def limit(case):
    return tol(case.removesuffix("_gguf"))


def run(model, ids, device, prefill, hidden=False):
    """Logits [len(ids), V] of a `prefill`-token prefill then one decode per remaining token."""
    engine = make_engine(model.cfg, model.weights, n_ctx=len(ids), device=device)
    out = engine.prefill(ids[:prefill], all_logits=True, hidden=hidden)
    rows, states = ([out[0]], [out[1]]) if hidden else ([out], [])
    for t in ids[prefill:]:
        o = engine.decode(t, hidden=hidden)
        rows.append((o[0] if hidden else o)[None])
        if hidden:
            states.append(o[1])
    logits = np.concatenate(rows)
    return (logits, np.concatenate(states, axis=1), engine) if hidden else logits


def _gguf(request, source, out):
    """source converted by llama.cpp's converter into out (skipped where the converter cannot be had:
    its sdist comes from PyPI, which the GPU machines do not reach)."""
    from llama_convert import convert

    try:
        converter = request.getfixturevalue("llama_converter")
    except subprocess.CalledProcessError:
        pytest.skip("llama.cpp's converter is unavailable (the llama-cpp-python sdist could not be downloaded)")
    convert(converter, [(source, out)])
    model = open_model(str(out))
    assert model.cfg.rope.type == "factors"  # the llama3 bands read from the rope_freqs tensor
    return model


@pytest.fixture(scope="module")
def case_data(tiny, request, tmp_path_factory):
    cache = {}

    def get(case):
        """(model, token ids, transformers' logits, prefill length)"""
        if case not in cache:
            d = tiny(case.removesuffix("_gguf"), **CASES[case][0])
            if case.endswith("_gguf"):
                model = _gguf(request, d, tmp_path_factory.mktemp("gguf") / f"{case}.gguf")
            else:
                model = open_model(str(d))
            prefill = PREFILL_OF.get(case, PREFILL)
            ids = np.random.default_rng(0).integers(0, model.cfg.vocab_size, prefill + DECODE).tolist()
            cache[case] = (model, ids, hf_logits(d, ids), prefill)
        return cache[case]

    return get


@pytest.mark.parametrize("case", list(CASES))
def test_cuda_engine_matches_transformers_and_cpu(case_data, case):
    model, ids, ref, prefill = case_data(case)
    logits, states, engine = run(model, ids, "cuda", prefill, hidden=True)
    cpu_logits, cpu_states, _ = run(model, ids, "cpu", prefill, hidden=True)
    d_hf, d_cpu = float(np.abs(logits - ref).max()), float(np.abs(logits - cpu_logits).max())
    print(f"{case}: max|Δ| vs transformers {d_hf:.2e}, vs cpu {d_cpu:.2e}")
    assert d_hf <= limit(case) and d_cpu <= limit(case)
    scale = np.abs(cpu_states).max(axis=(1, 2), keepdims=True)
    assert np.all(np.abs(states - cpu_states) <= 1e-5 * scale)  # the residual stream after every layer
    assert engine.pos == len(ids) and engine.kv_bytes == 2 * 4 * model.cfg.num_layers * len(ids) * model.cfg.kv_dim


@pytest.mark.parametrize("case", list(CASES))
def test_negative_control_fails(case_data, case):
    model, ids, ref, prefill = case_data(case)
    edit_cfg, edit_weights = BREAKS[CASES[case][1]]
    engine = make_engine(edit_cfg(model.cfg), (edit_weights or (lambda w: w))(model.weights), len(ids), "cuda")
    miss = float(np.abs(engine.prefill(ids[:prefill], all_logits=True) - ref[:prefill]).max())
    print(f"{case}, {CASES[case][1]}: max|Δ| {miss:.2e}")
    assert miss > 100 * limit(case)


TOL = tol("llama31")  # the case of the tests below


def test_greedy_id_and_cache_reuse(case_data):
    """decode_argmax returns argmax of the logits; reset and rewind reuse the device cache."""
    model, ids, ref, _ = case_data("llama31")
    engine = make_engine(model.cfg, model.weights, n_ctx=len(ids), device="cuda")
    engine.prefill(ids[:3])
    assert engine.decode_argmax(ids[3]) == int(np.argmax(ref[3]))
    engine.rewind(2)
    last = engine.prefill(ids[2:4])[0]  # a prefill over the cached prefix, the stale entry overwritten
    assert np.abs(last - ref[3]).max() <= TOL
    engine.reset()
    assert np.abs(engine.prefill(ids[:2], all_logits=True) - ref[:2]).max() <= TOL


def test_mixed_formats_in_one_layer(case_data):
    """q, k, v (and gate / up) in different formats, as in Q4_K_M files: the decode step launches one
    product per run of equal formats and one swiglu per (gate, up) pair. Against fuel's numpy
    reference on the same weights (f32 activations, as the CUDA kernels; the CPU engine's int16
    activations differ by ~2e-3 here). Negative control: v's bytes read as another format miss."""
    from fuelcli.formats import dequantize, quantize
    from fuelcli.assembly import reference
    from fuelcli.weights.tensor import Tensor

    model, ids, _, _ = case_data("llama31")

    def as_fmt(t, fmt):
        return Tensor(t.name, fmt, t.shape, quantize(fmt, dequantize(t)))

    layers = [dataclasses.replace(layer, q=as_fmt(layer.q, "q8_0"), k=as_fmt(layer.k, "f16"),
                                  v=as_fmt(layer.v, "q8_0"), up=as_fmt(layer.up, "q5_0"))
              for layer in model.weights.layers]
    weights = dataclasses.replace(model.weights, layers=layers)

    def logits(w):
        engine = make_engine(model.cfg, w, n_ctx=len(ids), device="cuda")
        rows = [engine.prefill(ids[:2], all_logits=True)]
        rows += [engine.decode(t)[None] for t in ids[2:]]
        return np.concatenate(rows)

    want = reference.forward(model.cfg, weights, ids)
    got = logits(weights)
    print(f"mixed formats: max|Δ| vs the reference {np.abs(got - want).max():.2e}")
    assert np.abs(got - want).max() <= TOL

    def misread(t):  # the first bytes of each q8_0 row taken as a q4_1 row
        return Tensor(t.name, "q4_1", t.shape, np.ascontiguousarray(t.data[:, : 20 * (t.shape[1] // 32)]))

    broken = [dataclasses.replace(layer, v=misread(layer.v)) for layer in layers]
    assert not np.allclose(logits(dataclasses.replace(weights, layers=broken)), want, rtol=0, atol=100 * TOL)
