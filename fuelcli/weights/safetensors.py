"""safetensors reader: header parsed here, data left in the file as uint8 views of one mmap.

bf16, f16 and f32 stay in their own width (numpy has no bf16; kernels widen on the fly).
Tensors of other dtypes (e.g. an I64 position buffer) are skipped, not fatal: the table remembers
their names and dtypes, and `Lookup` names them if the model turns out to need one.
"""

import json
import struct
from pathlib import Path

import numpy as np

from ..errors import InputError
from .tensor import Tensor

DTYPES = {"F32": ("f32", 4), "F16": ("f16", 2), "BF16": ("bf16", 2)}


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
    """One header entry -> (dtype, shape, begin, end); raises ValueError with the reason."""
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
    return dtype, tuple(shape), begin, end


def read_safetensors(path: Path) -> TensorTable:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InputError(f"{path.name}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise InputError(f"{path.name}: header length {n} exceeds the file size {size}")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise InputError(f"{path.name}: safetensors header is not valid JSON") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    if not isinstance(header, dict):
        raise InputError(f"{path.name}: safetensors header is a JSON {type(header).__name__}, not an object")
    data = np.memmap(path, dtype=np.uint8, mode="r") if size > 8 + n else np.zeros(0, np.uint8)
    tensors = TensorTable()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, begin, end = _entry(name, info, 8 + n, size)
        except ValueError as e:
            raise InputError(f"{path.name}: tensor {name}: malformed header entry: {e}") from None
        if dtype not in DTYPES:
            tensors.unsupported[name] = dtype  # fatal only if the model needs it (Lookup says so)
            continue
        fmt, itemsize = DTYPES[dtype]
        if end - begin != int(np.prod(shape, dtype=np.int64)) * itemsize:
            raise InputError(f"{path.name}: tensor {name} data lies outside the file or has the wrong size")
        raw = np.asarray(data[begin:end])  # a plain ndarray view, no copy
        row_shape = shape[:-1] + (shape[-1] * itemsize,) if shape else (itemsize,)
        tensors[name] = Tensor(name, fmt, shape, raw.reshape(row_shape))
    return tensors


def read_checkpoint(model_dir: Path) -> TensorTable:
    """A single model.safetensors, or the shards named by model.safetensors.index.json."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise InputError(f"{index} has no valid weight_map") from None
        except OSError as e:
            raise InputError(f"{index}: cannot read: {e.strerror or e}") from None
        if not isinstance(weight_map, dict):
            raise InputError(f"{index}: weight_map is not a JSON object")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard:
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
        tensors.update(read_safetensors(f))
    return tensors
