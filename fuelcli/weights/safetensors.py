"""safetensors reader: header parsed here, data left in the file as uint8 views of one mmap.

bf16, f16 and f32 stay in their own width (numpy has no bf16; kernels widen on the fly).
"""

import json
import struct
from pathlib import Path

import numpy as np

from ..errors import InputError
from .tensor import Tensor

DTYPES = {"F32": ("f32", 4), "F16": ("f16", 2), "BF16": ("bf16", 2)}


def read_safetensors(path: Path) -> dict[str, Tensor]:
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
    data = np.memmap(path, dtype=np.uint8, mode="r") if size > 8 + n else np.zeros(0, np.uint8)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        if dtype not in DTYPES:
            raise InputError(f"{path.name}: tensor {name} has dtype {dtype}; supported: {', '.join(DTYPES)}")
        fmt, itemsize = DTYPES[dtype]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (8 + n + int(o) for o in info["data_offsets"])
        if end > size or end - begin != int(np.prod(shape)) * itemsize:
            raise InputError(f"{path.name}: tensor {name} data lies outside the file or has the wrong size")
        raw = np.asarray(data[begin:end])  # a plain ndarray view, no copy
        row_shape = shape[:-1] + (shape[-1] * itemsize,) if shape else (itemsize,)
        tensors[name] = Tensor(name, fmt, shape, raw.reshape(row_shape))
    return tensors


def read_checkpoint(model_dir: Path) -> dict[str, Tensor]:
    """A single model.safetensors, or the shards named by model.safetensors.index.json."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError):
            raise InputError(f"{index} has no valid weight_map") from None
        files = [model_dir / s for s in shards]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InputError(f"{model_dir}: no *.safetensors weights found")
    tensors = {}
    for f in files:
        if not f.exists():
            raise InputError(f"{model_dir}: shard {f.name} named in the index is missing")
        tensors.update(read_safetensors(f))
    return tensors
