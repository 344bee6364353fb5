"""Non-finite values: the engine never dies on them, and every path (reference, prefill, decode;
`run`'s generation, `logits`, `diff`) stops with NonFinite (exit 2) naming the position, the
first layer whose output went non-finite and, where there is one, the weight holding NaN or inf."""

from __future__ import annotations

import numpy as np
import pytest

from fuelcli.errors import NonFinite
from fuelcli.assembly.forward_paths import logits_by_path
from fuelcli.assembly.loader import open_model

import malformed as M

PATHS = ["reference", "prefill", "decode"]


def _model(tmp_path, change, dtype="F32"):
    tensors = M.hf_tensors()
    change(tensors)
    return open_model(str(M.write_hf_dir(tmp_path / "m", tensors, dtype=dtype)))


def _one_line(e) -> str:
    assert "\n" not in str(e)
    return str(e)


@pytest.mark.parametrize("path", PATHS)
def test_the_unbroken_model_is_finite_on_every_path(tmp_path, path):
    """Positive control: the same tiny model without a bad weight passes every check."""
    assert np.isfinite(logits_by_path(_model(tmp_path, lambda t: None), [1, 2, 3], path)).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["F32", "F16"])  # f16 rows are widened by their own kernel code
def test_a_bad_weight_is_named_on_every_path(tmp_path, path, value, dtype):
    def change(t):
        t["model.layers.0.self_attn.q_proj.weight"][3, 5] = value

    with pytest.raises(NonFinite) as e:
        logits_by_path(_model(tmp_path, change, dtype), [1, 2, 3], path)
    text = _one_line(e.value)
    assert f"({path} path)" in text and "position 0" in text
    assert "in layer 0 of 1; weight model.layers.0.self_attn.q_proj.weight holds NaN or inf" in text, text


@pytest.mark.parametrize("path", PATHS)
def test_overflow_without_a_bad_weight(tmp_path, path):
    def change(t):  # finite but enormous: q·k overflows float32, softmax turns inf into NaN
        t["model.layers.0.self_attn.q_proj.weight"] *= 1e20
        t["model.layers.0.self_attn.k_proj.weight"] *= 1e20

    with pytest.raises(NonFinite) as e:
        logits_by_path(_model(tmp_path, change), [1, 2], path)
    assert "in layer 0 of 1; no weight there is NaN or inf, so the values overflow float32" in _one_line(e.value)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name, stage", [("lm_head.weight", "after the last layer"),
                                         ("model.norm.weight", "after the last layer"),
                                         ("model.embed_tokens.weight", "in the token embeddings")])
def test_the_stage_outside_the_layers(tmp_path, path, name, stage):
    def change(t):
        t[name][...] = np.nan

    with pytest.raises(NonFinite) as e:
        logits_by_path(_model(tmp_path, change), [1, 2], path)
    text = _one_line(e.value)
    assert stage in text, text
    assert name in text, text


def test_a_token_whose_embedding_is_nan_fails_at_its_position(tmp_path):
    def change(t):
        t["model.embed_tokens.weight"][5] = np.nan

    m = _model(tmp_path, change)
    assert np.isfinite(logits_by_path(m, [1, 2, 3], "decode")).all()  # token 5 not used: fine
    with pytest.raises(NonFinite, match=r"logits at position 2 are NaN \(decode path\): .* in the token embeddings"):
        logits_by_path(m, [1, 2, 5, 3], "decode")


def test_diff_does_not_pass_nan(tmp_path):
    from fuelcli.oracle import diff

    def change(t):
        t["model.layers.0.mlp.up_proj.weight"][0, 0] = np.nan

    with pytest.raises(NonFinite, match="layer 0"):
        diff(_model(tmp_path, change), [1, 2, 3, 4], "self")


def test_saved_oracle_logits_must_be_finite(tmp_path):
    from fuelcli.oracle import diff

    m = _model(tmp_path, lambda t: None)
    bad = np.zeros((3, M.V), np.float32)
    bad[1, 2] = np.nan
    np.save(tmp_path / "o.npy", bad)
    with pytest.raises(Exception) as e:
        diff(m, [1, 2, 3], str(tmp_path / "o.npy"))
    assert "the saved logits at position (row) 1 are NaN or inf" in str(e.value)


