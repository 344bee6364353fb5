"""Qwen3.5 GGUFs store ssm_out's columns with the value heads tiled (llama.cpp's converter); a head is
v_head_dim columns, 128 in the real models, and a K-quant block 256: the heads cannot move as whole
blocks. The weight then stays in its format and its input is gathered into the stored column order
(weights/build._input_order, Tensor.columns; the CPU forward's gather_columns), where the loader
had widened the weight to f32.
"""

import numpy as np
import pytest
from test_qwen3_5_files import files  # noqa: F401 (the fixture)

from fuelcli.assembly import reference
from fuelcli.assembly.forward_paths import logits_by_path
from fuelcli.assembly.loader import open_model
from fuelcli.backends.cpu import forward as F
from fuelcli.backends.cpu.engine import CpuEngine
from fuelcli.families.schema import Regroup
from fuelcli.formats import dequantize
from fuelcli.weights import build
from fuelcli.weights.tensor import Tensor


def _q4_k(rows: int, cols: int) -> Tensor:
    """Random Q4_K rows with small finite scales (d, dmin: the block's first two f16)."""
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
    blocks[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[..., 2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    data = blocks.reshape(rows, -1)
    data.flags.writeable = False
    return Tensor("ssm_out", "q4_k", (rows, cols), data)


def test_k_quant_columns_stay_quantised():
    """4 heads of 128 over 512 columns, tiled from 2 key heads: the product is the widened
    matrix's, the weight keeps its 4.5 bits a value."""
    t = _q4_k(64, 512)
    r = Regroup(unit=lambda c: 128, order=lambda c: [0, 2, 1, 3], axis=1)
    kept, widened = build._undo(t, r, None), build._regroup(t, r, None)
    assert kept.fmt == "q4_k" and kept.data is t.data and widened.fmt == "f32"
    assert kept.nbytes * 7 < widened.nbytes  # 144 bytes a 256 against 1024
    x = np.random.default_rng(6).standard_normal((3, 512)).astype(np.float32)
    want = x @ dequantize(widened).T
    assert np.abs(reference.linear(x, kept) - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(x @ dequantize(kept).T - want).max() > 1e-2  # the order matters


def _input_moved(monkeypatch):
    """Every column regroup of the file undone on the input, as a K-quant ssm_out's is (the tiny
    files are f32, whose columns would move as bytes)."""
    monkeypatch.setattr(build, "_splits_blocks", lambda value, r, cfg: isinstance(value, Tensor) and r.axis == 1)


def test_the_engine_gathers_the_input(files, monkeypatch):  # noqa: F811
    _, gguf, ids, ref = files("qwen3_5")
    regrouped = {}
    for path in ("reference", "prefill", "decode"):
        regrouped[path] = logits_by_path(open_model(str(gguf)), ids, path)
    with monkeypatch.context() as m:
        _input_moved(m)
        model = open_model(str(gguf))
        assert all(layer.lin_out.columns is not None for layer in model.weights.layers if layer.lin_out is not None)
        for path in ("reference", "prefill", "decode"):
            got = logits_by_path(model, ids, path)
            assert np.abs(got - regrouped[path]).max() <= 5e-6 * np.abs(regrouped[path]).max(), path  # sums' order
        e = CpuEngine(model.cfg, model.weights, n_ctx=128)
        assert e.lay[:3, F.L_LOUT_ORDER].all()
        e.lay[:, F.L_LOUT_ORDER] = 0  # control: the weight in its stored order, the input not moved
        assert np.abs(e.prefill(ids)[0] - ref[-1]).max() > 1e-2


@pytest.mark.parametrize("fmt", ["q8_0"])
def test_block_aligned_columns_still_move_as_bytes(fmt):
    """Heads of whole blocks keep moving the weight's bytes (no gather)."""
    a = np.random.default_rng(3).standard_normal((8, 128)).astype(np.float32)
    from fuelcli.formats import quantize

    t = Tensor("w", fmt, a.shape, quantize(fmt, a))
    got = build._undo(t, Regroup(unit=lambda c: 32, order=lambda c: [1, 0, 3, 2], axis=1), None)
    assert got.columns is None and got.fmt == fmt
