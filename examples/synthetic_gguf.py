"""Write a GGUF of random weights in a real model's shape, for benchmarking every weight format.

    python examples/synthetic_gguf.py OUT.gguf --shape qwen2-1.5b --type q4_k_m
    python examples/synthetic_gguf.py OUT.gguf --shape llama-8b --type q8_0 [--layers 4]
    python examples/synthetic_gguf.py OUT.gguf --shape qwen3-30b-a3b --type q4_k_m --layers 8
    python examples/synthetic_gguf.py OUT.gguf --shape gpt-oss-20b --type mxfp4_moe --layers 4

The demo files are mostly Q5_0 (Qwen2.5-Coder) and Q4_1 (SmolLM2); the files people download are
mostly Q4_K + Q6_K. This writes any mix fuel reads, in the shapes of the models people run, so that
no format is tuned for its demo file only. `--type q4_k_m` follows llama.cpp's Q4_K_M recipe: Q6_K
for attn_v and ffn_down on the "more bits" layers and for the embedding, Q4_K elsewhere.

Values are random (finite, N(0, 0.02) like an initialised model); the text they generate is noise, but
fuel and llama.cpp run exactly the same arithmetic as on a trained model. One random block of rows is
quantised per (type, row length) and tiled, so an 8B file is written in seconds. The vocabulary is a
byte-level placeholder (gpt2 model: the 256 byte tokens, some two-byte merges, then `<tok N>`), enough for llama.cpp to load it,
and a ChatML template for chat endpoints.

Needs: gguf (fuel's test extra) and libgguf (PyPI; quantises the K-quants and i-quants that gguf.quants
cannot).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

SHAPES = {
    # arch, hidden, layers, heads, kv heads, intermediate, vocab, tied, qkv bias, rope theta, context
    "qwen2-0.5b": ("qwen2", 896, 24, 14, 2, 4864, 151936, True, True, 1e6, 32768),
    "qwen2-1.5b": ("qwen2", 1536, 28, 12, 2, 8960, 151936, True, True, 1e6, 32768),
    "llama-1b": ("llama", 2048, 16, 32, 8, 8192, 128256, True, False, 5e5, 131072),
    "llama-8b": ("llama", 4096, 32, 32, 8, 14336, 128256, False, False, 5e5, 131072),
}
# mixtures of experts, with the metadata llama.cpp's converter writes for their arch: arch, hidden,
# layers, heads, kv heads, head dim, feed_forward_length, experts, experts used, expert intermediate
# (0: not written, the experts' is feed_forward_length), vocab, rope theta, context, RMSNorm eps
MOE_SHAPES = {
    "qwen3-30b-a3b": ("qwen3moe", 2048, 48, 32, 4, 128, 6144, 128, 8, 768, 151936, 1e6, 40960, 1e-6),
    "mixtral-8x7b": ("llama", 4096, 32, 32, 8, 128, 14336, 8, 2, 0, 32000, 1e6, 32768, 1e-5),
    # gpt-oss as its converter writes it: q/k/v/o biases, sinks, windowed (128) and full layers
    # alternating, YaRN (32x over 4096), a router and experts with biases; `--type mxfp4_moe` is
    # llama.cpp's MXFP4_MOE (the hub's GGUFs): experts MXFP4, every other matrix Q8_0
    "gpt-oss-20b": ("gpt-oss", 2880, 24, 64, 8, 64, 2880, 32, 4, 2880, 201088, 150000.0, 131072, 1e-5),
}
TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
         "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "iq2_xxs", "iq2_xs",
         "iq2_s", "iq1_s", "iq1_m", "tq2_0", "tq1_0", "mxfp4",
         "q4_k_m", "mxfp4_moe")


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, layer: int, n_layers: int, qtype: str) -> str:
    if qtype == "mxfp4_moe":  # llama-quant.cpp: the 3-D (expert) tensors MXFP4, the others Q8_0
        return "mxfp4" if name.endswith("_exps") else "q8_0"
    if qtype != "q4_k_m":
        return qtype
    if name in ("token_embd", "output") or (name in ("attn_v", "ffn_down") and _more_bits(layer, n_layers)):
        return "q6_k"
    return "q4_k"


_TILE_ROWS = 64
# ChatML, so that chat endpoints (fuel serve, examples/serve_load.py) take the file; its markers are
# plain text to the placeholder vocabulary
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_alphabet() -> list:
    """GPT-2's printable stand-in for each byte (bytes_to_unicode), in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _random_rows(qtype: str, rows: int, cols: int, rng, cache: dict) -> tuple[np.ndarray, object]:
    """(data, raw_dtype) for GGUFWriter.add_tensor: rows x cols of N(0, 0.02) in qtype."""
    import gguf
    import libgguf

    gt = gguf.GGMLQuantizationType[qtype.upper()]
    key = (qtype, cols)
    if key not in cache:
        block = (0.02 * rng.standard_normal((_TILE_ROWS, cols))).astype(np.float32)
        if qtype == "f32":
            cache[key] = block.view(np.uint8)
        elif qtype == "f16":
            cache[key] = block.astype(np.float16).view(np.uint8)
        else:
            # the types ggml quantises only with an importance matrix (iq2_xxs, iq2_xs, iq1_s): a uniform one
            imatrix = np.ones(cols, np.float32) if libgguf.quantize_requires_imatrix(gt) else None
            raw = libgguf.quantize_rows(block, int(gt), imatrix=imatrix)
            cache[key] = np.asarray(raw, np.uint8).reshape(_TILE_ROWS, -1)
    if (key, rows) not in cache:  # one array for every matrix of a shape: a 48-layer MoE file in one layer's memory
        tile = cache[key]
        cache[key, rows] = np.ascontiguousarray(np.resize(tile, (rows, tile.shape[1])))  # rows cycle through the tile
    return cache[key, rows], gt


