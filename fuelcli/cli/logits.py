"""`fuel logits MODEL --out FILE.npy`: the logits of every position by one forward path."""

import io
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from .app import app
from .options import Activations, CacheType, Device, HfFile, ModelArg, Revision, Threads, err, parse_tokens


@app.command(short_help="Write the logits of every position of a sequence.")
def logits(
    model: str = ModelArg,
    out: Path = typer.Option(..., "--out", help="where to write float32 [seq, vocab] (.npy)"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="text, encoded with special tokens, no template"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token ids, e.g. 1,2,3"),
    path: str = typer.Option("decode", "--path", help="decode (one token at a time through the KV cache) | "
                             "prefill (one batched call) | reference (numpy oracle)"),
    threads: Optional[int] = Threads,
    device: Optional[str] = Device,
    cache_type: str = CacheType,
    activations: Optional[str] = Activations,
    revision: Optional[str] = Revision,
    hf_file: Optional[str] = HfFile,
):
    """Write the logits of every position of a sequence, by one of the three paths."""
    import numpy as np

    from ..assembly.forward_paths import PATHS, logits_by_path
    from ..assembly.loader import open_model
    from ..process.threads import set_threads

    if (prompt is None) == (tokens is None):
        raise InputError("give exactly one of --prompt and --tokens")
    if path not in PATHS:
        raise InputError(f"--path must be one of {', '.join(PATHS)}, got {path!r}")
    set_threads(threads)
    m = open_model(model, revision, hf_file)
    ids = parse_tokens(tokens) if tokens is not None else m.tokenizer.encode(prompt)
    try:
        out_is_dir = out.is_dir()
    except OSError:
        out_is_dir = False  # the write below reports the path
    if out_is_dir:  # checked before the forward, which may take a while
        raise InputError(f"--out {out} is a directory; give a file path")
    if not out.parent.is_dir():  # a typo in the path should not create directories
        raise InputError(f"--out {out}: directory {out.parent} does not exist")
    result = logits_by_path(m, ids, path, device=device, cache_type=cache_type, activations=activations)
    # A device or a FIFO (/dev/null, a pipe) is written in place: renaming a file over it would replace it.
    stream = out.exists() and not out.is_file()
    tmp = out if stream else out.with_name(out.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            if stream:  # np.save asks a pipe for its position: write the bytes it would
                buf = io.BytesIO()
                np.save(buf, result)
                f.write(buf.getbuffer())
            else:
                np.save(f, result)
        if not stream:
            tmp.replace(out)  # never a half-written file
    except OSError as e:
        try:
            if not stream:
                tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise InputError(f"cannot write --out {out}: {e.strerror or e}") from None
    err(f"wrote {out} [{result.shape[0]}, {result.shape[1]}] float32 ({path} path)")
