"""Own GGUF reader: a fast header parser plus zero-copy tensor views into one read-only mmap.

Why not gguf.GGUFReader: it builds numpy objects for every field part, which takes ~11 s on a
151k-token vocabulary. Here string arrays are walked with struct on the raw buffer, numeric arrays
are one np.frombuffer each, and tensor data is never read until a kernel touches it.

Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor count, u64 kv count,
kv pairs (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 dims[n_dims]
in ggml order ne0 first, u32 ggml type, u64 offset relative to the data section), then the data
section at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..formats import BY_GGML_TYPE, FORMATS, GGML_TYPE_NAMES
from .tensor import Tensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF value type id -> (struct code, numpy dtype) for fixed-size scalars.
_SCALAR = {
    0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
    4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
    10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass
class GGUFFile:
    path: str
    version: int
    alignment: int
    meta: dict[str, object]
    tensors: dict[str, Tensor]
    data_offset: int = 0  # file offset of the data section
    _mmap: object = field(default=None, repr=False)  # kept so the views stay valid


class _Truncated(Exception):
    """Internal: the header ran past the end of the file."""


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    __slots__ = ("buf", "pos", "size")

    def __init__(self, buf, size: int):
        self.buf, self.pos, self.size = buf, 0, size

    def take(self, n: int) -> int:
        """Advance by n bytes and return the start offset."""
        p = self.pos
        if n < 0 or p + n > self.size:
            raise _Truncated
        self.pos = p + n
        return p

    def u32(self) -> int:
        return _U32.unpack_from(self.buf, self.take(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.buf, self.take(8))[0]

    def string(self) -> str:
        n = self.u64()
        p = self.take(n)
        return _decode(self.buf[p : p + n])

    def scalar(self, vtype: int):
        code, dt = _SCALAR[vtype]
        v = struct.unpack_from(code, self.buf, self.take(np.dtype(dt).itemsize))[0]
        return v

    def strings(self, count: int) -> list[str]:
        """A string array: the vocab and merges, so this is the hot loop of header parsing."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = _U64.unpack_from
        raw = []
        append = raw.append
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated
            n = unpack(buf, pos)[0]
            pos += 8
            end = pos + n
            if end > size:
                raise _Truncated
            append(buf[pos:end])
            pos = end
        self.pos = pos
        try:  # one join + split is much faster than decoding 150k items one by one
            joined = b"\x00".join(raw).decode("utf-8")
            if joined.count("\x00") == len(raw) - 1:
                return joined.split("\x00") if raw else []
        except UnicodeDecodeError:
            pass
        return [_decode(b) for b in raw]

    def value(self, vtype: int):
        if vtype in _SCALAR:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.u32(), self.u64()
            if etype in _SCALAR:
                dt = np.dtype(_SCALAR[etype][1]).newbyteorder("<")
                p = self.take(count * dt.itemsize)
                return np.frombuffer(self.buf, dtype=dt, count=count, offset=p).tolist()
            if etype == _STRING:
                return self.strings(count)
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            raise ValueError(f"unknown array element type {etype}")
        raise ValueError(f"unknown value type {vtype}")


def _decode(b: bytes) -> str:
    # Token strings should be UTF-8; a stray invalid byte must not make the file unreadable.
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("utf-8", errors="replace")


def read_gguf(path: str | os.PathLike, tensors: bool = True) -> GGUFFile:
    """Parse the header of a GGUF file and map its tensors without copying their data. With
    tensors=False only the metadata is read (a tokenizer needs nothing else): no tensor is listed or
    checked, so a vocabulary-only file or one with tensor types fuel cannot run still opens."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 8:  # magic + version
                raise InputError(f"{path}: truncated GGUF file ({size} bytes)")
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise InputError(f"{path}: cannot open: {e.strerror or e}") from None

    if mm[:4] != GGUF_MAGIC:
        raise InputError(f"{path}: not a GGUF file (magic {bytes(mm[:4])!r}, expected b'GGUF')")
    cur = _Cursor(mm, size)
    cur.take(4)
    version = cur.u32()
    if version not in SUPPORTED_VERSIONS:
        raise InputError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")

    try:  # every read below is bounds-checked: running off the end means a cut file
        n_tensors, n_kv = cur.u64(), cur.u64()
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key = cur.string()
            meta[key] = cur.value(cur.u32())
        if not tensors:
            return GGUFFile(path=path, version=version, alignment=DEFAULT_ALIGNMENT, meta=meta, tensors={}, _mmap=mm)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            if n_dims > 8:
                raise ValueError(f"tensor {name!r} has {n_dims} dims")
            dims = [cur.u64() for _ in range(n_dims)]
            infos.append((name, dims, cur.u32(), cur.u64()))
    except _Truncated:
        raise InputError(f"{path}: truncated GGUF file (header ends past the file's {size} bytes)") from None
    except (ValueError, KeyError, struct.error) as e:
        raise InputError(f"{path}: corrupt GGUF header ({e})") from None

    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise InputError(f"{path}: bad general.alignment {alignment!r}")
    data_offset = -(-cur.pos // alignment) * alignment

    whole = np.frombuffer(mm, dtype=np.uint8)  # read-only view of the whole file
    views: dict[str, Tensor] = {}
    supported = ", ".join(FORMATS)
    for name, dims, gtype, offset in infos:
        fmt = BY_GGML_TYPE.get(gtype)
        if fmt is None:
            tname = GGML_TYPE_NAMES.get(gtype, f"type {gtype}")
            raise InputError(f"{path}: tensor {name!r} has unsupported type {tname} (supported: {supported})")
        shape = tuple(int(d) for d in reversed(dims)) or (1,)
        ncols = shape[-1]
        if ncols % fmt.block_elems:
            raise InputError(
                f"{path}: tensor {name!r} row of {ncols} is not a multiple of the {fmt.name} block ({fmt.block_elems})"
            )
        rb = ncols // fmt.block_elems * fmt.block_bytes
        nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * rb
        start = data_offset + offset
        if start + nbytes > size:
            raise InputError(
                f"{path}: tensor {name!r} data [{start}, {start + nbytes}) lies outside the file "
                f"({size} bytes; truncated file or bad offset)"
            )
        if name in views:
            raise InputError(f"{path}: tensor {name!r} appears twice")
        data = whole[start : start + nbytes].reshape(shape[:-1] + (rb,))
        views[name] = Tensor(name=name, fmt=fmt.name, shape=shape, data=data)

    return GGUFFile(
        path=path, version=version, alignment=alignment, meta=meta, tensors=views,
        data_offset=data_offset, _mmap=mm,
    )
