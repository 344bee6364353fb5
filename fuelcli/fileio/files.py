"""Opening the files a model is read from: regular files only, every OS error one InputError.

A FIFO in place of model.safetensors or a .gguf would block the read forever, a device could
stream without end: the file is opened non-blocking (which never waits, whatever it is) and
refused unless fstat says it is a regular file. Symbolic links are followed, as everywhere.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import InputError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def describe_os_error(e: OSError) -> str:
    return e.strerror or type(e).__name__


def open_regular(path: str | os.PathLike):
    """A binary file object for reading `path`, which must be a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"{path}: cannot open: {describe_os_error(e)}") from None
    except ValueError as e:  # an embedded NUL byte
        raise InputError(f"{path!r}: not a usable path ({e})") from None
    try:
        kind = _not_regular(os.fstat(fd).st_mode)
    except OSError as e:
        os.close(fd)
        raise InputError(f"{path}: cannot open: {describe_os_error(e)}") from None
    if kind is not None:
        os.close(fd)
        raise InputError(f"{path}: is {kind}, not a regular file")
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The whole of a regular file of at most `limit` bytes."""
    with open_regular(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise InputError(f"{path}: {size} bytes, more than the {limit} a file of this kind may have")
            return f.read(limit + 1)[:limit]
        except OSError as e:
            raise InputError(f"{path}: cannot read: {describe_os_error(e)}") from None


def is_present(path: Path) -> bool:
    """Whether something exists at `path` (of any kind: open_regular then says what is wrong with it).
    An OS error other than 'no such file' (permissions, a loop of links) is an InputError."""
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False
    except OSError as e:
        raise InputError(f"{path}: cannot access: {describe_os_error(e)}") from None
    except ValueError as e:  # an embedded NUL byte
        raise InputError(f"{path!r}: not a usable path ({e})") from None
