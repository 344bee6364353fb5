"""safetensors reader: header parsed here, data left in the file as uint8 views of one mmap.

bf16, f16 and f32 stay in their own width (numpy has no bf16; kernels widen on the fly).
Tensors of other dtypes (e.g. an I64 position buffer) are skipped, not fatal: the table remembers
their names and dtypes, and `Lookup` names them if the model turns out to need one.

The header is held to the format's rules as the safetensors library checks them: at most 100 MB of
JSON, every entry's bytes exactly its dtype × shape, and the entries tiling the data section in
order, no overlap, no hole, nothing after the last one.
"""

import math
import os
import stat
import struct
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..fileio.files import open_regular
from ..fileio.jsondoc import parse_object, read_object
from .tensor import Tensor

DTYPES = {"F32": ("f32", 4), "F16": ("f16", 2), "BF16": ("bf16", 2)}
# bytes per element of the dtypes fuel skips, so their entries are size-checked too
OTHER_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1,
                     "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


class TensorTable(dict):
    """name -> Tensor, plus `unsupported`: name -> stored dtype of each tensor that was skipped."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.unsupported: dict[str, str] = {}

    def update(self, other=(), **kw):
        super().update(other, **kw)
        self.unsupported.update(getattr(other, "unsupported", {}))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entry(name: str, info, base: int, size: int) -> tuple:
    """One header entry -> (dtype, shape, begin, end) as file offsets; raises ValueError with the
    reason. Python integers throughout: a dimension of 2^63 or a product past int64 cannot wrap."""
    if not isinstance(info, dict):
        raise ValueError(f"entry is {type(info).__name__}, not an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise ValueError(f"entry has no {key!r}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str):
        raise ValueError(f"dtype {dtype!r} is not a string")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ValueError(f"shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]):
        raise ValueError(f"data_offsets {offsets!r} are not two ascending non-negative integers")
    begin, end = base + offsets[0], base + offsets[1]
    if end > size:
        raise ValueError("data lies outside the file")
    itemsize = DTYPES[dtype][1] if dtype in DTYPES else OTHER_DTYPE_BYTES.get(dtype)
    if itemsize is not None and end - begin != math.prod(shape) * itemsize:
        raise ValueError(f"data_offsets span {end - begin} bytes but {dtype} × shape {shape} is "
                         f"{math.prod(shape) * itemsize} (the data lies outside the file or has the wrong size)")
    return dtype, tuple(shape), begin, end


def _check_tiling(name: str, spans: list, data_bytes: int):
    """The entries must cover the data section exactly, in order (the format forbids overlaps and holes:
    two tensors sharing bytes would silently alias)."""
    at, prev = 0, None
    for begin, end, tensor in sorted(spans):
        if begin < at:
            raise InputError(f"{name}: tensors {prev} and {tensor} overlap (data_offsets {begin} < {at})")
        if begin > at:
            raise InputError(f"{name}: {begin - at} bytes before tensor {tensor} belong to no tensor "
                             "(data_offsets must tile the data section)")
        at, prev = end, tensor
    if at != data_bytes:
        raise InputError(f"{name}: {data_bytes - at} bytes after the last tensor belong to no tensor "
                         "(truncated header or trailing data)")


def read_safetensors(path: Path) -> TensorTable:
    with open_regular(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise InputError(f"{path.name}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise InputError(f"{path.name}: header length {n} exceeds the file size {size}")
            if n > MAX_HEADER_BYTES:
                raise InputError(f"{path.name}: header length {n} is over the format's limit of {MAX_HEADER_BYTES}")
            raw_header = f.read(n)
            data = np.memmap(f, dtype=np.uint8, mode="r") if size > 8 + n else np.zeros(0, np.uint8)
        except OSError as e:
            raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    header = parse_object(raw_header, f"{path.name}: safetensors header")
    tensors = TensorTable()
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, begin, end = _entry(name, info, 8 + n, size)
        except ValueError as e:
            raise InputError(f"{path.name}: tensor {name}: malformed header entry: {e}") from None
        spans.append((begin - 8 - n, end - 8 - n, name))
        if dtype not in DTYPES:
            tensors.unsupported[name] = dtype  # fatal only if the model needs it (Lookup says so)
            continue
        fmt, itemsize = DTYPES[dtype]
        raw = np.asarray(data[begin:end])  # a plain ndarray view, no copy
        row_shape = shape[:-1] + (shape[-1] * itemsize,) if shape else (itemsize,)
        tensors[name] = Tensor(name, fmt, shape, raw.reshape(row_shape))
    _check_tiling(path.name, spans, size - 8 - n)
    return tensors


def read_checkpoint(model_dir: Path) -> TensorTable:
    """A single model.safetensors, or the shards named by model.safetensors.index.json."""
    index = model_dir / "model.safetensors.index.json"
    doc = read_object(index, required=False)
    if doc is not None:
        if "weight_map" not in doc:
            raise InputError(f"{index} has no valid weight_map")
        weight_map = doc["weight_map"]
        if not isinstance(weight_map, dict):
            raise InputError(f"{index}: weight_map is not a JSON object")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or Path(shard).name != shard or shard in (".", ".."):
                raise InputError(f"{index}: weight_map entry for tensor {name} is {shard!r}, not a shard file name")
        files = [model_dir / s for s in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InputError(f"{model_dir}: no *.safetensors weights found")
    tensors = TensorTable()
    for f in files:
        if not f.exists():
            raise InputError(f"{model_dir}: shard {f.name} named in the index is missing")
        table = read_safetensors(f)
        twice = next((k for k in [*table, *table.unsupported] if k in tensors or k in tensors.unsupported), None)
        if twice is not None:
            raise InputError(f"{model_dir}: tensor {twice} is in more than one shard (again in {f.name})")
        tensors.update(table)
    return tensors


def checkpoint_bytes(model_dir: Path) -> int | None:
    """The size of a directory's *.safetensors files (a bound on its weights); None when it has none."""
    sizes = []
    for f in model_dir.glob("*.safetensors"):
        try:
            st = f.stat()
        except OSError:
            return None  # reading it will say what is wrong
        if not stat.S_ISREG(st.st_mode):
            return None  # a FIFO, a directory: reading it will say so
        sizes.append(st.st_size)
    return sum(sizes) if sizes else None
