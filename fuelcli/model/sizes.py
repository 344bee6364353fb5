"""What a config implies in bytes, computed before anything is allocated.

Two checks, both with exact integer arithmetic (JSON and GGUF integers are unbounded or 64-bit):

  weights   no size key may imply, on its own (every other size at its least), more parameters
            than the model's weight files hold at the fewest bits per weight of any format fuel
            reads. A hidden_size or num_hidden_layers of 10^12 is refused here, naming the key,
            before a per-layer list or a table of that size is built; the layer count and head_dim
            are also held to what memory can plan (a config with no weight files beside it). Whether the files hold exactly the right tensors is the weight
            readers' check (shape by shape, against the config).
  engine    the KV cache for the requested context, the activations and the RoPE tables must fit
            in the memory available now (MemAvailable, or the cgroup's limit when lower).
"""

from __future__ import annotations

from ..errors import ConfigError, InputError
from ..formats import FORMATS
from ..process.memory import available_bytes
from .block import rope_variants

# the fewest bits any stored format spends on a weight (Q4_0 and Q4_K: 4.5)
MIN_BITS_PER_WEIGHT = min(8 * f.block_bytes / f.block_elems for f in FORMATS.values())
# a key is blamed only when its value alone needs more than this too: no real value comes near (a
# 256k vocabulary alone needs 288 KiB), and a file merely cut short is better named by the readers
BLAME_FLOOR = 1 << 20
# what parsing and `inspect` build per layer (window, MoE flag, layer plan) or per RoPE frequency
# (a table row) from a config alone: well under this
PLAN_BYTES_PER_ROW = 1024
# the engine's activations hold up to this many tokens at once (the CPU engine's prefill chunk)
ACTIVATION_ROWS = 512


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def weight_params(d: dict, dense_layers: int = 0, moe_layers: int = 0) -> int:
    """Parameters implied by the sizes in `d` (HF key names): embeddings (twice unless tied), per
    layer two norms and the attention projections, plus the FFNs of the layers counted."""
    H, L = d["hidden_size"], d["num_hidden_layers"]
    q, kv = d["num_attention_heads"] * d["head_dim"], d["num_key_value_heads"] * d["head_dim"]
    embed = d["vocab_size"] * H * (1 if d.get("tie_word_embeddings") else 2)
    per_layer = 2 * H + 2 * H * q + 2 * H * kv
    dense = 3 * H * d.get("intermediate_size", 0)
    experts = d.get("num_experts", 0)
    moe = experts * H + 3 * experts * H * d.get("moe_intermediate_size", 0)
    return embed + H + L * per_layer + dense_layers * dense + moe_layers * moe


def _min_bytes(params: int) -> int:
    return int(params * MIN_BITS_PER_WEIGHT) // 8


def _alone(d: dict, key: str, dense_layers: int, moe_layers: int) -> int:
    """Parameters implied by d[key] with every other size at its least (1; head_dim 2), one layer of
    each FFN kind present unless `key` is the layer count: what this value needs whatever the rest."""
    least = {k: (2 if k == "head_dim" else 1) if isinstance(v, int) and not isinstance(v, bool) else v
             for k, v in d.items()}
    least[key] = d[key]
    layers = key == "num_hidden_layers"
    return weight_params(least, dense_layers if layers else min(dense_layers, 1),
                         moe_layers if layers else min(moe_layers, 1))


def check_weights_fit(d: dict, file_bytes: int | None, names: dict | None = None,
                      dense_layers: int = 0, moe_layers: int = 0) -> None:
    """Refuse a size key whose value alone, every other size at its least, implies more weights
    than the files hold (at the fewest bits per weight fuel reads): that key is wrong whatever the
    rest says (and more than BLAME_FLOOR). It is named as the source spells it (`names`: HF key ->
    GGUF key). Files merely too small for plausible sizes are left to the weight readers, which
    name the file and tensor. The
    layer count and head_dim are also held to what memory can plan, files or not."""
    names = names or {}
    if file_bytes is not None:
        for key, value in d.items():
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            params = _alone(d, key, dense_layers, moe_layers)
            if _min_bytes(params) > max(file_bytes, BLAME_FLOOR):
                raise ConfigError(
                    f"{names.get(key, key)}={value} is too large for the weights: with every other size at "
                    f"its least it implies {params:,} parameters, at least {human(_min_bytes(params))} at "
                    f"{MIN_BITS_PER_WEIGHT:g} bits each, but the weight files hold {human(file_bytes)}")
    avail = available_bytes()
    for key, what in (("num_hidden_layers", "layers"), ("head_dim", "RoPE frequencies")):
        if avail is not None and d[key] * PLAN_BYTES_PER_ROW > avail:
            raise ConfigError(f"{names.get(key, key)}={d[key]} is more {what} than this machine can plan "
                              f"({human(avail)} available)")


def attention_layers(cfg) -> int:
    """Layers that keep a KV cache (linear-attention layers keep a fixed-size state instead)."""
    return sum(b.linear is None for b in cfg.blocks)


def kv_values_per_token(cfg) -> int:
    """K and V values a token adds to the cache: each layer that stores its own at its own size
    (a layer sharing another's K/V adds none)."""
    return 2 * sum(cfg.at(b).kv_dim for b in cfg.blocks if b.linear is None and b.attention.kv_from is None)


def state_bytes(cfg) -> int:
    """A sequence's linear-attention state: every such layer's conv window and delta-rule matrices."""
    return 4 * sum(b.linear.state_floats for b in cfg.blocks if b.linear is not None)


def engine_bytes(cfg, n_ctx: int, rows: int = ACTIVATION_ROWS, kv_value_bytes: int = 4,
                 slots: int = 1) -> tuple[int, int]:
    """(KV cache and recurrent state bytes, activation + RoPE table bytes) of an engine with `slots`
    sequences of a context of n_ctx each."""
    kv = kv_value_bytes * kv_values_per_token(cfg) * n_ctx * slots + state_bytes(cfg) * slots
    rows = max(1, min(rows, n_ctx))
    inter = max(cfg.intermediate_size, cfg.moe_intermediate_size)
    act = 4 * rows * (3 * cfg.hidden_size + 2 * cfg.q_dim + 2 * cfg.kv_dim + 2 * inter + max(cfg.num_experts, 1))
    rope = 2 * 4 * n_ctx * (cfg.head_dim // 2) * max(1, len(rope_variants(cfg)))
    return kv, act + rope + 4 * cfg.vocab_size


def check_engine_fits(cfg, n_ctx: int, kv_value_bytes: int = 4, slots: int = 1) -> None:
    """Refuse a context whose KV cache and activations exceed the memory available now."""
    avail = available_bytes()
    if avail is None:
        return
    kv, rest = engine_bytes(cfg, n_ctx, kv_value_bytes=kv_value_bytes, slots=slots)
    if kv + rest > avail:
        what = f"{slots} sequences of {n_ctx} tokens" if slots > 1 else f"a context of {n_ctx} tokens"
        raise InputError(
            f"not enough memory for {what}: the KV cache needs {human(kv)} "
            f"({attention_layers(cfg)} layers × {cfg.num_kv_heads} KV heads × head_dim {cfg.head_dim} × K and V "
            f"in {'float32' if kv_value_bytes == 4 else 'float16'} per token) and the activations and RoPE tables {human(rest)}, but {human(avail)} is available; "
            f"ask for fewer tokens (-n, -d) or a model with a smaller max_position_embeddings "
            f"(now {cfg.max_position})")
