"""Options and argument parsers shared by several commands (one definition each)."""

from __future__ import annotations

import sys

import typer

from ..errors import InputError
from ..process.extras import pip_install


def _complete_models(incomplete: str) -> list[str]:
    """Shell completion of MODEL: the names `fuel ls` shows (the shell completes paths itself)."""
    from ..sources.local_models import list_models

    try:
        names = [m.name for m in list_models() if " " not in m.name]
    except Exception:  # a broken cache must not break the shell
        return []
    return [n for n in names if n.startswith(incomplete)]


ModelArg = typer.Argument(..., metavar="MODEL", autocompletion=_complete_models,
                          help="hub repo id (owner/name; owner/name:QUANT picks a .gguf of a GGUF repo), model "
                          "directory, .gguf file or demo alias (fuel ls lists them)")
Revision = typer.Option(None, "--revision", help="hub branch, tag or commit")
HfFile = typer.Option(None, "--hf-file", metavar="NAME", help="with a hub repo id: the .gguf file of the repo to "
                      "run (a split file's first part), as llama.cpp's --hf-file")
Device = typer.Option(None, "--device", help=f"cpu (default) or cuda ({pip_install('cuda')}); FUEL_DEVICE sets the default")
Json = typer.Option(False, "--json", help="print JSON instead of tables")
THREADS_DEFAULT = "the cores other processes leave free, all on an idle machine"  # README's Conventions say it too
Threads = typer.Option(None, "-t", "--threads", metavar="N", help=f"compute threads (default: {THREADS_DEFAULT}; "
                       "or FUEL_THREADS)")
BenchThreads = typer.Option(None, "-t", "--threads", metavar="N", help="compute threads, the same through every "
                            "run (default: all cores, or FUEL_THREADS)")
Activations = typer.Option(None, "--activations", metavar="KIND", help="matrix inputs as the block formats' "
                           "kernels read them: int16 (default: the file's model, within ~1e-8 KL), or q8 (8 bits "
                           "per block as llama.cpp: faster, less exact; fuel diff shows what it costs); cpu only; "
                           "FUEL_ACTIVATIONS sets the default")
CacheType = typer.Option("f32", "--cache-type", metavar="TYPE", help="KV cache values: f32, or f16 (half the memory "
                         "and of the bytes a decode step reads at depth, as llama.cpp's default cache; rounds each "
                         "K and V value once; cpu only)")


# --- generation (run, chat) --------------------------------------------------------------------
Temp = typer.Option(0.8, "--temp", help="temperature, applied last in the chain; 0 = greedy")
TopK = typer.Option(40, "--top-k", help="keep the k most likely tokens; 0 = off")
TopP = typer.Option(0.95, "--top-p", help="keep the most likely tokens whose probability (at temperature 1) "
                    "sums to p; 1 = off")
MinP = typer.Option(0.05, "--min-p", help="drop tokens below min_p × the top probability (at temperature 1); 0 = off")
MinKeep = typer.Option(0, "--min-keep", help="top-p and min-p keep at least this many tokens")
RepeatPenalty = typer.Option(1.0, "--repeat-penalty", help="penalise recent tokens; 1 = off")
RepeatLastN = typer.Option(64, "--repeat-last-n", help="how many recent tokens the penalty sees; 0 = off, "
                           "-1 = the whole context")
Seed = typer.Option(None, "--seed", help="random seed for sampling")
Stop = typer.Option([], "--stop", metavar="TEXT", help="stop when this text appears (repeatable; \\n, \\t, \\\\ are escapes, "
                    "as in llama-cli)")
System = typer.Option(None, "--system", help="system message for the chat template")
SystemFile = typer.Option(None, "--system-file", metavar="FILE", help="read the system message from FILE")
ChatTemplate = typer.Option(None, "--chat-template", metavar="FILE", help="a Jinja chat template file to use instead "
                            "of the model's")
ChatTemplateKwargs = typer.Option(None, "--chat-template-kwargs", metavar="JSON", help="extra variables for the chat "
                                  "template, a JSON object, e.g. '{\"enable_thinking\": false}'")
JsonSchemaFile = typer.Option(None, "--json-schema", metavar="FILE", help="constrain the output to JSON that "
                              "validates against the JSON schema in FILE (pip install 'fuel-llm[grammar]')")
GrammarFile = typer.Option(None, "--grammar", metavar="FILE", help="constrain the output to a GBNF grammar (llama.cpp's "
                           "format; llguidance's Lark syntax too) in FILE (pip install 'fuel-llm[grammar]')")
DraftModel = typer.Option(None, "--draft-model", "-md", metavar="MODEL", help="speculative decoding: a small model "
                          "of the same vocabulary proposes tokens and the model verifies several per forward "
                          "(greedy output unchanged, sampled output of the model's distribution)")
LookupDecoding = typer.Option(False, "--lookup-decoding", help="speculative decoding without a second model: "
                              "proposals from n-grams of the prompt and the text so far (code edits, summaries, "
                              "answers that quote their input)")
DraftMax = typer.Option(None, "--draft-max", metavar="N", help="speculative decoding: verify up to N proposals per "
                        "forward (default: adaptive, up to 16: as many as the measured costs and acceptance make "
                        "fastest, none when plain decoding is faster)")
DraftPMin = typer.Option(None, "--draft-p-min", metavar="P", help="--draft-model: stop drafting where the draft's "
                         "top probability falls below P (default 0.75)")
VerbosePrompt = typer.Option(False, "--verbose-prompt", help="print the rendered prompt and its token ids to stderr")


# chat's context, and run's with -n -1: as llama-cli's former default and ollama's; -c 0 takes the
# model's whole context
OPEN_ENDED_CTX = 4096


def ctx_size_option(default: str):
    return typer.Option(None, "-c", "--ctx-size", metavar="N", help=f"context size in tokens; 0 = the model's "
                        f"(default: {default})")


def err(msg: str):
    """One line on stderr."""
    print(msg, file=sys.stderr, flush=True)


PIPE_WIDTH = 1000  # columns of a console that is not a terminal: its lines are never cut


def console(stderr: bool = False):
    """A rich console for tables and reports. On a terminal it takes the terminal's width; into a pipe
    or a file rich would cut every line at 80 columns (unless COLUMNS says otherwise), wrapping table
    cells, so there a table keeps its natural width, as `ls -l` or llama-bench's tables do."""
    import os

    from rich.console import Console

    con = Console(stderr=stderr)
    if not con.is_terminal and not os.environ.get("COLUMNS"):
        con = Console(stderr=stderr, width=PIPE_WIDTH)
    return con


def parse_tokens(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(f"--tokens takes comma-separated integers, got {text!r}") from None


def check_tolerances(**options):
    """--tol, --atol, --layer-tol: None (unset) or a number >= 0, inf meaning no bound; --min-top1 within
    0..1. NaN is refused: every comparison with it is false, so it would pass any oracle."""
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        ok = value is None or (0 <= value <= 1 if name == "min_top1" else value >= 0)
        if not ok:
            want = "a number within 0..1" if name == "min_top1" else "a number >= 0 (inf: no bound)"
            raise InputError(f"{flag} must be {want}, got {value}")


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


def unescape(text: str) -> str:
    r"""llama-cli's escapes (--stop): a shell passes "\n" as backslash + n."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def human_size(n: int) -> str:
    """Bytes in decimal units, as ollama list and `du --si` show them."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
