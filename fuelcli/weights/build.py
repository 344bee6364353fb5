"""ModelWeights: every weight of the shared decoder under one set of names, whatever the file.

Matrices stay `Tensor`s in their stored format; norms and biases (tiny) are widened to f32 once.
Experts are one 2-D Tensor per expert (views of a stacked tensor where the file stacks them).
"""

from dataclasses import dataclass, field, make_dataclass

import numpy as np

from ..errors import InputError
from ..families.schema import (DECODER, EXPERT_ROLES, EXPERTS, MATRICES, MATRIX, NORM, VECTOR, VECTORS, Elementwise,
                               Fused, Regroup, Schema, Weight)
from ..formats import dequantize, quantize, row_bytes
from ..model.config import ModelConfig
from .tensor import Tensor


LayerWeights = make_dataclass(
    "LayerWeights",
    [(w.role, object, field(default_factory=list) if w.kind == EXPERTS else field(default=None))
     for w in DECODER.layer],
)
LayerWeights.__doc__ = """A layer's weights by role (families/schema.py): matrices as stored Tensors, norms and
biases as f32 vectors, experts as lists of per-expert Tensors; None (experts: []) where it has none."""


@dataclass
class ModelWeights:
    embed: Tensor
    output: Tensor  # the same object as embed when tied: no second copy
    final_norm: np.ndarray
    layers: list
    vector_names: dict = field(default_factory=dict)  # id(f32 vector) -> its name in the file (messages)
    # per-layer inputs (Schema.per_layer_inputs; None without): the packed table, the projection, its norm
    per_layer_embed: Tensor | None = None
    per_layer_proj: Tensor | None = None
    per_layer_proj_norm: np.ndarray | None = None

    def tensors(self):
        """Every distinct stored matrix once (tied embeddings counted once)."""
        seen = {}
        for t in [self.embed, self.output] + [t for t in (self.per_layer_embed, self.per_layer_proj) if t is not None]:
            seen[id(t)] = t
        for layer in self.layers:
            for t in layer_matrices(layer):
                seen[id(t)] = t
        return list(seen.values())


def layer_matrices(layer) -> list:
    """A layer's stored matrices, experts' included, in schema order."""
    out = [getattr(layer, role) for role in MATRICES]
    return [t for t in out if t is not None] + [t for role in EXPERT_ROLES for t in getattr(layer, role)]


def layer_vectors(layer) -> list:
    """A layer's f32 norms and biases, in schema order."""
    return [v for v in (getattr(layer, role) for role in VECTORS) if v is not None]


def expert_views(t: Tensor) -> list:
    """Split a stacked [E, rows, cols] tensor into per-expert 2-D views (no copy)."""
    return [Tensor(f"{t.name}[{e}]", t.fmt, t.shape[1:], t.data[e]) for e in range(t.shape[0])]


def row_slice(t: Tensor, start: int, stop: int) -> Tensor:
    """Rows start:stop of every expert of a stacked tensor (a view): splits fused gate_up."""
    return Tensor(f"{t.name}[{start}:{stop}]", t.fmt, t.shape[:-2] + (stop - start, t.shape[-1]),
                  t.data[..., start:stop, :])


