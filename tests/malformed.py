"""Builders for the malformed-input tests: tiny but complete models written byte by byte (no
transformers, no gguf writer), so a test knows every structural boundary of the file and can
break it there; and `run_pipeline`, which reads a model the way the CLI does and runs a forward.

The models are 1-layer Llamas: vocab 8, hidden 8, 2 heads of 4, FFN 16, f32 weights.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

V, H, NH, HD, I = 8, 8, 2, 4, 16
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V, "hidden_size": H,
          "intermediate_size": I, "num_hidden_layers": 1, "num_attention_heads": NH, "num_key_value_heads": NH,
          "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "bos_token_id": 1,
          "eos_token_id": 2, "tie_word_embeddings": False}


def hf_tensors(seed: int = 0) -> dict:
    """HF names -> f32 arrays of the tiny Llama."""
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H),
              "model.layers.0.input_layernorm.weight": (H,), "model.layers.0.post_attention_layernorm.weight": (H,),
              "model.layers.0.self_attn.q_proj.weight": (H, H), "model.layers.0.self_attn.k_proj.weight": (H, H),
              "model.layers.0.self_attn.v_proj.weight": (H, H), "model.layers.0.self_attn.o_proj.weight": (H, H),
              "model.layers.0.mlp.gate_proj.weight": (I, H), "model.layers.0.mlp.up_proj.weight": (I, H),
              "model.layers.0.mlp.down_proj.weight": (H, I)}
    return {n: (1 + 0.1 * rng.standard_normal(s) if "norm" in n else 0.3 * rng.standard_normal(s)).astype(np.float32)
            for n, s in shapes.items()}


# ------------------------------------------------------------------ safetensors


def safetensors_bytes(tensors: dict, header_extra: dict | None = None, dtype: str = "F32") -> tuple[bytes, list]:
    """A safetensors file of F32 (or F16) tensors, and its structural boundaries [(offset, what)]."""
    header, data, bounds = {}, b"", []
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, {"F32": np.float32, "F16": np.float16}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header.update(header_extra or {})
    h = json.dumps(header).encode()
    base = 8 + len(h)
    bounds = [(0, "start"), (4, "inside the length"), (8, "header start"), (base - 1, "header end - 1"),
              (base, "data start")]
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict):
            b, e = info["data_offsets"]
            bounds += [(base + b, f"{name} start"), (base + (b + e) // 2, f"{name} middle")]
    return struct.pack("<Q", len(h)) + h + data, bounds


def write_hf_dir(d: Path, tensors: dict | None = None, config: dict | None = None,
                 tokenizer: bool = False, dtype: str = "F32") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    (d / "model.safetensors").write_bytes(safetensors_bytes(hf_tensors() if tensors is None else tensors,
                                                            dtype=dtype)[0])
    if tokenizer:
        write_byte_tokenizer(d)
    return d


def write_byte_tokenizer(d: Path, template: str | None = None) -> None:
    """A byte-level BPE tokenizer.json over the tiny vocabulary ('a'..'h', no merges) and a
    tokenizer_config.json; `template` goes to chat_template.jinja."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {chr(ord("a") + i): i for i in range(V)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "b", "eos_token": "c"}))
    if template is not None:
        (d / "chat_template.jinja").write_text(template)


# ------------------------------------------------------------------ GGUF

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
           U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32 = 0


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype: int, value) -> bytes:
    if vtype in _SCALAR:
        return struct.pack(_SCALAR[vtype], value)
    if vtype == STRING:
        return _str(value)
    etype, items = value  # ARRAY: (element type, items)
    return struct.pack("<IQ", etype, len(items)) + b"".join(gguf_value(etype, v) for v in items)


def tiny_gguf_meta() -> list:
    """(key, type, value) of a complete tiny llama GGUF with a byte-alphabet BPE vocabulary."""
    tokens = [chr(ord("a") + i) for i in range(V - 1)] + ["ab"]  # "a b" merges into "ab"
    return [
        ("general.architecture", STRING, "llama"),
        ("llama.block_count", U32, 1), ("llama.context_length", U32, 64), ("llama.embedding_length", U32, H),
        ("llama.feed_forward_length", U32, I), ("llama.attention.head_count", U32, NH),
        ("llama.attention.head_count_kv", U32, NH), ("llama.rope.freq_base", F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-6),
        ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "gpt-2"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)), ("tokenizer.ggml.token_type", ARRAY, (I32, [1] * V)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["a b"])), ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2), ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STRING, "{% for m in messages %}{{ m.content }}{% endfor %}"),
    ]


