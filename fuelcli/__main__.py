"""Where `python -m fuelcli` and the `fuel` console script start.

Ctrl-C must never print a traceback, also while the CLI's modules are still importing (typer,
rich, numpy: a noticeable part of a start) or while Python shuts down: until a command runs, and
again after it, SIGINT exits at once with 130. During the command it raises KeyboardInterrupt as
usual, which the commands handle (`run` prints its stats line) and cli/app.py's main() ends in 130.
The garbage collector is off until the command has started (process/collector.py).
"""

import os
import signal
import sys

from .errors import EXIT_INTERRUPTED
from .process import collector


def _exit_interrupted(signum, frame):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # e.g. interrupted inside a write to the same stream
            pass
    os._exit(EXIT_INTERRUPTED)


def main():
    collector.pause()
    signal.signal(signal.SIGINT, _exit_interrupted)
    from .cli import main as cli_main

    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cli_main()
    finally:
        signal.signal(signal.SIGINT, _exit_interrupted)


if __name__ == "__main__":
    main()
