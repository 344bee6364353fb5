"""The `fuel` command: thin wrappers that parse options, call the library and print."""

import sys
from pathlib import Path
from typing import Optional

import typer

from .errors import FuelError, InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Run, inspect, check and measure decoder LLMs on the CPU.")


def _version(value: bool):
    if value:
        from . import __version__

        print(f"fuel {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")):
    pass


ModelArg = typer.Argument(..., help="hub repo id (owner/name), model directory, .gguf file or demo alias")
Revision = typer.Option(None, "--revision", help="hub branch, tag or commit")


def _err(msg: str):
    print(msg, file=sys.stderr, flush=True)


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
    revision: Optional[str] = Revision,
):
    """Generate text from PROMPT, streamed to stdout; a stats line goes to stderr."""
    from .engine import Engine, kernels_cached
    from .generate import Sampler, SamplerParams, Stats, generate
    from .loader import open_model
    from .memory import peak_rss_bytes

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
    engine = Engine(m.cfg, m.weights, n_ctx=len(ids) + max_tokens)
    if not quiet and not kernels_cached():
        _err("compiling fuel's kernels (first run only, about a minute; cached afterwards)...")
    stats = Stats()
    interrupted = False
    stops = [_unescape(s) for s in stop]
    try:
        for piece in generate(engine, tok, ids, max_tokens, sampler, m.eos_ids(), stops, stats):
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
    sys.stdout.write("\n")
    if not quiet:
        _err(stats.line(peak_rss_bytes()) + (" | interrupted" if interrupted else ""))
    if interrupted:
        raise typer.Exit(130)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


def _unescape(text: str) -> str:
    r"""llama-cli's --stop escapes: a shell passes "\n" as backslash + n."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _parse_tokens(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(f"--tokens takes comma-separated integers, got {text!r}") from None


@app.command()
def logits(
    model: str = ModelArg,
    out: Path = typer.Option(..., "--out", help="where to write float32 [seq, vocab] (.npy)"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="text, encoded with special tokens, no template"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token ids, e.g. 1,2,3"),
    path: str = typer.Option("decode", "--path", help="decode (one token at a time through the KV cache) | "
                             "prefill (one batched call) | reference (numpy oracle)"),
    revision: Optional[str] = Revision,
):
    """Write the logits of every position of a sequence, by one of the three paths."""
    import numpy as np

    from .loader import open_model
    from .run_paths import PATHS, logits_by_path

    if (prompt is None) == (tokens is None):
        raise InputError("give exactly one of --prompt and --tokens")
    if path not in PATHS:
        raise InputError(f"--path must be one of {', '.join(PATHS)}, got {path!r}")
    m = open_model(model, revision)
    ids = _parse_tokens(tokens) if tokens is not None else m.tokenizer.encode(prompt)
    try:
        out_is_dir = out.is_dir()
    except OSError:
        out_is_dir = False  # the write below reports the path
    if out_is_dir:  # checked before the forward, which may take a while
        raise InputError(f"--out {out} is a directory; give a file path")
    if not out.parent.is_dir():  # a typo in the path should not create directories
        raise InputError(f"--out {out}: directory {out.parent} does not exist")
    result = logits_by_path(m, ids, path)
    tmp = out.with_name(out.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            np.save(f, result)
        tmp.replace(out)  # never a half-written file
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise InputError(f"cannot write --out {out}: {e.strerror or e}") from None
    _err(f"wrote {out} [{result.shape[0]}, {result.shape[1]}] float32 ({path} path)")


# Subcommands living in their own modules register themselves on `app` when imported.
# --- subcommand modules (one import line each) ---
from . import cli_pull  # noqa: E402,F401
from . import cli_bench  # noqa: E402,F401
from . import cli_inspect  # noqa: E402,F401
from . import cli_diff  # noqa: E402,F401
# --- end subcommand modules ---


def main():
    try:
        app()
    except FuelError as e:
        _err(f"error: {e}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
