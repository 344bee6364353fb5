"""A peer adapter in a child process, called from fuel's process as if it were local.

The child is `python -m fuelcli.peers.worker FD`: it builds the adapter ("module:Class", kwargs)
and answers calls over a socket pair until it is told to close or the socket closes. Messages are
pickles (protocol 5) whose numpy arrays travel out of band as raw bytes, received into buffers
allocated once for them: a [512, 151936] block of logits is copied once, not pickled.

What comes back when a call fails: fuel's own errors (InputError, NonFinite, ...) as themselves; an
ImportError as MissingDependency with the peer's install advice (exit 4); any other exception, and
a child that dies (a signal, an exit), as PeerFailed (exit 5), one line naming the peer and the
signal with the peer's advice. The child's stderr goes to a temporary file, shown with FUEL_DEBUG=1.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path

from .. import errors


def send(conn: Connection, obj):
    buffers = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    conn.send([r.nbytes for r in raws])
    conn.send_bytes(head)
    for r in raws:
        conn.send_bytes(r)


def recv(conn: Connection):
    sizes = conn.recv()
    head = conn.recv_bytes()
    buffers = []
    for n in sizes:
        b = bytearray(n)
        if n:
            conn.recv_bytes_into(b)
        else:
            conn.recv_bytes()
        buffers.append(b)
    return pickle.loads(head, buffers=buffers)


def describe_exit(returncode: int | None) -> str:
    """'died of SIGSEGV (signal 11)', 'exited with code 3', ... for a child's return code."""
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"died of {name} (signal {-returncode})"
    return f"exited with code {returncode}"


class PeerProcess:
    """The adapter `kind.adapter` built in a child process with kwargs; `call(method, *args)` runs
    one of its methods there. `threads` sizes the child's OpenMP pool (torch's, llama.cpp's)."""

    def __init__(self, kind, threads: int, **kwargs):
        self.kind = kind
        ours, theirs = socket.socketpair()
        self._stderr = tempfile.TemporaryFile()
        root = str(Path(__file__).resolve().parents[2])  # the fuelcli this process runs, first on the path
        env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                        if p]))
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "fuelcli.peers.worker", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=self._stderr, stderr=self._stderr, env=env)
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.info = self._request(("init", kind.adapter, dict(kwargs, threads=threads)), "while loading the model")

    def call(self, method: str, *args):
        return self._request(("call", method, args), f"in {method}()")

    def peak_rss_bytes(self) -> int:
        """The child's peak resident memory so far."""
        return self._request(("rss",), "while reporting its memory")

    def _request(self, message, what: str):
        try:
            send(self.conn, message)
            reply = recv(self.conn)
        except (EOFError, OSError):
            raise self._died(what) from None
        status, payload = reply
        if status == "ok":
            return payload
        raise self._error(payload)

    def _error(self, payload) -> errors.FuelError:
        kind, cls_name, message = payload
        name = self.kind.name
        if kind == "missing":
            return errors.MissingDependency(f"the {name} peer needs `{self.kind.package}` ({message} is not "
                                            f"installed): {self.kind.install}")
        if kind == "fuel":
            cls = getattr(errors, cls_name, None)
            if isinstance(cls, type) and issubclass(cls, errors.FuelError):
                return cls(message)
        return errors.PeerFailed(f"the {name} peer failed: {cls_name}: {message}")

    def _died(self, what: str) -> errors.PeerFailed:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = None
        self._show_stderr()
        return errors.PeerFailed(f"the {self.kind.name} peer ({self.kind.package}, in its own process) "
                                 f"{describe_exit(rc)} {what}; {self.kind.crash}")

    def _show_stderr(self):
        if os.environ.get("FUEL_DEBUG", "") in ("", "0"):
            return
        self._stderr.seek(0)
        sys.stderr.write(self._stderr.read().decode("utf-8", "replace"))

    def close(self):
        """Ask the child to exit; kill it if it does not within a few seconds."""
        if self.proc.poll() is None:
            try:
                send(self.conn, ("close",))
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()
        self._stderr.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the child exits on its closed socket anyway
            pass
