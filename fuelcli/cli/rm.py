"""`fuel rm NAME...`: remove demo models and hub-cache entries that fuel ls lists."""

from typing import Optional

import typer

from .app import app
from .options import human_size


@app.command("rm", short_help="Remove demo models and hub-cache entries.")
def rm_cmd(
    names: list[str] = typer.Argument(..., metavar="NAME...", help="a name from fuel ls: a demo alias, owner/name "
                                      "(every cached revision of the repo) or owner/name:QUANT (those GGUF files)"),
    hf_file: Optional[str] = typer.Option(None, "--hf-file", metavar="NAME",
                                          help="with owner/name: remove this GGUF file (and its other parts)"),
):
    """Remove models from this machine: demo files by alias; hub repos, or single GGUF quants, from
    huggingface_hub's cache."""
    from ..sources.local_models import remove

    for name in names:
        what, freed = remove(name, hf_file)
        print(f"removed {what}, {human_size(freed)} freed")