class Lookup:
    """Takes tensors by name from a file's table, checking shapes against the config.

    The table may carry `unsupported` (name -> stored dtype) for tensors the reader skipped; asking
    for one of those is an error naming its dtype, asking for none of them is fine (buffers such as
    an I64 position_ids). Every name taken is remembered, so tensors nobody took can be refused."""

    def __init__(self, tensors: dict, where: str):
        self.tensors, self.where = tensors, where
        self.unsupported = getattr(tensors, "unsupported", {})
        self.taken: set = set()
        self.vector_names: dict = {}

    def has(self, name: str) -> bool:
        return name in self.tensors or name in self.unsupported

    def matrix(self, name: str, shape: tuple) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            if name in self.unsupported:
                raise InputError(f"{self.where}: tensor {name} has dtype {self.unsupported[name]}, "
                                 f"which fuel does not read")
            raise InputError(f"{self.where}: missing tensor {name}")
        if tuple(t.shape) != tuple(shape):
            raise InputError(f"{self.where}: tensor {name} has shape {list(t.shape)}, the config implies {list(shape)}")
        self.taken.add(name)
        return t

    def vector(self, name: str, shape: int | tuple, add: float = 0.0) -> np.ndarray:
        """A norm, bias or other small array (of n or `shape` values) widened to f32, plus `add` (a
        norm's offset: a new array then)."""
        t = self.matrix(name, (shape,) if isinstance(shape, int) else shape)
        v = np.ascontiguousarray(dequantize(t), dtype=np.float32)
        if add:
            v = (v + np.float32(add)).astype(np.float32)
        self.vector_names[id(v)] = name
        return v

    def check_no_extra_layers(self, prefix: str, cfg: ModelConfig, key: str, not_run: tuple = ()):
        """Error if the file holds tensors of a layer index >= cfg.num_layers (`{prefix}{L}.`), other
        than those under the `not_run` prefixes."""
        extra = {}
        for name in list(self.tensors) + list(self.unsupported):
            if name.startswith(prefix) and not name.startswith(not_run):
                index = name[len(prefix):].split(".", 1)[0]
                if index.isdigit() and int(index) >= cfg.num_layers:
                    extra.setdefault(int(index), name)
        if extra:
            top = max(extra)
            raise InputError(f"{self.where}: the weights hold {top + 1} layers ({extra[top]} exists) but "
                             f"{key}={cfg.num_layers}")

    def check_all_taken(self, cfg: ModelConfig, ignorable: tuple, not_run: tuple = ()):
        """Error on a weight no part of the decoder took: it may carry a feature the config does not
        describe (an o_proj bias, a norm fuel lacks), and ignoring it would give wrong output quietly.
        Names ending in `ignorable` or starting with a `not_run` prefix are known and left alone."""
        left = sorted(n for n in self.tensors if n not in self.taken and not n.endswith(ignorable)
                      and not n.startswith(not_run))
        if left:
            more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
            raise InputError(f"{self.where}: tensor {left[0]}{more} is not a weight of a {cfg.family} model with "
                             f"this config; fuel refuses rather than ignore it")


def _check_stored_head(w: Lookup, name: str, embed: Tensor):
    """tie_word_embeddings with an output matrix stored too: the same bytes are harmless; different
    ones are refused, because the peers disagree on which is meant (transformers 5 keeps the stored
    head and warns, vLLM and mlx-lm drop it for the embedding)."""
    head = w.matrix(name, embed.shape)
    if head.fmt != embed.fmt or not np.array_equal(head.data, embed.data):
        raise InputError(f"{w.where}: tie_word_embeddings is true but the file stores a {name} that differs from "
                         f"{embed.name} (transformers would use {name}, vLLM and mlx-lm the embedding); set "
                         "tie_word_embeddings to what the checkpoint means")


def _split_rows(t: Tensor, sizes: list) -> list:
    """A fused tensor's row blocks (q|k|v, gate|up; per expert too) as views."""
    out, start = [], 0
    for size in sizes:
        out.append(row_slice(t, start, start + size))
        start += size
    return out


