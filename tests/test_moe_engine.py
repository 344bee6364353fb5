"""The CPU engine's MoE by expert (backends/cpu/moe.py) on a tiny qwen3moe GGUF: a prefill's rows (each
expert once over the rows that chose it, on the tiles) are its one-token decode rows within the
prefill tolerance of the dense models (test_cpu_engine.KL_TOL); a row of a several-sequence step or
of a verify (the experts' decode kernels over the rows that chose them) is bit for bit the one-token
step's; each with a negative control."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from fuelcli.assembly.loader import open_model
from fuelcli.backends.cpu.activations import pair_rows
from fuelcli.backends.cpu.engine import CpuEngine

sys.path.insert(0, str(Path(__file__).parent))
from test_cpu_engine import KL_TOL, _kl  # noqa: E402

Q = gguf.GGMLQuantizationType
H, L, NH, NKV, D, E, K, I, V = 64, 2, 4, 2, 16, 8, 2, 32, 64
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7]


def _quantize(x, qtype):
    """gguf's quantiser, or ggml's row quantiser (libgguf) for the K-quants gguf lacks."""
    try:
        return gguf.quants.quantize(x, qtype)
    except NotImplementedError:
        import libgguf

        return libgguf.quantize_rows(x, qtype, imatrix=None)


def write_tiny_qwen3moe(path: Path, qtype, seed: int = 0, hidden: int = H, head_dim: int = D,
                        expert_ff: int = I) -> Path:
    """2 qwen3moe layers of 8 experts (top 2, renormalised as llama.cpp's qwen3moe always is), the
    tensors and metadata as convert_hf_to_gguf writes them: experts as [E, rows, cols] tensors.
    hidden, head_dim and expert_ff of 256, 64 and 256 give rows of 256 throughout (the K-quants);
    the matrices' scale then falls as 1 / sqrt(hidden), so the logits stay the default's size."""
    gain = float(np.sqrt(H / hidden))
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(L)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(96)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_expert_feed_forward_length(expert_ff)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(V)])
    w.add_token_merges([])

    def mat(*shape, scale=0.3):
        return (scale * gain * rng.standard_normal(shape)).astype(np.float32)

    def add(name, x, quantise=True):
        t = qtype if quantise and x.ndim > 1 else Q.F32
        w.add_tensor(name, x if t == Q.F32 else _quantize(x, t), raw_dtype=t)

    add("token_embd.weight", mat(V, hidden, scale=1.0), quantise=False)
    add("output.weight", mat(V, hidden))
    add("output_norm.weight", 1 + mat(hidden, scale=0.1))
    for i in range(L):
        b = f"blk.{i}."
        for name in ("attn_norm", "ffn_norm"):
            add(b + name + ".weight", 1 + mat(hidden, scale=0.1))
        add(b + "attn_q_norm.weight", 1 + mat(head_dim, scale=0.1))
        add(b + "attn_k_norm.weight", 1 + mat(head_dim, scale=0.1))
        add(b + "attn_q.weight", mat(NH * head_dim, hidden))
        add(b + "attn_k.weight", mat(NKV * head_dim, hidden))
        add(b + "attn_v.weight", mat(NKV * head_dim, hidden))
        add(b + "attn_output.weight", mat(hidden, NH * head_dim))
        add(b + "ffn_gate_inp.weight", mat(E, hidden, scale=1.0), quantise=False)  # llama.cpp keeps the router f32
        add(b + "ffn_gate_exps.weight", mat(E, expert_ff, hidden))
        add(b + "ffn_up_exps.weight", mat(E, expert_ff, hidden))
        add(b + "ffn_down_exps.weight", mat(E, hidden, expert_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=[Q.Q8_0, Q.Q4_0, Q.F32])
def tiny_moe(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / f"tiny-moe-{request.param.name}.gguf"
    return open_model(str(write_tiny_qwen3moe(path, request.param))), request.param.name


def _shift_experts(e: CpuEngine):
    """Every layer's expert j runs expert j+1's weights: each row reaches the wrong experts."""
    e.exp_idx[:] = np.roll(e.exp_idx, 1, axis=1)


def test_prefill_rows_are_the_decode_rows(tiny_moe):
    model, qtype = tiny_moe
    assert model.cfg.num_experts == E and all(model.cfg.moe_layers)
    e = CpuEngine(model.cfg, model.weights, len(PROMPT))
    dec = np.stack([e.decode(t) for t in PROMPT])
    e.reset()
    pre = e.prefill(PROMPT, all_logits=True)
    kl, tol = _kl(dec, pre), KL_TOL[qtype]
    print(f"{qtype}: prefill against decode, max KL {kl:.2e}, max|d| {np.abs(dec - pre).max():.2e}")
    assert (dec.argmax(-1) == pre.argmax(-1)).all() and kl <= tol
    _shift_experts(e)  # negative control
    e.reset()
    assert _kl(dec, e.prefill(PROMPT, all_logits=True)) > 100 * tol


def test_step_and_verify_rows_are_the_one_sequence_rows(tiny_moe):
    """A sequence's next token beside two others (one of them a prompt chunk), and three tokens in one
    verify: the experts run once over the rows that chose them, each row bit for bit its one-token
    step's; the prompt chunk's last row within the prefill tolerance of its prefill alone."""
    model, qtype = tiny_moe
    seqs = [PROMPT[:9], PROMPT[9:23], PROMPT[23:]]
    one = CpuEngine(model.cfg, model.weights, 32)
    one.prefill(seqs[0])
    ref = np.stack([one.decode(t) for t in (5, 7, 9)])
    alone = CpuEngine(model.cfg, model.weights, 32).prefill(seqs[2])
    e = CpuEngine(model.cfg, model.weights, 32, slots=3)
    e.step([(0, seqs[0]), (1, seqs[1])])
    beside = e.step([(2, seqs[2]), (0, [5]), (1, [7])])
    assert np.array_equal(beside[1], ref[0])
    assert _kl(alone, beside[0][None]) <= KL_TOL[qtype]
    v = CpuEngine(model.cfg, model.weights, 32)
    v.prefill(seqs[0])
    assert np.array_equal(v.verify([5, 7, 9]), ref)
    _shift_experts(v)  # negative control
    v.rewind(len(seqs[0]))
    assert _kl(ref, v.verify([5, 7, 9])) > 100 * KL_TOL[qtype]


def _spans(*arrays) -> int:
    """The bytes of memory the arrays lie in (their allocations, each counted once)."""
    bases = {id(a.base if a.base is not None else a): (a.base if a.base is not None else a) for a in arrays}
    return sum(b.nbytes for b in bases.values())


def test_pair_rows_of_block_format_experts_share_their_memory():
    """Issue 47's peak memory: Qwen3-30B-A3B's 512-row prefill (8 of 128 experts, hidden 2048, expert
    FFN 768) holds its pair rows' gate, up and output in pairs * max(H, 2 * moe_I) floats, 32 MiB;
    the old sizing, one array each (56 MiB), does not fit the bound (the control). Views of the
    first P pair rows (a shorter forward) keep gate and up apart."""
    pairs, h, moe_i = 512 * 8, 2048, 768
    bound = pairs * max(h, 2 * moe_i) * 4
    shared = pair_rows(pairs, h, moe_i, apart=False)
    assert _spans(*shared) <= bound == 32 << 20
    assert _spans(*pair_rows(pairs, h, moe_i, apart=True)) > bound  # negative control: the old sizing
    gate, up, y = shared
    assert gate.shape == up.shape == (pairs, moe_i) and y.shape == (pairs, h)
    for p in (1, 8, 300, pairs):
        assert not np.shares_memory(gate[:p], up[:p])


def test_shared_pair_rows_give_the_same_bits(tiny_moe):
    """The engine lays the pair rows over each other where every expert is of a block format; its
    prefill and decode logits are bit for bit those of the rows apart. Negative control: float-format
    experts gather their f32 inputs into the output rows, so the same layout there moves the logits."""
    model, qtype = tiny_moe
    e = CpuEngine(model.cfg, model.weights, len(PROMPT) + 4)
    pairs, moe_i = e.act.egate.shape
    apart = pair_rows(pairs, H, moe_i, apart=True)
    shared = pair_rows(pairs, H, moe_i, apart=False)
    assert np.shares_memory(e.act.ey, e.act.egate) == (qtype != "F32")

    def run(rows):
        e.act = e.act._replace(egate=rows[0], eup=rows[1], ey=rows[2])
        e.reset()
        return np.concatenate([e.prefill(PROMPT, all_logits=True), [e.decode(t) for t in (5, 7, 9)]])

    if qtype == "F32":
        assert not np.allclose(run(apart), run(shared), atol=1e-3)
    else:
        assert np.array_equal(run(apart), run(shared))
