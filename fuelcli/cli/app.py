"""The Typer app, the --version flag and `main()`, which turns fuel's errors into one line and an
exit code. The commands live one per module beside this one and register themselves on `app`."""

import os
import sys
import traceback

import typer

from ..errors import EXIT_INTERNAL, EXIT_INTERRUPTED, FuelError
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


def _one_line(e: BaseException) -> str:
    return str(e).replace("\r", "\\r").replace("\n", "\\n")


def main():
    """Run the CLI. fuel's typed errors: one line and their exit code. Ctrl-C: 130. Anything else is a
    bug that slipped past the validation: one line and 70 (EX_SOFTWARE); FUEL_DEBUG=1 adds tracebacks."""
    debug = os.environ.get("FUEL_DEBUG", "") not in ("", "0")
    try:
        app()
    except FuelError as e:
        if debug:
            traceback.print_exc()
        err(f"error: {_one_line(e)}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit:
        raise
    except BaseException as e:  # the last line of defence (BaseException: pyo3's PanicException is one)
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (set FUEL_DEBUG=1 to see the traceback)"
        err(f"error: internal error: {type(e).__name__}: {_one_line(e)}{hint}")
        sys.exit(EXIT_INTERNAL)
