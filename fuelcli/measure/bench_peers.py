"""Peers (`fuel bench --compare`): llama.cpp (GGUF only) and transformers (float32), each in a
process of its own (fuelcli/peers/): its threads never share fuel's process, and its crash is an
error line (exit 5)."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .bench_spec import TestSpec, seqs_needed


class PeerRunner:
    """A peer (fuelcli/peers/) in a process of its own: prepare, pp and tg run there and time only
    their own calls, so neither the messages nor fuel's thread pool are in its seconds."""

    def __init__(self, kind, threads: int, **kwargs):
        from ..peers.child import PeerProcess

        self.process = PeerProcess(kind, threads, **kwargs)
        info = self.process.info
        self.name, self.detail, self.threads = kind.name, info["detail"], info["threads"]

    def prepare(self, depth_ids: np.ndarray, seqs: int = 1):
        self.process.call("prepare", depth_ids, seqs)

    def pp(self, ids: np.ndarray) -> float:
        return self.process.call("pp", ids)

    def tg(self, ids: np.ndarray) -> float:
        return self.process.call("tg", ids)

    def peak_rss_bytes(self) -> int:
        return self.process.peak_rss_bytes()

    def close(self):
        self.process.close()


def start_peer(kind, source, threads: int, n_ctx: int, tests: list[TestSpec]) -> PeerRunner:
    """The peer's runner on the model: llama.cpp with a batch that holds the largest pp test (and,
    for tests of several sequences, a context that holds them)."""
    if kind.name == "llama.cpp":
        n_batch = max([512] + [t.n_tokens for t in tests if t.kind == "pp"])
        return PeerRunner(kind, threads, path=str(source.path), name=source.name, n_ctx=n_ctx, n_batch=n_batch,
                          seqs=seqs_needed(tests))
    return PeerRunner(kind, threads, path=str(source.path), source_kind=source.kind, name=source.name)


def check_peer(peer: str, source_kind: str):
    """--compare's peer, installed and able to read the model, before anything heavy loads."""
    from ..peers import require

    kind = require(peer, "--compare")
    if peer == "llama.cpp" and source_kind != "gguf":
        raise InputError("--compare llama.cpp needs a GGUF model (llama.cpp reads only GGUF); "
                         "use --compare transformers for a model directory")
    return kind
