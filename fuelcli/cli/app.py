"""The Typer app, the --version flag and `main()`, which turns fuel's errors into one line and an
exit code. The commands live one per module beside this one and register themselves on `app`.

Help is plain text (rich_markup_mode=None): typer's rich help prints a `<bool>` type after every
flag, --help included, which reads as if `--json true` were the syntax; click's plain layout shows
flags bare, needs no colour (NO_COLOR) and pipes cleanly.
"""

import sys

import typer

from ..errors import FuelError
from .options import err

EXIT_CODES = ("Exit codes: 0 success, 1 other error, 2 bad input (missing model, broken file, bad config, "
              "unknown architecture, prompt too long, bad option), 3 oracle mismatch (diff), 4 missing optional "
              "dependency, 5 download failed (pull), 130 interrupted.")

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Run, inspect, check and measure decoder LLMs on the CPU.", epilog=EXIT_CODES)


def _version(value: bool):
    if value:
        from .. import __version__

        print(f"fuel {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")):
    pass


def main():
    try:
        app()
    except FuelError as e:
        err(f"error: {e}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
