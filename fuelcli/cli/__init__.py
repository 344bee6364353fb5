"""The `fuel` command: the Typer app (app.py), shared options (options.py) and one module per
command, each a thin wrapper that parses options, calls the library and prints."""

from . import bench, chat, diff, doctor, inspect, logits, ls, perplexity, pull, rm, run, serve  # noqa: F401  (each registers its command)
from .app import app, main

__all__ = ["app", "main"]
