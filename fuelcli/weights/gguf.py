"""Own GGUF reader: a fast header parser plus zero-copy tensor views into one read-only mmap.

Why not gguf.GGUFReader: it builds numpy objects for every field part, which takes ~11 s on a
151k-token vocabulary. Here string arrays are walked with struct on the raw buffer, numeric arrays
are one np.frombuffer each, and tensor data is never read until a kernel touches it.

Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor count, u64 kv count,
kv pairs (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 dims[n_dims]
in ggml order ne0 first, u32 ggml type, u64 offset relative to the data section), then the data
section at the next multiple of `general.alignment` (default 32).

A split model (llama.cpp's gguf-split, convert_hf_to_gguf --split-max-size) is one GGUF per part,
named NAME-00001-of-0000N.gguf: the first carries the metadata, every part carries `split.no`
(0-based), `split.count` and `split.tensors.count` and its own tensor table and data. The parts'
tables merge into one; a part missing, out of place or disagreeing is an error naming the file.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..formats import BY_GGML_TYPE, FORMATS, GGML_TYPE_NAMES
from ..fileio.files import is_present, open_regular
from . import gguf_cache
from .gguf_meta import DEFAULT_ALIGNMENT, check_metadata
from .tensor import Tensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8  # arrays of arrays: llama.cpp reads none, gguf-py writes them; deeper is hostile

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
    data_offset: int = 0  # file offset of the data section (of the first part)
    size: int = 0  # bytes in the file (all parts of a split model)
    _mmap: object = field(default=None, repr=False)  # kept so the views stay valid (a list for a split model)
    parts: tuple = ()  # a split model's files, in order; () for a single file


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

    def value(self, vtype: int, depth: int = 0):
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
                if depth >= MAX_ARRAY_DEPTH:
                    raise ValueError(f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
                return [self.value(_ARRAY, depth + 1) for _ in range(count)]
            raise ValueError(f"unknown array element type {etype}")
        raise ValueError(f"unknown value type {vtype}")


def _decode(b: bytes) -> str:
    # Token strings should be UTF-8; a stray invalid byte must not make the file unreadable.
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("utf-8", errors="replace")


_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def read_gguf(path: str | os.PathLike, tensors: bool = True) -> GGUFFile:
    """Parse the header of a GGUF file (every part of a split model, given any part) and map its
    tensors without copying their data.

    Held to what llama.cpp's gguf.cpp requires: unique keys and tensor names, a power-of-two
    alignment, at most GGML_MAX_DIMS dims, tensors packed in info order at aligned offsets and
    nothing after the last one (a tensor count lower than the tensors written shows up there).
    Metadata values of the keys fuel reads are type-checked here too (gguf_meta.py).

    With tensors=False only the metadata (of the file given) is read, as a tokenizer needs nothing
    else: no tensor is listed or checked, so a vocabulary-only file, or one with tensor types fuel
    cannot run, still opens."""
    gf = _read_one(os.fspath(path), tensors)
    count = gf.meta.get("split.count", 1)
    if not tensors or not isinstance(count, int) or count <= 1:
        return gf
    return _read_split(gf, count)


def _read_split(gf: GGUFFile, count: int) -> GGUFFile:
    name = os.path.basename(gf.path)
    m = _SPLIT_NAME.match(name)
    if not m or int(m["count"]) != count:
        raise InputError(f"{gf.path}: part of a split GGUF of {count} files, but not named "
                         f"NAME-00001-of-{count:05d}.gguf, so its other parts cannot be found")
    folder = os.path.dirname(gf.path)
    paths = [os.path.join(folder, f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for i, p in enumerate(paths):
        if not is_present(p):
            raise InputError(f"{p}: part {i + 1} of the split GGUF {name} is missing")
    parts = [gf if p == gf.path else _read_one(p) for p in paths]
    tensors: dict[str, Tensor] = {}
    for i, (p, part) in enumerate(zip(paths, parts)):
        if (part.meta.get("split.no"), part.meta.get("split.count")) != (i, count):
            raise InputError(f"{p}: split.no {part.meta.get('split.no')} of {part.meta.get('split.count')} "
                             f"where part {i} of {count} (0-based) was expected")
        for t in part.tensors:
            if t in tensors:
                raise InputError(f"{p}: tensor {t!r} also appears in an earlier part")
        tensors.update(part.tensors)
    first = parts[0]
    expected = first.meta.get("split.tensors.count")
    if expected is not None and expected != len(tensors):
        raise InputError(f"{paths[0]}: split.tensors.count is {expected} but the {count} parts hold {len(tensors)}")
    return GGUFFile(path=paths[0], version=first.version, alignment=first.alignment, meta=first.meta,
                    tensors=tensors, data_offset=first.data_offset, size=sum(q.size for q in parts),
                    _mmap=[q._mmap for q in parts],
                    parts=tuple(paths))


def _parse(path: str, cur: _Cursor, size: int, tensors: bool) -> tuple[dict, list, int]:
    """(metadata, tensor infos, offset where the header ends), read after the version."""
    try:  # every read below is bounds-checked: running off the end means a cut file
        n_tensors, n_kv = cur.u64(), cur.u64()
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key = cur.string()
            if key in meta:
                raise ValueError(f"key {key!r} appears twice")
            meta[key] = cur.value(cur.u32())
        infos = []
        for _ in range(n_tensors if tensors else 0):
            name = cur.string()
            n_dims = cur.u32()
            if n_dims > MAX_DIMS:
                raise ValueError(f"tensor {name!r} has {n_dims} dims (at most {MAX_DIMS})")
            dims = [cur.u64() for _ in range(n_dims)]
            infos.append((name, dims, cur.u32(), cur.u64()))
    except _Truncated:
        raise InputError(f"{path}: truncated GGUF file (header ends past the file's {size} bytes)") from None
    except (ValueError, KeyError, struct.error) as e:
        raise InputError(f"{path}: corrupt GGUF header ({e})") from None
    return meta, infos, cur.pos


def _read_one(path: str, tensors: bool = True) -> GGUFFile:
    """One GGUF file: header parsed, tensors mapped."""
    with open_regular(path) as fh:
        try:
            st = os.fstat(fh.fileno())
            size = st.st_size
            if size < 8:  # magic + version
                raise InputError(f"{path}: truncated GGUF file ({size} bytes)")
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise InputError(f"{path}: cannot read: {e.strerror or e}") from None

    if mm[:4] != GGUF_MAGIC:
        raise InputError(f"{path}: not a GGUF file (magic {bytes(mm[:4])!r}, expected b'GGUF')")
    cur = _Cursor(mm, size)
    cur.take(4)
    version = cur.u32()
    if version not in SUPPORTED_VERSIONS:
        raise InputError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")

    parsed = gguf_cache.load(path, st)
    if parsed is None:
        parsed = _parse(path, cur, size, tensors)
        if tensors:
            gguf_cache.store(path, st, *parsed)
    meta, infos, header_end = parsed
    infos = infos if tensors else []

    check_metadata(path, meta)
    if not tensors:
        return GGUFFile(path=path, version=version, alignment=DEFAULT_ALIGNMENT, meta=meta, tensors={}, size=size,
                        _mmap=mm)
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    data_offset = -(-header_end // alignment) * alignment

    whole = np.frombuffer(mm, dtype=np.uint8)  # read-only view of the whole file
    views: dict[str, Tensor] = {}
    supported = ", ".join(FORMATS)
    packed = 0  # where the next tensor must start, relative to the data section
    for name, dims, gtype, offset in infos:
        fmt = BY_GGML_TYPE.get(gtype)
        if fmt is None:
            tname = GGML_TYPE_NAMES.get(gtype, f"type {gtype}")
            raise InputError(f"{path}: tensor {name!r} has unsupported type {tname} (supported: {supported})")
        shape = tuple(int(d) for d in reversed(dims)) or (1,)
        if math.prod(shape) >= 1 << 63:  # ggml counts elements in int64
            raise InputError(f"{path}: tensor {name!r} has dims {dims}, more elements than ggml can count")
        ncols = shape[-1]
        if ncols % fmt.block_elems:
            raise InputError(
                f"{path}: tensor {name!r} row of {ncols} is not a multiple of the {fmt.name} block ({fmt.block_elems})"
            )
        rb = ncols // fmt.block_elems * fmt.block_bytes
        nbytes = math.prod(shape[:-1]) * rb
        start = data_offset + offset
        if start + nbytes > size:
            raise InputError(
                f"{path}: tensor {name!r} data [{start}, {start + nbytes}) lies outside the file "
                f"({size} bytes; truncated file or bad offset)"
            )
        if offset != packed:
            raise InputError(f"{path}: tensor {name!r} is at offset {offset} of the data section, expected {packed} "
                             "(tensors are packed in order, each aligned: overlapping or misplaced data)")
        if name in views:
            raise InputError(f"{path}: tensor {name!r} appears twice")
        data = whole[start : start + nbytes].reshape(shape[:-1] + (rb,))
        views[name] = Tensor(name=name, fmt=fmt.name, shape=shape, data=data)
        packed += -(-nbytes // alignment) * alignment
    end = data_offset + packed if infos else data_offset
    if size > end:
        raise InputError(f"{path}: {size - end} bytes after the last of the header's {len(infos)} tensors "
                         "(a tensor count lower than the tensors written, or trailing data)")

    return GGUFFile(
        path=path, version=version, alignment=alignment, meta=meta, tensors=views,
        data_offset=data_offset, size=size, _mmap=mm,
    )


def peek_architecture(path: str | os.PathLike) -> str | None:
    """`general.architecture` of a GGUF file, read from the start of its header (writers put it
    first); None when it is not among the first keys or the file is not a readable GGUF."""
    try:
        with open_regular(path) as fh:
            buf = fh.read(1 << 16)
    except (InputError, OSError):
        return None
    if buf[:4] != GGUF_MAGIC:
        return None
    cur = _Cursor(buf, len(buf))
    try:
        cur.take(8)  # magic, version
        cur.u64()
        n_kv = cur.u64()
        for _ in range(min(n_kv, 8)):
            key, vtype = cur.string(), cur.u32()
            value = cur.value(vtype)
            if key == "general.architecture":
                return value if isinstance(value, str) else None
    except (_Truncated, ValueError, KeyError, struct.error):
        pass
    return None
