"""BF16 weights' prefill tiles with `--activations q8` on AVX512_BF16 (kernels_prefill_bf16.py): the
activations rounded to bf16 (to nearest even), each pair of products added to the f32 sums the way
vdpbf16ps adds them, against a numpy transcription of that arithmetic."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_CACHE_DIR", f"/tmp/numba_cache_fuel_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from numba import njit  # noqa: E402
from test_formats import matmul, random_rows  # noqa: E402

from fuelcli.backends.cpu import kernels_prefill_bf16 as bf16  # noqa: E402
from fuelcli.backends.cpu import llvm  # noqa: E402
from fuelcli.backends.cpu import matmul as M  # noqa: E402
from fuelcli.backends.cpu import q8_tables  # noqa: E402
from fuelcli.backends.cpu.activations import quantized  # noqa: E402
from fuelcli.backends.cpu.kernels_prefill import KC, TASK_ROWS  # noqa: E402
from fuelcli.formats import FORMATS  # noqa: E402

BF16 = FORMATS["bf16"].code
HOST = llvm.host_isa()
needs_bf16 = pytest.mark.skipif(not bf16.takes(HOST, BF16), reason="CPU lacks avx512vnni with avx512bf16")


def _round_bf16(x):
    """f32 -> bf16 (as f32), to nearest even (finite x): ggml's GGML_FP32_TO_BF16."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)).view(np.float32)


def _pair_sums(x, w):
    """[T, n] f32: for each pair of k in order, sum += x[2p+1] w[2p+1], then += x[2p] w[2p], each add
    rounded to f32 (a product of two bf16 is exact in f32)."""
    T, K = x.shape
    if K % 2:
        x, w = np.pad(x, ((0, 0), (0, 1))), np.pad(w, ((0, 0), (0, 1)))
    acc = np.zeros((T, w.shape[0]), np.float32)
    for k in range(0, x.shape[1], 2):
        for j in (k + 1, k):
            acc += x[:, j, None] * w[None, :, j]
    return acc


def _tables(codes):
    kern, core = M.kernel_table(codes, HOST), M.core_table(HOST, 64)
    k8, c8 = kern.copy(), core.copy()
    q8_tables.apply(k8, c8, codes, HOST)
    return kern, k8, c8


@njit(cache=True)
def _round_rows(x, qx, core):
    M.round_rows(x, qx, core)


def _run(x, raw, kern, core=None):
    """The product on the tiles of `kern`; with core, x rounded to its bf16 chunks first (as
    forward.prepare does), in a buffer of more rows than x (a chunk stride that is not T's)."""
    T, n = x.shape[0], raw.shape[0]
    out = np.full((T, n), np.nan, np.float32)
    qx = quantized(T + 3, x.shape[1])
    if core is not None:
        _round_rows(x, qx, core)
    matmul(x, qx, raw.ctypes.data, n, raw.shape[1], BF16, kern, out)
    return out


@needs_bf16
def test_takes_only_q8_bf16():
    """q8 puts the tiles in BF16's prefill columns only; the int16 table keeps the f32 tiles."""
    codes = [BF16, FORMATS["f16"].code, FORMATS["f32"].code, FORMATS["q8_0"].code]
    kern, k8, c8 = _tables(codes)
    cols = [M.K_PREFILL, M.K_UNPACK, M.K_CHUNKS]
    assert (k8[BF16, cols] != kern[BF16, cols]).all() and c8[M.C_ROUND_BF16] != 0
    for c in codes[1:3]:
        assert (k8[c, cols] == kern[c, cols]).all()
    assert not bf16.takes(llvm.ISAS["avx2"], BF16) and not bf16.takes(HOST, FORMATS["f16"].code)


@needs_bf16
@pytest.mark.parametrize("ncols", [2 * KC + 64, 2 * KC + 37])
def test_bf16_tiles_exact(ncols):
    """Every token-tile remainder (TILE tokens, then single ones), a partial last task and group of
    rows, several chunks of k and a partial one (odd: a pair's second element past K), against the
    numpy pair sums of the bf16-rounded x: bit for bit (measured: every sum equal, no tolerance
    needed). Negative controls: the unrounded x with the same sums misses by ~1000x the f32
    rounding, and the f32 tiles' result (the int16 table) is not equal either."""
    nrows = TASK_ROWS + 21
    raw = np.ascontiguousarray(random_rows("bf16", nrows, ncols, seed=ncols))
    w = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    kern, k8, c8 = _tables([BF16])
    rng = np.random.default_rng(4)
    for T in (1 + bf16.TILE[0], 13, 30):
        x = rng.standard_normal((T, ncols)).astype(np.float32)
        x[1, 40] = 200.0
        got = _run(x, raw, k8, c8)
        want = _pair_sums(_round_bf16(x), w)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (ncols, T, np.abs(got - want).max())
        mag = np.abs(x) @ np.abs(w).T
        unrounded = _pair_sums(x, w)
        # measured 1.3e-4 of the largest sum of |x w| (bf16's 2^-9 an element, in random directions);
        # f32 rounding alone stays near 1e-7
        assert np.abs(unrounded - got).max() > 2e-5 * mag.max(), (ncols, T)
        assert not np.array_equal(_run(x, raw, kern), got)


@needs_bf16
def test_bf16_tiles_non_finite():
    """An inf or NaN activation makes its token's sums non-finite (it is not rounded away), the other
    tokens' stay finite."""
    ncols, nrows = 300, 40
    raw = np.ascontiguousarray(random_rows("bf16", nrows, ncols, seed=1))
    _, k8, c8 = _tables([BF16])
    x = np.random.default_rng(2).standard_normal((9, ncols)).astype(np.float32)
    x[2, 7], x[5, 299] = np.inf, np.nan
    got = _run(x, raw, k8, c8)
    assert not np.isfinite(got[[2, 5]]).any() and np.isfinite(np.delete(got, [2, 5], 0)).all()


@needs_bf16
def test_engine_bf16_q8(tmp_path):
    """A BF16 model's q8 engine runs these tiles (its kernel table), leaves their module in the
    on-disk cache, and its prefill logits are the int16 engine's to within the activations' bf16
    rounding, not equal to them (the int16 engine keeps the f32 tiles)."""
    import gguf

    from fuelcli.assembly.loader import open_model
    from fuelcli.backends import make_engine
    from fuelcli.backends.cpu.kernels import q8_bf16_addresses
    from test_gguf_model import _tiny_llama
    from test_q8_model import _kl_rows

    path = tmp_path / "tiny.gguf"
    _tiny_llama(path, np.random.default_rng(0), qtype=gguf.GGMLQuantizationType.BF16)
    m = open_model(str(path))
    tokens = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int64)
    got, tiles = {}, {}
    for act in ("int16", "q8"):
        e = make_engine(m.cfg, m.weights, n_ctx=32, activations=act)
        got[act] = e.prefill(tokens, all_logits=True)
        tiles[act] = e.kern[BF16, M.K_PREFILL]
    assert tiles["q8"] == q8_bf16_addresses(HOST)[0] != tiles["int16"]
    assert q8_tables.cached(e.codes, HOST)
    assert not np.array_equal(got["int16"], got["q8"])
    assert _kl_rows(got["int16"], got["q8"]).max() < 5e-2  # measured 2.0e-2: random weights, 8 tokens


