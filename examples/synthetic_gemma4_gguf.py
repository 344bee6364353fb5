"""Write a GGUF of random weights in Gemma 4 E4B's shape (arch gemma4, as llama.cpp's converter writes
it), for `fuel bench` and `fuel bench --compare llama.cpp`.

    python examples/synthetic_gemma4_gguf.py OUT.gguf [--layers 12] [--type q4_k_m]

The shape: hidden 2560, 8 heads, local layers 2 KV heads of 256, global layers (every sixth, and the
last) 2 of 512 with proportional RoPE over a quarter of the frequencies, FFN 10240, per-layer inputs
of 256 per layer, a vocabulary of 262144, the last 18 of 42 layers sharing KV (with --layers, those
past the multiple of six nearest the same share). The keys and tensor names are those the converter
wrote for tests/tiny_models.py's gemma4_e2b; weights and vocabulary as examples/synthetic_gguf.py
makes them (random, tiled; a byte-level placeholder vocabulary; needs libgguf as that file does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_gguf import CHATML, _byte_alphabet, _random_rows, tensor_type

H, HEADS, KV, HD, GLOBAL_HD, FFN, VOCAB, PER_LAYER, LAYERS, SHARED = 2560, 8, 2, 256, 512, 10240, 262144, 256, 42, 18
WINDOW, PARTIAL = 512, 0.25


def layer_types(n: int) -> list:
    """True for a local (sliding) layer: five local, one global, the last layer global."""
    return [i % 6 != 5 and i != n - 1 for i in range(n)]


def write(path: str, layers: int = LAYERS, qtype: str = "q4_k_m", seed: int = 0) -> None:
    import gguf

    L = layers
    local = layer_types(L)
    # the layers that keep K/V end on a global layer after a local one, as E4B's 24 do (llama.cpp takes
    # the last two kept layers as the ones shared)
    shared = L - max(6, round((LAYERS - SHARED) * L / LAYERS / 6) * 6)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "gemma4")
    w.add_name(f"synthetic gemma4-e4b {qtype}")
    w.add_block_count(L)
    w.add_context_length(131072)
    w.add_embedding_length(H)
    w.add_feed_forward_length([FFN] * L)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(1e6)
    w.add_float32("gemma4.rope.freq_base_swa", 10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(GLOBAL_HD)
    w.add_value_length(GLOBAL_HD)
    w.add_uint32("gemma4.attention.key_length_swa", HD)
    w.add_uint32("gemma4.attention.value_length_swa", HD)
    w.add_uint32("gemma4.rope.dimension_count", GLOBAL_HD)
    w.add_uint32("gemma4.rope.dimension_count_swa", HD)
    w.add_float32("gemma4.final_logit_softcapping", 30.0)
    w.add_uint32("gemma4.attention.sliding_window", WINDOW)
    w.add_array("gemma4.attention.sliding_window_pattern", local)
    w.add_uint32("gemma4.attention.shared_kv_layers", shared)
    w.add_uint32("gemma4.embedding_length_per_layer_input", PER_LAYER)
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

    def matrix(name, layer, rows, cols, like=None):
        kind = like or name.split(".")[-1]
        data, gt = _random_rows(tensor_type(kind, max(layer, 0), L, qtype), rows, cols, rng, cache)
        full = name if layer < 0 else f"blk.{layer}.{name}"
        w.add_tensor(f"{full}.weight", data, raw_shape=data.shape, raw_dtype=gt)

    def vector(name, n, value=1.0):
        w.add_tensor(name, np.full(n, value, np.float32))

    # the global layers' proportional RoPE: 1 for a rotated frequency, 1e30 for one that is not
    freqs = np.full(GLOBAL_HD // 2, 1e30, np.float32)
    freqs[:int(PARTIAL * GLOBAL_HD) // 2] = 1.0
    w.add_tensor("rope_freqs.weight", freqs)
    matrix("token_embd", -1, VOCAB, H)
    matrix("per_layer_token_embd", -1, VOCAB, L * PER_LAYER, like="token_embd")
    matrix("per_layer_model_proj", -1, L * PER_LAYER, H, like="attn_q")
    vector("per_layer_proj_norm.weight", PER_LAYER)
    vector("output_norm.weight", H)
    for i in range(L):
        hd = HD if local[i] else GLOBAL_HD
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
            vector(f"blk.{i}.{name}.weight", H)
        vector(f"blk.{i}.layer_output_scale.weight", 1)
        vector(f"blk.{i}.attn_q_norm.weight", hd)
        matrix("attn_q", i, HEADS * hd, H)
        matrix("attn_output", i, H, HEADS * hd)
        if i < L - shared:
            vector(f"blk.{i}.attn_k_norm.weight", hd)
            matrix("attn_k", i, KV * hd, H)
            matrix("attn_v", i, KV * hd, H)
        for name, rows, cols in (("ffn_gate", FFN, H), ("ffn_up", FFN, H), ("ffn_down", H, FFN),
                                 ("inp_gate", PER_LAYER, H), ("proj", H, PER_LAYER)):
            matrix(name, i, rows, cols, like="attn_q" if name in ("inp_gate", "proj") else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=LAYERS, help="fewer layers than E4B's 42 (a smaller file)")
    p.add_argument("--type", dest="qtype", default="q4_k_m")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    write(a.out, a.layers, a.qtype, a.seed)
    print(a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
