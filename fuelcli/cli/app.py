"""The Typer app, the --version flag and `main()`, which turns fuel's errors into one line and an
exit code. The commands live one per module beside this one and register themselves on `app`.

Help is plain text (rich_markup_mode=None): typer's rich help prints a `<bool>` type after every
flag, --help included, which reads as if `--json true` were the syntax; click's plain layout shows
flags bare, needs no colour (NO_COLOR) and pipes cleanly.
"""

import os
import sys
import traceback

import typer

from ..errors import EXIT_INTERNAL, EXIT_INTERRUPTED, FuelError
from ..process import collector
from .options import err

EXIT_CODES = ("Exit codes: 0 success, 2 bad input (missing model, broken file, bad config, unknown "
              "architecture, prompt too long, bad option, NaN logits), 3 oracle mismatch (diff), 4 missing "
              "optional dependency, 5 download failed (pull) or peer crashed (bench --compare, diff --oracle), "
              "70 internal error (a bug; FUEL_DEBUG=1 shows it), 130 interrupted.")

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Run, inspect, check and measure decoder LLMs on the CPU.", epilog=EXIT_CODES)


def _version(value: bool):
    if value:
        from .doctor_report import version_text

        print(version_text())
        raise typer.Exit()


# These resume the garbage collector themselves once their engine is ready (textgen.ready_engine).
STARTS_LATE = ("run", "chat", "serve")


@app.callback()
def _main(ctx: typer.Context, version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                                           help="print fuel's, numba's and llvmlite's versions "
                                                           "and the CPU kernels' instruction set, and exit")):
    if ctx.invoked_subcommand not in STARTS_LATE:
        collector.resume()


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
