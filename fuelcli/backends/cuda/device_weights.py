"""The model on the device, uploaded once: every weight matrix in one byte buffer as stored (a Q4_K
matrix stays Q4_K), norms and biases in one f32 array, and host-side tables of where things are.

    w8    uint8 [bytes]          matrices, each at a multiple of ALIGN (so rows of float formats are
                                 aligned for their element type), tied embeddings stored once
    mats  int64 [n, 4]           per matrix use: (byte offset, rows, row bytes, format code), a layer's
                                 in the weight schema's order: q, k and v consecutive (one decode
                                 launch runs all three)
    vecs  float32 [n]            norm weights and biases, schema order: a layer's q|k|v biases consecutive
    etab  int64 [L, E, 3]        per layer and expert: rows of `mats` of (gate, up, down)

Kernels take the tables and an index or offset (-1: absent), so a launch passes ints, not arrays.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ...errors import InputError
from ...families.schema import EXPERT_ROLES, MATRICES, VECTORS
from .kernels.common import UNIT

ALIGN = 256


class DeviceWeights:
    def __init__(self, cuda, cfg, weights):
        self._placed = {}  # id(tensor data owner) -> byte offset
        self._chunks = []  # (offset, host bytes)
        self._mats = []
        self._vecs = []
        self._n_vec = 0
        self.size = 0

        self.embed = self._mat(weights.embed)
        self.output = self._mat(weights.output)
        self.final_norm = self._vec(weights.final_norm)
        self.layers = []
        E = max(cfg.num_experts, 1)
        etab = np.zeros((cfg.num_layers, E, len(EXPERT_ROLES)), np.int64)
        for l, w in enumerate(weights.layers):
            # in schema order: q, k, v are consecutive rows of mats, their biases consecutive in vecs
            lw = SimpleNamespace(**{role: self._mat(getattr(w, role)) for role in MATRICES},
                                 **{role: self._vec(getattr(w, role)) for role in VECTORS})
            for e, mats in enumerate(zip(*(getattr(w, role) for role in EXPERT_ROLES))):
                etab[l, e] = [self._mat(t) for t in mats]
            self.layers.append(lw)
        self._upload(cuda, etab)

    def _mat(self, t) -> int:
        if t is None:
            return -1
        rows, cols = t.shape
        if cols % UNIT:
            raise InputError(f"{t.name}: rows of {cols} elements; the cuda backend needs a multiple of {UNIT}")
        data = t.data
        key = (data.__array_interface__["data"][0], data.nbytes)  # tied / shared tensors go up once
        if key not in self._placed:
            self._placed[key] = self.size
            self._chunks.append((self.size, data))
            self.size += -(-data.nbytes // ALIGN) * ALIGN
        self._mats.append((self._placed[key], rows, data.shape[-1], t.format.code))
        return len(self._mats) - 1

    def _vec(self, a) -> int:
        if a is None:
            return -1
        self._vecs.append(np.asarray(a, np.float32).reshape(-1))
        self._n_vec += self._vecs[-1].size
        return self._n_vec - self._vecs[-1].size

    def _upload(self, cuda, etab):
        self.w8 = cuda.device_array(max(self.size, 1), np.uint8)
        for offset, data in self._chunks:
            flat = np.ascontiguousarray(data).reshape(-1)
            self.w8[offset : offset + flat.size].copy_to_device(flat)
        self.mats_host = np.array(self._mats, np.int64).reshape(-1, 4)
        self.mats = cuda.to_device(self.mats_host)
        self.vecs = cuda.to_device(np.concatenate(self._vecs))
        self.etab = [cuda.to_device(etab[l]) for l in range(etab.shape[0])]
        del self._chunks, self._vecs  # the host copies stay where they were (mmap); drop our references

    def rows(self, m: int) -> int:
        return int(self.mats_host[m, 1])