def write(path: str, shape: str, qtype: str, layers: int | None = None, seed: int = 0) -> None:
    import gguf

    arch, H, L, nh, nkv, inter, vocab, tied, bias, theta, ctx = SHAPES[shape]
    L = layers or L
    hd = H // nh
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"synthetic {shape} {qtype}")
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(H)
    w.add_feed_forward_length(inter)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-6)
    _write_vocab(w, vocab, "qwen2" if arch == "qwen2" else "llama-bpe")

    cache: dict = {}

    def matrix(name, layer, rows, cols):
        data, gt = _random_rows(tensor_type(name.split(".")[-1], layer, L, qtype), rows, cols, rng, cache)
        full = name if layer < 0 else f"blk.{layer}.{name}"
        w.add_tensor(f"{full}.weight", data, raw_shape=data.shape, raw_dtype=gt)

    def vector(name, n, value=None):
        v = np.full(n, value, np.float32) if value is not None else (0.02 * rng.standard_normal(n)).astype(np.float32)
        w.add_tensor(name, v)

    matrix("token_embd", -1, vocab, H)
    if not tied:
        matrix("output", -1, vocab, H)
    vector("output_norm.weight", H, 1.0)
    for i in range(L):
        vector(f"blk.{i}.attn_norm.weight", H, 1.0)
        vector(f"blk.{i}.ffn_norm.weight", H, 1.0)
        for name, rows, cols in (("attn_q", nh * hd, H), ("attn_k", nkv * hd, H), ("attn_v", nkv * hd, H),
                                 ("attn_output", H, nh * hd), ("ffn_gate", inter, H), ("ffn_up", inter, H),
                                 ("ffn_down", H, inter)):
            matrix(name, i, rows, cols)
        if bias:
            for name, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                vector(f"blk.{i}.{name}.bias", n)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Qwen3.5 / 3.6 hybrids: three gated DeltaNet layers to each full-attention one (the fourth), as