def tiny_gguf_tensors(seed: int = 0) -> list:
    """(name, numpy shape, f32 array) in GGUF names (llama q/k are stored permuted; random anyway)."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    hf = hf_tensors(seed)
    out = []
    for n, a in hf.items():
        g = names.get(n) or (n.replace("model.layers.", "blk.").replace("input_layernorm", "attn_norm")
                             .replace("post_attention_layernorm", "ffn_norm").replace("self_attn.q_proj", "attn_q")
                             .replace("self_attn.k_proj", "attn_k").replace("self_attn.v_proj", "attn_v")
                             .replace("self_attn.o_proj", "attn_output").replace("mlp.gate_proj", "ffn_gate")
                             .replace("mlp.up_proj", "ffn_up").replace("mlp.down_proj", "ffn_down"))
        out.append((g, a))
    return out


def q8_0(a: np.ndarray) -> bytes:
    """ggml's Q8_0 of a float array whose rows are multiples of 32: per block an f16 scale and 32 int8."""
    blocks = a.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(-1, keepdims=True) / 127
    q = np.round(blocks / np.where(d == 0, 1, d)).astype(np.int8)
    return b"".join(np.float16(di).tobytes() + qi.tobytes() for di, qi in zip(d[:, 0], q))


GGML_Q8_0 = 8


def gguf_bytes(meta: list | None = None, tensors: list | None = None, alignment: int = 32,
               n_tensors: int | None = None, n_kv: int | None = None, raw_kv: bytes = b"",
               trailing: bytes = b"") -> tuple[bytes, list]:
    """A GGUF v3 file and its structural boundaries [(offset, what)]: every field of the header,
    every key/value, every tensor info and tensor. `raw_kv` is appended to the key/values as is."""
    meta = tiny_gguf_meta() if meta is None else meta
    tensors = tiny_gguf_tensors() if tensors is None else tensors
    out, bounds = bytearray(), []

    def put(b: bytes, what: str):
        bounds.append((len(out), what))
        out.extend(b)

    put(b"GGUF", "magic")
    put(struct.pack("<I", 3), "version")
    put(struct.pack("<Q", len(tensors) if n_tensors is None else n_tensors), "tensor count")
    put(struct.pack("<Q", len(meta) + bool(raw_kv) if n_kv is None else n_kv), "kv count")
    for key, vtype, value in meta:
        put(_str(key), f"key {key}")
        put(struct.pack("<I", vtype), f"type of {key}")
        put(gguf_value(vtype, value), f"value of {key}")
    if raw_kv:
        put(raw_kv, "raw kv")
    offset, blobs = 0, []
    for name, a, *quant in tensors:  # (name, f32 array) or (name, array, ggml type, raw bytes)
        gtype, raw = quant if quant else (GGML_F32, np.ascontiguousarray(a, np.float32).tobytes())
        put(_str(name), f"name of {name}")
        put(struct.pack("<I", a.ndim), f"n_dims of {name}")
        put(b"".join(struct.pack("<Q", d) for d in reversed(a.shape)), f"dims of {name}")
        put(struct.pack("<I", gtype), f"type of {name}")
        put(struct.pack("<Q", offset), f"offset of {name}")
        blobs.append((name, raw))
        offset += -(-len(raw) // alignment) * alignment
    pad = -len(out) % alignment
    if pad:
        put(bytes(pad), "padding")
    for name, raw in blobs:
        put(raw, f"data of {name}")
        if len(raw) % alignment:
            put(bytes(-len(raw) % alignment), f"padding after {name}")
    out.extend(trailing)
    return bytes(out), bounds


# ------------------------------------------------------------------ reading a model as the CLI does


def run_pipeline(model: str | Path, tokens=(1, 2, 3)):
    """open_model -> weights -> tokenizer -> reference forward (checked for NaN/inf): what `fuel logits
    --path reference` does, in-process. Raises FuelError on bad input, anything else is a bug."""
    from fuelcli.assembly.reference import check_reference_logits
    from fuelcli.assembly.reference import forward
    from fuelcli.assembly.loader import open_model

    m = open_model(str(model))
    weights = m.weights
    if m.gguf is not None or (Path(model) / "tokenizer.json").exists():
        m.tokenizer.encode("abc")
    ids = [t for t in tokens if t < m.cfg.vocab_size]
    logits = forward(m.cfg, weights, ids)
    check_reference_logits(m.cfg, weights, logits, ids)
    return logits
