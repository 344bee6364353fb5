"""Calls into native code that may panic on bad input (the Rust `tokenizers` library).

tokenizers panics instead of failing on some malformed vocabularies (a BPE merge whose result is
not a token, in 0.23): Rust's panic hook writes a backtrace straight to file descriptor 2 and pyo3
raises PanicException, a BaseException that `except Exception` lets through. Such calls run here
with descriptor 2 silenced and any exception, a panic included, comes back as a RuntimeError for
the caller to word as an InputError. Building a tokenizer is the only use: it takes milliseconds
to seconds and prints nothing a user needs.
"""

from __future__ import annotations

import os
import sys


def call_quietly(fn, *args, **kwargs):
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to protect
        saved = None
    if saved is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # PanicException derives from BaseException
        raise RuntimeError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
