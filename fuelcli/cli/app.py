"""The Typer app, the --version flag and `main()`, which turns fuel's errors into one line and an
exit code. The commands live one per module beside this one and register themselves on `app`."""

import sys

import typer

from ..errors import FuelError
from .options import err

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Run, inspect, check and measure decoder LLMs on the CPU.")


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
