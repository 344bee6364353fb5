"""`fuel run MODEL PROMPT`: generate, streamed to stdout, with a stats line on stderr."""

import sys
from typing import Optional

import typer

from ..errors import InputError
from .app import app
from .options import Device, ModelArg, Revision, err, unescape


@app.command()
def run(
    model: str = ModelArg,
    prompt: str = typer.Argument(..., help="the prompt (the user message when a chat template is applied)"),
    max_tokens: int = typer.Option(256, "-n", "--max-tokens", help="most tokens to generate"),
    temp: float = typer.Option(0.8, "--temp", help="temperature; 0 = greedy"),
    top_k: int = typer.Option(40, "--top-k", help="keep the k most likely tokens; 0 = off"),
    top_p: float = typer.Option(0.95, "--top-p", help="nucleus sampling mass; 1 = off"),
    min_p: float = typer.Option(0.05, "--min-p", help="drop tokens below min_p × the top probability; 0 = off"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help="penalise recent tokens; 1 = off"),
    repeat_last_n: int = typer.Option(64, "--repeat-last-n", help="how many recent tokens the penalty sees; 0 = off, -1 = the whole context"),
    seed: Optional[int] = typer.Option(None, "--seed", help="random seed for sampling"),
    stop: list[str] = typer.Option([], "--stop", help="stop when this text appears (repeatable; \\n, \\t, \\\\ "
                                   "are escapes, as in llama-cli)"),
    system: Optional[str] = typer.Option(None, "--system", help="system message for the chat template"),
    no_chat_template: bool = typer.Option(False, "--no-chat-template", help="send the prompt as raw text"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no stats line on stderr"),
    device: Optional[str] = Device,
    revision: Optional[str] = Revision,
):
    """Generate text from PROMPT, streamed to stdout; a stats line goes to stderr."""
    from ..backends import make_engine
    from ..backends.cpu.engine import kernels_cached
    from ..generate import Sampler, SamplerParams, Stats, generate
    from ..loader import open_model
    from ..memory import peak_rss_bytes

    if max_tokens < 1:
        raise InputError(f"--max-tokens must be at least 1, got {max_tokens}")
    sampler = Sampler(SamplerParams(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed))
    m = open_model(model, revision)
    tok = m.tokenizer
    if system is not None and (no_chat_template or not tok.chat_template):
        raise InputError("--system needs the model's chat template" +
                         (" (drop --no-chat-template)" if no_chat_template else "; this model has none"))
    ids = tok.encode_prompt(prompt, system=system, chat=not no_chat_template)
    if len(ids) >= m.cfg.max_position:
        raise InputError(f"the prompt has {len(ids)} tokens; the model's context is {m.cfg.max_position}")
    from ..backends import resolve_device

    if not quiet and resolve_device(device) == "cpu" and not kernels_cached(m.weights):
        err("compiling fuel's kernels (first run only; cached afterwards)...")
    engine = make_engine(m.cfg, m.weights, n_ctx=len(ids) + max_tokens, device=device)
    stats = Stats()
    interrupted = False
    stops = [unescape(s) for s in stop]
    try:
        for piece in generate(engine, tok, ids, max_tokens, sampler, m.eos_ids(), stops, stats):
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
    sys.stdout.write("\n")
    if not quiet:
        err(stats.line(peak_rss_bytes()) + (" | interrupted" if interrupted else ""))
    if interrupted:
        raise typer.Exit(130)