# llama.cpp's converter writes them (arch qwen35 / qwen35moe: the ssm_* tensors, attn_qkv and
# attn_gate of the linear layers, q and its output gate in one attn_q, norms stored as 1 + w,
# ssm_a = -exp(A_log), ffn_norm named post_attention_norm); no MTP layer (nextn_predict_layers 0).
# arch, hidden, layers, heads, kv heads, head_dim, FFN (dense: intermediate; MoE: (experts, used,
# expert intermediate, shared intermediate)), vocab, tied, linear (key heads, value heads, key dim,
# value dim); Qwen3.5's published sizes as recalled, rope 1e7, 262144 context, partial rotary 1/4.
# qwen35moe-35b-a3b is Qwen3.6-35B-A3B's text shape too: its model card gives the same sizes (40 layers
# of hidden 2048, 3 DeltaNet to 1 attention, 16 QK / 32 V linear heads of 128, 16 / 2 heads of 256,
# 256 experts of 512 top 8 plus a shared one, vocab 248320), and transformers loads Qwen3.6 files
# with Qwen3.5's classes and model_type (qwen3_5_moe), so it has no shape of its own
HYBRID_SHAPES = {
    "qwen35-0.8b": ("qwen35", 1024, 24, 8, 2, 256, 3584, 248320, True, (16, 16, 128, 128)),
    "qwen35-2b": ("qwen35", 2048, 24, 8, 2, 256, 6144, 248320, True, (16, 16, 128, 128)),
    "qwen35-9b": ("qwen35", 4096, 32, 16, 4, 256, 12288, 248320, False, (16, 32, 128, 128)),
    "qwen35moe-35b-a3b": ("qwen35moe", 2048, 40, 16, 2, 256, (256, 8, 512, 512), 248320, False, (16, 32, 128, 128)),
}


def hybrid_tensor_type(name: str, layer: int, n_layers: int, attn_layer: int, n_attn: int, qtype: str) -> str:
    """tensor_type for a hybrid: under q4_k_m llama.cpp's attn_qkv rule (Q5_K) and attn_v's more bits
    counted over the attention layers only; ffn_down's (routed, shared) over all layers."""
    if qtype != "q4_k_m":
        return qtype
    if name == "attn_qkv":
        return "q5_k"
    if name == "attn_v":
        return "q6_k" if _more_bits(attn_layer, n_attn) else "q4_k"
    if name.startswith("ffn_down"):
        return "q6_k" if _more_bits(layer, n_layers) else "q4_k"
    return tensor_type(name, layer, n_layers, qtype)


def _write_vocab(w, vocab: int, pre: str) -> None:
    alphabet = _byte_alphabet()
    pairs = [(a, b) for a in alphabet[:64] for b in alphabet[:64]][: min(4096, vocab - 256)]
    tokens = alphabet + [a + b for a, b in pairs]
    tokens += [f"<tok {i}>" for i in range(len(tokens), vocab)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab)
    w.add_token_merges([f"{a} {b}" for a, b in pairs])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHATML)


