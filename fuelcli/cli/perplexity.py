"""`fuel perplexity MODEL FILE`: perplexity of FILE by llama-perplexity's method and printout.

Running values per window and `Final estimate: PPL = x +/- y` on stdout (llama.cpp's format), the
progress lines on stderr (where it is not a terminal, a line per window); --json prints one object
with top-level `ppl` and `ppl_stderr` instead.
"""

import json
import sys
from typing import Optional

import typer

from ..oracle import DEFAULT_CTX
from .app import app
from .options import Activations, CacheType, Device, HfFile, Json, ModelArg, Revision, Threads, err


@app.command("perplexity")
def perplexity_cmd(
    model: str = ModelArg,
    file: str = typer.Argument(..., help="UTF-8 text file (at least 2 x --ctx tokens)"),
    ctx: int = typer.Option(DEFAULT_CTX, "--ctx", "-c", help="window length in tokens (llama.cpp's -c)"),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="at most this many windows (default: all)"),
    as_json: bool = Json,
    threads: Optional[int] = Threads,
    device: Optional[str] = Device,
    cache_type: str = CacheType,
    activations: Optional[str] = Activations,
    revision: Optional[str] = Revision,
    hf_file: Optional[str] = HfFile,
):
    """Perplexity of a text, scored the way llama-perplexity scores it."""
    from ..measure.perplexity import perplexity
    from ..oracle.tolerances import SLICE
    from ..assembly.loader import open_model
    from ..process.threads import set_threads

    set_threads(threads)
    m = open_model(model, revision, hf_file)

    def on_start(w, tok_s):
        err(f"perplexity: tokenization took {tok_s * 1e3:g} ms")
        err(f"perplexity: calculating perplexity over {w.n_chunks} chunks, n_ctx={w.ctx}, "
            f"batch_size={min(SLICE, w.ctx)}, n_seq=1")

    # a log (stderr not a terminal) gets a line per window: the running values go to stdout without a
    # newline until the last, or nowhere with --json
    logged = not sys.stderr.isatty()

    def on_chunk(c, n, r, dt):
        if c == 0:
            err(f"perplexity: {dt:.2f} seconds per pass - ETA {dt * n / 60:.2f} minutes")
        if logged:
            err(f"perplexity: chunk {c + 1}/{n}, PPL so far {r.running[-1]:.4f}, {r.seconds:.1f} s, "
                f"ETA {r.seconds / (c + 1) * (n - c - 1) / 60:.2f} minutes")
        if not as_json:
            print(f"[{c + 1}]{r.running[-1]:.4f},", end="\n" if c + 1 == n else "", flush=True)

    r = perplexity(m, file, ctx, chunks, device, on_start=on_start, on_chunk=on_chunk, cache_type=cache_type,
                   activations=activations)
    ppl, stderr = r.ppl
    err(f"perplexity: {len(r.nll) * r.ctx} tokens in {r.seconds:.2f} s ({r.tokens_per_second:.2f} tokens/s)")
    if as_json:
        print(json.dumps({"model": m.source.name, **r.to_json()}, indent=2))
    else:
        print(f"Final estimate: PPL = {ppl:.4f} +/- {stderr:.5f}")
