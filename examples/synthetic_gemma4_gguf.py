"""Write a GGUF of random weights in a Gemma 4 shape (arch gemma4, as llama.cpp's converter writes
it), for `fuel bench` and `fuel bench --compare llama.cpp`.

    python examples/synthetic_gemma4_gguf.py OUT.gguf [--shape e4b] [--layers 12] [--type q4_k_m]
    python examples/synthetic_gemma4_gguf.py OUT.gguf --shape 26b-a4b --layers 6

The shapes (SHAPES): local (sliding) layers five in six and the last layer global; global layers
with proportional RoPE over a quarter of the frequencies; a vocabulary of 262144, tied.
- e4b: hidden 2560, 8 heads, local layers 2 KV heads of 256, global 2 of 512, FFN 10240, per-layer
  inputs of 256 per layer, the last 18 of 42 layers sharing KV (with --layers, those past the
  multiple of six nearest the same share);
- 26b-a4b: hidden 2816, 16 heads, local layers 8 KV heads of 256 (window 1024), global 2 of 512
  whose v is their k (attention_k_eq_v: no attn_v), a dense FFN of 2112 beside a MoE of 128
  experts, top 8, of 704 (router scale, per-expert scale, the MoE's own norms); 30 layers, no
  per-layer inputs, no shared KV. Its ffn_down rows (2112, 704) are no multiple of 256: as
  llama.cpp's quantize does, a K-quant falls back there (Q4_K -> Q5_0, Q6_K -> Q8_0).

The keys and tensor names are those the converter wrote for tests/tiny_models.py's gemma4_e2b and
gemma4_moe; weights and vocabulary as examples/synthetic_gguf.py makes them (random, tiled; a
byte-level placeholder vocabulary; needs libgguf as that file does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_gguf import CHATML, _byte_alphabet, _random_rows, tensor_type

VOCAB, PARTIAL = 262144, 0.25
# hidden, heads, local KV heads, local head dim, global KV heads, global head dim, FFN, per-layer input,
# layers, layers sharing KV, window, k_eq_v, MoE (experts, used, expert FFN) or None
SHAPES = {
    "e4b": (2560, 8, 2, 256, 2, 512, 10240, 256, 42, 18, 512, False, None),
    "26b-a4b": (2816, 16, 8, 256, 2, 512, 2112, 0, 30, 0, 1024, True, (128, 8, 704)),
}
# llama-quant.cpp's tensor_type_fallback for rows that are no multiple of 256
_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "q2_k": "q4_0", "q3_k": "q4_0"}


def layer_types(n: int) -> list:
    """True for a local (sliding) layer: five local, one global, the last layer global."""
    return [i % 6 != 5 and i != n - 1 for i in range(n)]


def write(path: str, layers: int | None = None, qtype: str = "q4_k_m", seed: int = 0, shape: str = "e4b") -> None:
    import gguf

    H, HEADS, KV, HD, GKV, GHD, FFN, PER_LAYER, LAYERS, SHARED, WINDOW, K_EQ_V, MOE = SHAPES[shape]
    L = layers or LAYERS
    local = layer_types(L)
    # the layers that keep K/V end on a global layer after a local one, as E4B's 24 do (llama.cpp takes
    # the last two kept layers as the ones shared)
    shared = L - max(6, round((LAYERS - SHARED) * L / LAYERS / 6) * 6) if SHARED else 0
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "gemma4")
    w.add_name(f"synthetic gemma4-{shape} {qtype}")
    w.add_block_count(L)
    w.add_context_length(131072 if shape == "e4b" else 262144)
    w.add_embedding_length(H)
    w.add_feed_forward_length([FFN] * L)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV if KV == GKV else [KV if s else GKV for s in local])
    w.add_rope_freq_base(1e6)
    w.add_float32("gemma4.rope.freq_base_swa", 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(GHD)
    w.add_value_length(GHD)
    w.add_uint32("gemma4.attention.key_length_swa", HD)
    w.add_uint32("gemma4.attention.value_length_swa", HD)
    w.add_uint32("gemma4.rope.dimension_count", GHD)
    w.add_uint32("gemma4.rope.dimension_count_swa", HD)
    w.add_float32("gemma4.final_logit_softcapping", 30.0)
    w.add_uint32("gemma4.attention.sliding_window", WINDOW)
    w.add_array("gemma4.attention.sliding_window_pattern", local)
    w.add_uint32("gemma4.attention.shared_kv_layers", shared)
    w.add_uint32("gemma4.embedding_length_per_layer_input", PER_LAYER)
    if MOE:
        w.add_expert_count(MOE[0])
        w.add_expert_used_count(MOE[1])
        w.add_expert_feed_forward_length(MOE[2])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")  # a pre-tokenizer llama.cpp knows (it refuses "gpt2")
    alphabet = _byte_alphabet()
    pairs = [(a, b) for a in alphabet[:64] for b in alphabet[:64]][:4096]
    tokens = alphabet + [a + b for a, b in pairs]
    tokens += [f"<tok {i}>" for i in range(len(tokens), VOCAB)]
    w.add_token_list(tokens)
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([f"{a} {b}" for a, b in pairs])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_chat_template(CHATML)

    cache: dict = {}

    def matrix(name, layer, rows, cols, like=None, experts=0):
        kind = like or name.split(".")[-1]
        qt = tensor_type(kind, max(layer, 0), L, qtype)
        qt = _FALLBACK.get(qt, qt) if cols % 256 else qt
        data, gt = _random_rows(qt, rows * max(experts, 1), cols, rng, cache)
        if experts:
            data = data.reshape(experts, rows, -1)
        full = name if layer < 0 else f"blk.{layer}.{name}"
        w.add_tensor(f"{full}.weight", data, raw_shape=data.shape, raw_dtype=gt)

    def vector(name, n, value=1.0):
        w.add_tensor(name, np.full(n, value, np.float32))

    # the global layers' proportional RoPE: 1 for a rotated frequency, 1e30 for one that is not
    freqs = np.full(GHD // 2, 1e30, np.float32)
    freqs[:int(PARTIAL * GHD) // 2] = 1.0
    w.add_tensor("rope_freqs.weight", freqs)
    matrix("token_embd", -1, VOCAB, H)
    if PER_LAYER:
        matrix("per_layer_token_embd", -1, VOCAB, L * PER_LAYER, like="token_embd")
        matrix("per_layer_model_proj", -1, L * PER_LAYER, H, like="attn_q")
        vector("per_layer_proj_norm.weight", PER_LAYER)
    vector("output_norm.weight", H)
    for i in range(L):
        hd, kv = (HD, KV) if local[i] else (GHD, GKV)
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            vector(f"blk.{i}.{name}.weight", H)
        vector(f"blk.{i}.layer_output_scale.weight", 1)
        vector(f"blk.{i}.attn_q_norm.weight", hd)
        matrix("attn_q", i, HEADS * hd, H)
        matrix("attn_output", i, H, HEADS * hd)
        if i < L - shared:
            vector(f"blk.{i}.attn_k_norm.weight", hd)
            matrix("attn_k", i, kv * hd, H)
            if local[i] or not K_EQ_V:
                matrix("attn_v", i, kv * hd, H)
        for name, rows, cols in (("ffn_gate", FFN, H), ("ffn_up", FFN, H), ("ffn_down", H, FFN)):
            matrix(name, i, rows, cols)
        if PER_LAYER:
            vector(f"blk.{i}.post_norm.weight", H)
            matrix("inp_gate", i, PER_LAYER, H, like="attn_q")
            matrix("proj", i, H, PER_LAYER, like="attn_q")
        if MOE:
            E, _, eff = MOE
            router, gt = _random_rows("f32", E, H, rng, cache)
            w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", router, raw_shape=router.shape, raw_dtype=gt)
            vector(f"blk.{i}.ffn_gate_inp.scale", H)
            vector(f"blk.{i}.ffn_down_exps.scale", E)
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                vector(f"blk.{i}.{name}.weight", H)
            matrix("ffn_gate_up_exps", i, 2 * eff, H, like="ffn_up", experts=E)
            matrix("ffn_down_exps", i, H, eff, like="ffn_down", experts=E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--shape", choices=sorted(SHAPES), default="e4b")
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the shape has (a smaller file)")
    p.add_argument("--type", dest="qtype", default="q4_k_m")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    write(a.out, a.layers, a.qtype, a.seed, a.shape)
    print(a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