def test_generation_stops_at_the_first_non_finite_step(tmp_path):
    """`run`: a decode step whose logits go NaN stops generation with the position."""
    from fuelcli.backends import make_engine
    from fuelcli.text.generate import Sampler, SamplerParams, Stats, generate

    m = _model(tmp_path, lambda t: None)

    class Tok:
        def stream(self, skip_special_tokens=False):
            class S:
                def push(self, t):
                    return "x"

                def flush(self):
                    return ""
            return S()

    engine = make_engine(m.cfg, m.weights, n_ctx=16)
    real, steps = engine.decode, []

    def decode(token, hidden=False):
        steps.append(token)
        out = real(token)
        return out * np.nan if len(steps) == 3 else out

    engine.decode = decode
    out = []
    with pytest.raises(NonFinite, match=r"logits at position 4 are NaN \(decode path\)"):
        for piece in generate(engine, Tok(), [1, 2], 10, Sampler(SamplerParams(temp=0.0)), set(), [], Stats()):
            out.append(piece)
    assert len(out) == 3  # three tokens were streamed before the bad step


@pytest.mark.parametrize("broken", ["blk.0.attn_k.weight", "blk.0.attn_norm.weight"])
def test_nan_in_a_quantised_model(tmp_path, broken):
    """A Q8_0 block with a NaN f16 scale, or a NaN norm weight whose NaN reaches the int16-quantised
    activations of the decode path (max() skips NaN there): the kernels run on, every path names
    the tensor."""
    rng = np.random.default_rng(0)
    H, I, V = 32, 64, 8
    meta = [m for m in M.tiny_gguf_meta() if m[0] not in ("llama.embedding_length", "llama.feed_forward_length")]
    meta += [("llama.embedding_length", M.U32, H), ("llama.feed_forward_length", M.U32, I)]
    shapes = {"token_embd.weight": (V, H), "output_norm.weight": (H,), "output.weight": (V, H),
              "blk.0.attn_norm.weight": (H,), "blk.0.ffn_norm.weight": (H,), "blk.0.attn_q.weight": (H, H),
              "blk.0.attn_k.weight": (H, H), "blk.0.attn_v.weight": (H, H), "blk.0.attn_output.weight": (H, H),
              "blk.0.ffn_gate.weight": (I, H), "blk.0.ffn_up.weight": (I, H), "blk.0.ffn_down.weight": (H, I)}
    tensors = []
    for name, shape in shapes.items():
        a = (1 + 0.1 * rng.standard_normal(shape) if "norm" in name else 0.3 * rng.standard_normal(shape))
        if len(shape) == 1:
            if name == broken:
                a[5] = np.nan
            tensors.append((name, a.astype(np.float32)))
            continue
        raw = bytearray(M.q8_0(a))
        if name == broken:
            raw[0:2] = np.float16(np.nan).tobytes()  # the first block's scale
        tensors.append((name, a, M.GGML_Q8_0, bytes(raw)))
    p = tmp_path / "q8.gguf"
    p.write_bytes(M.gguf_bytes(meta, tensors)[0])
    m = open_model(str(p))
    for path in PATHS:
        with pytest.raises(NonFinite) as e:
            logits_by_path(m, [1, 2, 3], path)
        assert f"layer 0 of 1; weight {broken} holds NaN or inf" in _one_line(e.value), (path, e.value)


def test_moe_router_nan_does_not_crash_the_engine(tiny, tmp_path):
    """NaN router logits: top-k over NaN must not index out of bounds in the kernel."""
    import shutil

    from safetensors.numpy import load_file, save_file

    d = tmp_path / "moe"
    shutil.copytree(tiny("qwen3_moe_norm_false"), d)
    t = load_file(str(d / "model.safetensors"))
    t["model.layers.1.mlp.gate.weight"][:] = np.nan
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    m = open_model(str(d))
    for path in PATHS:
        with pytest.raises(NonFinite) as e:
            logits_by_path(m, [1, 2, 3, 4], path)
        assert "in layer 1 of 4; weight model.layers.1.mlp.gate.weight holds NaN or inf" in str(e.value), e.value
