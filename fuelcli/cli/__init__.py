"""The `fuel` command: the Typer app (app.py), shared options (options.py) and one module per
command, each a thin wrapper that parses options, calls the library and prints."""

from . import bench, diff, inspect, logits, perplexity, pull, run  # noqa: F401  (each registers its command)
from .app import app, main

__all__ = ["app", "main"]