def write_hybrid(path: str, shape: str, qtype: str, layers: int | None = None, seed: int = 0) -> None:
    import gguf

    arch, H, L, nh, nkv, hd, ffn, vocab, tied, (kh, vh, dk, dv) = HYBRID_SHAPES[shape]
    L = layers or L
    moe = isinstance(ffn, tuple)
    attention = [i % 4 == 3 for i in range(L)]  # full_attention_interval 4
    n_attn = sum(attention)
    conv_dim, inner = 2 * kh * dk + vh * dv, vh * dv
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"synthetic {shape} {qtype}")
    w.add_block_count(L)
    w.add_context_length(262144)
    w.add_embedding_length(H)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(hd // 4)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_layer_norm_rms_eps(1e-6)
    if moe:
        experts, used, expert_ff, shared_ff = ffn
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        w.add_expert_feed_forward_length(expert_ff)
        w.add_expert_shared_feed_forward_length(shared_ff)
    else:
        w.add_feed_forward_length(ffn)
    w.add_ssm_conv_kernel(4)
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(kh)
    w.add_ssm_time_step_rank(vh)
    w.add_ssm_inner_size(inner)
    w.add_array(f"{arch}.attention.recurrent_layers", [not a for a in attention])  # no add_ method in older gguf
    w.add_full_attention_interval(4)
    w.add_nextn_predict_layers(0)
    _write_vocab(w, vocab, "qwen35")

    cache: dict = {}

    def matrix(name, layer, rows, cols, experts=0):
        kind = name.split(".")[-1]
        attn_layer = sum(attention[:layer]) if layer >= 0 else 0
        qt = hybrid_tensor_type(kind, layer, L, attn_layer, n_attn, qtype)
        data, gt = _random_rows(qt, rows * max(experts, 1), cols, rng, cache)
        if experts:
            data = data.reshape(experts, rows, data.shape[1])
        full = name if layer < 0 else f"blk.{layer}.{name}"
        w.add_tensor(f"{full}.weight", data, raw_shape=data.shape, raw_dtype=gt)

    def vector(name, shape, value=None, scale=0.02):
        v = np.full(shape, value, np.float32) if value is not None else (scale * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(name, v)

    matrix("token_embd", -1, vocab, H)
    if not tied:
        matrix("output", -1, vocab, H)
    vector("output_norm.weight", H, 1.0)
    for i in range(L):
        blk = f"blk.{i}"
        vector(f"{blk}.attn_norm.weight", H, 1.0)
        vector(f"{blk}.post_attention_norm.weight", H, 1.0)
        if attention[i]:
            for name, rows, cols in (("attn_q", 2 * nh * hd, H), ("attn_k", nkv * hd, H), ("attn_v", nkv * hd, H),
                                     ("attn_output", H, nh * hd)):
                matrix(name, i, rows, cols)
            vector(f"{blk}.attn_q_norm.weight", hd, 1.0)
            vector(f"{blk}.attn_k_norm.weight", hd, 1.0)
        else:
            for name, rows, cols in (("attn_qkv", conv_dim, H), ("attn_gate", inner, H), ("ssm_alpha", vh, H),
                                     ("ssm_beta", vh, H), ("ssm_out", H, inner)):
                matrix(name, i, rows, cols)
            vector(f"{blk}.ssm_conv1d.weight", (conv_dim, 4), scale=0.2)
            vector(f"{blk}.ssm_a", vh, -1.0)  # A = -exp(A_log), A_log = 0
            vector(f"{blk}.ssm_dt.bias", vh, 1.0)
            vector(f"{blk}.ssm_norm.weight", dv, 1.0)
        if moe:
            vector(f"{blk}.ffn_gate_inp.weight", (experts, H))
            vector(f"{blk}.ffn_gate_inp_shexp.weight", (1, H))
            for name, rows, cols in (("ffn_gate_exps", expert_ff, H), ("ffn_up_exps", expert_ff, H),
                                     ("ffn_down_exps", H, expert_ff)):
                matrix(name, i, rows, cols, experts)
            for name, rows, cols in (("ffn_gate_shexp", shared_ff, H), ("ffn_up_shexp", shared_ff, H),
                                     ("ffn_down_shexp", H, shared_ff)):
                matrix(name, i, rows, cols)
        else:
            for name, rows, cols in (("ffn_gate", ffn, H), ("ffn_up", ffn, H), ("ffn_down", H, ffn)):
                matrix(name, i, rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_moe(path: str, shape: str, qtype: str, layers: int | None = None, seed: int = 0) -> None:
    """A MOE_SHAPES file: qwen3moe as convert_hf_to_gguf's Qwen3MoeModel writes it (QK-norms, key and
    value lengths, expert_feed_forward_length; llama.cpp renormalises qwen3moe's top-k, so no
    norm_topk_prob key), Mixtral as its LlamaModel does (arch llama with expert counts), gpt-oss as its
    GptOssModel does (biases, attn_sinks, post_attention_norm, sliding_window, YaRN). Each layer's
    experts are 3-D tensors [experts, rows, cols] (ffn_{gate,up,down}_exps); the router
    (ffn_gate_inp) stays f32, as llama.cpp's quantize leaves it."""
    import gguf

    arch, H, L, nh, nkv, hd, ff, E, k, eff, vocab, theta, ctx, eps = MOE_SHAPES[shape]
    L = layers or L
    inter = eff or ff
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"synthetic {shape} {qtype}")
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(H)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_expert_count(E)
    w.add_expert_used_count(k)
    if arch in ("qwen3moe", "gpt-oss"):
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_expert_feed_forward_length(eff)
    if arch == "gpt-oss":
        w.add_sliding_window(128)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_scaling_yarn_beta_fast(32.0)
        w.add_rope_scaling_yarn_beta_slow(1.0)
    elif arch != "qwen3moe":
        w.add_vocab_size(vocab)
        w.add_rope_dimension_count(hd)
    _write_vocab(w, vocab, {"qwen3moe": "qwen2", "gpt-oss": "gpt-4o"}.get(arch, "llama-bpe"))

    cache: dict = {}

    def matrix(name, layer, rows, cols, experts=0):
        n = max(experts, 1)
        kind = name.split(".")[-1]
        data, gt = _random_rows(tensor_type(kind if qtype == "mxfp4_moe" else kind.replace("_exps", ""), layer, L, qtype),
                                n * rows, cols, rng, cache)
        if experts:
            data = data.reshape(experts, rows, -1)
        full = name if layer < 0 else f"blk.{layer}.{name}"
        w.add_tensor(f"{full}.weight", data, raw_shape=data.shape, raw_dtype=gt)

    def vector(name, n, value=None):
        v = np.full(n, value, np.float32) if value is not None else (0.02 * rng.standard_normal(n)).astype(np.float32)
        w.add_tensor(name, v)

    biased = arch == "gpt-oss"
    matrix("token_embd", -1, vocab, H)
    matrix("output", -1, vocab, H)
    vector("output_norm.weight", H, 1.0)
    for i in range(L):
        vector(f"blk.{i}.attn_norm.weight", H, 1.0)
        vector(f"blk.{i}.{'post_attention_norm' if biased else 'ffn_norm'}.weight", H, 1.0)
        if biased:
            for name, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd), ("attn_output", H),
                            ("ffn_gate_inp", E), ("ffn_gate_exps", (E, inter)), ("ffn_up_exps", (E, inter)),
                            ("ffn_down_exps", (E, H))):
                vector(f"blk.{i}.{name}.bias", n)
            vector(f"blk.{i}.attn_sinks.weight", nh)
        if arch == "qwen3moe":
            vector(f"blk.{i}.attn_q_norm.weight", hd, 1.0)
            vector(f"blk.{i}.attn_k_norm.weight", hd, 1.0)
        for name, rows, cols in (("attn_q", nh * hd, H), ("attn_k", nkv * hd, H), ("attn_v", nkv * hd, H),
                                 ("attn_output", H, nh * hd)):
            matrix(name, i, rows, cols)
        router, gt = _random_rows("f32", E, H, rng, cache)
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", router, raw_shape=router.shape, raw_dtype=gt)
        for name, rows, cols in (("ffn_gate_exps", inter, H), ("ffn_up_exps", inter, H), ("ffn_down_exps", H, inter)):
            matrix(name, i, rows, cols, E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--shape", choices=sorted(SHAPES) + sorted(MOE_SHAPES) + sorted(HYBRID_SHAPES), default="qwen2-1.5b")
    p.add_argument("--type", dest="qtype", choices=TYPES, default="q4_k_m")
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the shape has (a smaller file)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.qtype == "mxfp4_moe" and a.shape not in MOE_SHAPES:
        p.error(f"--type mxfp4_moe needs a MoE shape ({', '.join(sorted(MOE_SHAPES))})")
    writer = write_hybrid if a.shape in HYBRID_SHAPES else write_moe if a.shape in MOE_SHAPES else write
    writer(a.out, a.shape, a.qtype, a.layers, a.seed)
    print(a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
