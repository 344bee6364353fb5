"""Split a GGUF file the way llama.cpp's gguf-split does (gguf-py's writer with split_max_tensors):
NAME-0000i-of-0000N.gguf parts, the metadata in the first, split.* keys in every part."""

from __future__ import annotations

from pathlib import Path

import gguf


def split_gguf(src: Path, out_dir: Path, max_tensors: int) -> list[Path]:
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out_dir / src.name, arch, split_max_tensors=max_tensors)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=tuple(int(d) for d in reversed(t.shape)), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n = len(w.tensors)
    return [out_dir / f"{src.stem}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