def _deinterleave(t: Tensor, groups: int, sizes: list) -> list:
    """Each part's rows of a tensor that stores, group by group, every part's rows in turn (per
    expert where stacked; copies: a part's rows are not contiguous there)."""
    per = [size // groups for size in sizes]
    lead = t.data.shape[:-2]
    data = t.data.reshape(lead + (groups, sum(per), t.data.shape[-1]))
    out, start = [], 0
    for size, n in zip(sizes, per):
        part = np.ascontiguousarray(data[..., start:start + n, :]).reshape(lead + (size, t.data.shape[-1]))
        part.flags.writeable = False  # as read-only as the mmap'd weights beside it
        out.append(Tensor(f"{t.name}[{start}::{sum(per)}]", t.fmt, t.shape[:-2] + (size, t.shape[-1]), part))
        start += n
    return out


def _split_vector(v: np.ndarray, sizes: list, groups: int | None) -> list:
    """An f32 array's parts along its last axis: group by group in turn (one group: in order)."""
    groups = groups or 1
    per = [size // groups for size in sizes]
    grouped = v.reshape(v.shape[:-1] + (groups, sum(per)))
    bounds = np.cumsum([0] + per)
    return [np.ascontiguousarray(grouped[..., a:b]).reshape(v.shape[:-1] + (size,))
            for a, b, size in zip(bounds[:-1], bounds[1:], sizes)]


def transposed(t: Tensor) -> Tensor:
    """A matrix stored [..., cols, rows] (x @ W) as [..., rows, cols] (a copy); element formats only:
    a block format's blocks run along the stored rows and cannot be turned."""
    if t.format.block_elems != 1:
        raise InputError(f"tensor {t.name} is stored transposed in {t.fmt}, whose blocks fuel cannot transpose")
    *lead, a, b = t.shape
    size = t.format.block_bytes
    data = np.ascontiguousarray(t.data.reshape(*lead, a, b, size).swapaxes(-3, -2)).reshape(*lead, b, a * size)
    data.flags.writeable = False
    return Tensor(f"{t.name}.T", t.fmt, (*lead, b, a), data)


def _take_units(a: np.ndarray, axis: int, start: int, unit: int, order) -> np.ndarray:
    """a with its units of `unit` along `axis` from `start` on taken in `order` (a read-only copy)."""
    a = np.moveaxis(a, axis, 0)
    tail = a[start:]
    tail = tail.reshape(len(order), unit, *tail.shape[1:])[order].reshape(tail.shape)
    out = np.ascontiguousarray(np.moveaxis(np.concatenate([a[:start], tail]), 0, axis))
    out.flags.writeable = False  # as read-only as the mmap'd weights beside it
    return out


def _regroup(value, r: Regroup, cfg):
    """Undo a Regroup on a stored Tensor (rows are independent byte rows in every format; columns
    move as whole blocks where units align with the format's blocks, else the matrix is widened to
    f32: the loader moves the input instead, _input_order) or on an f32 array."""
    order = np.asarray(r.order(cfg))
    if (order == np.arange(len(order))).all():
        return value
    unit, start = r.unit(cfg), r.start(cfg)
    if not isinstance(value, Tensor):
        return _take_units(value, r.axis, start, unit, order)
    block = value.format.block_elems
    if r.axis == 0:
        data = _take_units(value.data, 0, start, unit, order)
    elif unit % block == 0 and start % block == 0:
        data = _take_units(value.data, 1, row_bytes(value.fmt, start) if start else 0, row_bytes(value.fmt, unit), order)
    else:
        raw = quantize("f32", _take_units(dequantize(value), 1, start, unit, order))
        raw.flags.writeable = False
        return Tensor(value.name, "f32", value.shape, raw)
    return Tensor(value.name, value.fmt, value.shape, data)


def _input_order(t: Tensor, r: Regroup, cfg) -> Tensor:
    """A column regroup whose units split the format's blocks (Qwen3.5's ssm_out: heads of 128
    columns, K-quant blocks of 256) undone on the input instead: the weight stays as stored, in its
    format, and says which input column each stored column takes (Tensor.columns)."""
    taken = _take_units(np.arange(t.shape[-1]), 0, r.start(cfg), r.unit(cfg), np.asarray(r.order(cfg)))
    columns = np.argsort(taken)  # taken[m]: the stored column of model column m
    columns.flags.writeable = False
    return Tensor(t.name, t.fmt, t.shape, t.data, columns)


def _splits_blocks(value, r: Regroup, cfg) -> bool:
    """A column regroup of a stored matrix whose units are not whole blocks of its format."""
    if not isinstance(value, Tensor) or r.axis != 1:
        return False
    order, block = np.asarray(r.order(cfg)), value.format.block_elems
    return not (order == np.arange(len(order))).all() and (r.unit(cfg) % block != 0 or r.start(cfg) % block != 0)


def _undo(value, step, cfg):
    if isinstance(step, Elementwise):
        return np.ascontiguousarray(step.undo(value), dtype=np.float32)
    if _splits_blocks(value, step, cfg):
        return _input_order(value, step, cfg)
    return _regroup(value, step, cfg)


class _LayerReader:
    """Reads one layer's tensors from a file kind ("hf" or "gguf") as the family's schema says."""

    def __init__(self, w: Lookup, schema: Schema, kind: str, cfg: ModelConfig, fix_qk):
        self.w, self.schema, self.kind, self.cfg, self.fix = w, schema, kind, cfg, fix_qk
        self.offset = cfg.norm_offset - schema.norm_shift(kind)

    def weight(self, spec: Weight, i: int, name: str | None = None):
        """The role's value in layer i (name: where the file keeps it, when not spec's own)."""
        name = name or spec.name(self.kind, i=i)
        shape = spec.shape(self.cfg)
        if spec.kind == EXPERTS:
            if "{e}" in name:  # one matrix per expert
                return [self.w.matrix(name.format(e=e), shape[1:]) for e in range(shape[0])]
            return expert_views(self.stored(name, shape, spec.hf_transposed))
        if spec.kind == MATRIX:
            return self.transform(spec, self.stored(name, shape, spec.hf_transposed))
        stored = spec.hf_shape(self.cfg) if self.kind == "hf" and spec.hf_shape else shape
        value = self.w.vector(name, stored, add=self.offset if spec.kind == NORM else 0.0)
        return self.transform(spec, value.reshape(shape) if stored != shape else value)

    def stored(self, name: str, shape: tuple, hf_transposed: bool) -> Tensor:
        """A matrix of `shape`, turned where HF files store it transposed."""
        if not (hf_transposed and self.kind == "hf"):
            return self.w.matrix(name, shape)
        return transposed(self.w.matrix(name, shape[:-2] + (shape[-1], shape[-2])))

    def transform(self, spec: Weight, value):
        name = self.w.vector_names.get(id(value))
        for step in spec.undo.get(self.kind, ()):
            value = _undo(value, step, self.cfg)
        if name is not None:
            self.w.vector_names[id(value)] = name
        return value if self.fix is None or spec.heads is None else self.fix(value, spec.heads(self.cfg))

    def fused(self, f: Fused, parts: list, i: int) -> dict | None:
        """{role: value} of a fused tensor's parts, or None when this file kind keeps them apart."""
        name = getattr(f, self.kind)
        if name is None or (f.optional and not self.w.has(name.format(i=i))):
            return None
        shapes = [p.shape(self.cfg) for p in parts]
        groups = f.interleaved(self.cfg) if f.interleaved else None
        if all(p.kind == VECTOR for p in parts):
            stacked = shapes[0][:-1] + (sum(s[-1] for s in shapes),)
            views = _split_vector(self.w.vector(name.format(i=i), stacked), [s[-1] for s in shapes], groups)
            for p, v in zip(parts, views):
                self.w.vector_names[id(v)] = f"{name.format(i=i)} ({p.role})"
            return {p.role: v for p, v in zip(parts, views)}
        stacked = shapes[0][:-2] + (sum(s[-2] for s in shapes), shapes[0][-1])
        fused = self.stored(name.format(i=i), stacked, f.hf_transposed)
        if f.interleaved:
            views = _deinterleave(fused, groups, [s[-2] for s in shapes])
        else:
            views = _split_rows(fused, [s[-2] for s in shapes])
        out = {p.role: expert_views(v) if p.kind == EXPERTS else self.transform(p, v) for p, v in zip(parts, views)}
        by_role = {p.role: p for p in self.schema.layer}
        for role, exact in f.with_names.items():
            out[role] = self.weight(by_role[role], i, exact.format(i=i))
        return out

    def layer(self, i: int, block) -> LayerWeights:
        cfg = self.cfg.at(block)
        if cfg is not self.cfg:  # the layer's own geometry sizes its weights
            return _LayerReader(self.w, self.schema, self.kind, cfg, self.fix).layer(i, block)
        present = [spec for spec in self.schema.layer if spec.when(block)]
        by_role = {spec.role: spec for spec in present}
        values = {}
        for spec in present:
            if spec.role in values:
                continue
            for f in self.schema.fused:
                if spec.role in f.parts and all(p in by_role for p in f.parts):
                    values.update(self.fused(f, [by_role[p] for p in f.parts], i) or {})
            if spec.role not in values:
                values[spec.role] = self.weight(spec, i)
        return LayerWeights(**values)


def build_weights(w: Lookup, schema: Schema, kind: str, cfg: ModelConfig, fix_qk=None) -> ModelWeights:
    """The one place that reads a model's weights: the family's schema for this file kind ("hf" or
    "gguf"), shapes checked against the config.

    fix_qk(array, n_heads) -> array, applied to the rows of weights with `heads` (GGUF llama's
    un-permute), or None. Norm weights get the model's norm_offset (less what the file already
    added) here, once.
    """
    reader = _LayerReader(w, schema, kind, cfg, fix_qk)
    embed_spec, output_spec, norm_spec = schema.model
    embed = reader.weight(embed_spec, 0)
    output_name = output_spec.name(kind)
    if cfg.tie_embeddings:
        output = embed  # the same object: no second copy
        if w.has(output_name):
            _check_stored_head(w, output_name, embed)
    else:
        output = reader.weight(output_spec, 0)
    layers = [reader.layer(i, block) for i, block in enumerate(cfg.blocks)]
    inputs = {spec.role: reader.weight(spec, 0) for spec in schema.per_layer_inputs} if cfg.per_layer_input_size else {}
    weights = ModelWeights(embed=embed, output=output, final_norm=reader.weight(norm_spec, 0), layers=layers,
                           vector_names=w.vector_names, **inputs)
    not_run = tuple(prefix for prefix, _ in schema.not_run)
    w.check_no_extra_layers(schema.layer_prefix[kind], cfg, schema.layer_count_key[kind], not_run)
    w.check_all_taken(cfg, schema.ignorable, not_run)
    return weights
