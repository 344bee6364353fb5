"""Options and argument parsers shared by several commands (one definition each)."""

from __future__ import annotations

import sys

import typer

from ..errors import InputError

ModelArg = typer.Argument(..., help="hub repo id (owner/name), model directory, .gguf file or demo alias")
Revision = typer.Option(None, "--revision", help="hub branch, tag or commit")
Device = typer.Option(None, "--device", help="cpu (default; FUEL_DEVICE sets another)")
Json = typer.Option(False, "--json", help="print JSON instead of tables")


def err(msg: str):
    """One line on stderr."""
    print(msg, file=sys.stderr, flush=True)


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
