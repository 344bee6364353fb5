"""Memory roofline (`fuel bench`'s tg tests): a decode step reads every weight it uses once, and the
KV cache up to its position; `bytes_per_token` counts them (an MoE layer's experts at k of n). Read
bandwidth is measured before and after the tests over a working set of that size
(backends/cpu/bandwidth.py, in a child process, the test's threads; on a GPU
backends/cuda/bandwidth.py, at most 1 GiB of device memory), and the higher taken, so bytes per
token x tok/s / bandwidth is the fraction of the roofline reached."""

import os

from ..families.schema import EXPERT_ROLES
from ..model.sizes import attention_layers, state_bytes
from ..weights.build import layer_vectors


def bytes_per_token(cfg, weights, ctx: float, kv_value_bytes: int = 4, seqs: int = 1) -> int:
    """Bytes one decode step reads, per token it makes: every matrix it multiplies by (the embedding
    and Gemma 4's per-layer-input table contribute one row each, the embedding none where it is also
    the output; MoE experts: the n(1 - (1 - k/n)^seqs) distinct ones that `seqs` rows choose, each k of n uniformly and independently), norms and biases, read
    once for the step's `seqs` tokens, each sequence's K and V of ctx cached positions of its
    attention layers (kv_value_bytes each: 4 for f32, 2 for f16) and its linear-attention layers'
    state, read and written."""
    embed_row = 0 if weights.output is weights.embed else weights.embed.nbytes // weights.embed.shape[0]
    ple = weights.per_layer_embed  # per-layer inputs (Gemma 4): the token's row of the table
    ple_row = 0 if ple is None else ple.nbytes // ple.shape[0]
    total = embed_row + ple_row + int(weights.final_norm.nbytes)
    total += sum(t.nbytes for t in weights.tensors()
                 if (t is not weights.embed or t is weights.output) and t is not ple)
    for layer in weights.layers:
        experts = [t for role in EXPERT_ROLES for t in getattr(layer, role)]
        if experts:  # only the chosen experts are read, once however many rows chose them
            total -= sum(t.nbytes for t in experts) * (1 - cfg.experts_per_tok / cfg.num_experts) ** seqs
        total += sum(int(v.nbytes) for v in layer_vectors(layer))
    # each sequence's K and V of its attention layers, and its linear layers' state read and written
    return int(total / seqs + 2 * attention_layers(cfg) * ctx * cfg.kv_dim * kv_value_bytes + 2 * state_bytes(cfg))


def measure_bandwidth(nbytes: int, threads: int) -> float:
    """Read bandwidth (bytes/s) over a working set of nbytes with `threads` threads, in a child
    process (its buffer stays out of this process's peak memory)."""
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-m", "fuelcli.backends.cpu.bandwidth", str(int(nbytes)), str(threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"bandwidth measurement failed: {r.stderr.strip()[-500:]}")
    return float(r.stdout.strip().splitlines()[-1])
