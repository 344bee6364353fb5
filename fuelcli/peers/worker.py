"""The child side of child.PeerProcess: `python -m fuelcli.peers.worker FD`.

Builds the adapter it is asked for and runs its methods until told to close or until fuel's end of
the socket closes. It dies with fuel (PR_SET_PDEATHSIG on Linux) and leaves Ctrl-C to fuel: fuel
ends the run, and the child's socket closes with it.
"""

from __future__ import annotations

import ctypes
import importlib
import resource
import signal
import socket
import sys
from multiprocessing.connection import Connection

from .. import errors
from .child import recv, send


def _die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):  # not Linux: the closed socket ends the loop instead
        pass


def _failure(e: BaseException):
    if isinstance(e, ImportError):
        return "missing", type(e).__name__, e.name or str(e)
    if isinstance(e, errors.FuelError):
        return "fuel", type(e).__name__, str(e)
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return "other", type(e).__name__, first


def serve(conn: Connection):
    adapter = None
    while True:
        try:
            message = recv(conn)
        except (EOFError, OSError):
            return
        if message[0] == "close":
            return
        try:
            if message[0] == "rss":  # the child's peak resident memory, bytes (ru_maxrss: KiB on Linux)
                reply = ("ok", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
            elif message[0] == "init":
                _, spec, kwargs = message
                module, cls = spec.split(":")
                adapter = getattr(importlib.import_module(module), cls)(**kwargs)
                reply = ("ok", adapter.info())
            else:
                _, method, args = message
                reply = ("ok", getattr(adapter, method)(*args))
        except Exception as e:  # noqa: BLE001  (every failure goes back to fuel as one line)
            reply = ("error", _failure(e))
        try:
            send(conn, reply)
        except OSError:
            return


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(Connection(sock.detach()))


if __name__ == "__main__":
    main()
