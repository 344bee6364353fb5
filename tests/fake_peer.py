"""A peer adapter for tests/test_peers.py, built by fuelcli.peers.worker in a child process.

FAKE_PEER_CRASH=METHOD makes that method kill its own process with SIGSEGV, as a llama-cpp-python
built natively on an AMX CPU does in eval."""

import os
import signal
import sys
import time

import numpy as np

from fuelcli.errors import InputError


class FakePeer:
    def __init__(self, threads, **kwargs):
        self.threads, self.kwargs = threads, kwargs
        self._maybe_crash("__init__")

    def _maybe_crash(self, method):
        if os.environ.get("FAKE_PEER_CRASH") == method:
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(10)  # the signal is delivered before this returns

    def info(self):
        return {"version": "0", "threads": self.threads, "detail": "a fake peer",
                "system_info": "none", "torch": "0", "attention": "none"}

    # bench
    def prepare(self, depth_ids, seqs=1):
        self._maybe_crash("prepare")

    def pp(self, ids):
        self._maybe_crash("pp")
        return 0.5

    def tg(self, ids):
        self._maybe_crash("tg")
        return 0.25

    # oracle (llama.cpp's calls): zero logits of the model's vocabulary
    def clear(self):
        pass

    def logits(self, block, start):
        self._maybe_crash("logits")
        return np.zeros((len(block), self.kwargs.get("vocab", 49152)), np.float32), 0.01

    # for the protocol's own tests
    def echo(self, *args):
        return args

    def numba_loaded(self):
        return "numba" in sys.modules or "torch" in sys.modules

    def fail(self, kind):
        if kind == "input":
            raise InputError("the fake peer refuses this input")
        raise ValueError("something inside the peer went wrong")
