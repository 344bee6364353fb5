"""Bind, then run the app on uvicorn; the first Ctrl-C stops generating and shuts down cleanly.

fuel binds the listening socket itself and hands it to uvicorn: a port in use becomes a one-line
error, and --port 0 (any free port) can be reported. uvicorn's own signal handling does the
graceful shutdown; on top of it the engine worker cancels the running and waiting jobs at once, so
a long generation does not hold the shutdown up.
"""

from __future__ import annotations

import copy
import logging
import socket

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from ..errors import InputError
from .app import create_app
from .jobs import ServedModel
from .worker import EngineWorker

log = logging.getLogger("fuel.serve")

GRACEFUL_S = 5  # after the first Ctrl-C, how long open connections get to finish


def bind(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:  # getaddrinfo would wrap it silently
        raise InputError(f"cannot listen on {host}:{port}: the port must be in 0..65535")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
    sock.setblocking(False)
    return sock


def log_config(level: str) -> dict:
    """uvicorn's logging (its format, access lines) on stderr, plus fuel's own logger."""
    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["handlers"]["access"]["stream"] = "ext://sys.stderr"
    cfg["loggers"]["fuel.serve"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        cfg["loggers"][name]["level"] = level.upper()
    return cfg


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, worker: EngineWorker):
        super().__init__(config)
        self.worker = worker

    def handle_exit(self, sig, frame):
        self.worker.stop()
        super().handle_exit(sig, frame)


def make_server(model: ServedModel, worker: EngineWorker, api_key: str | None, log_level: str = "info",
                metrics: bool = False) -> _Server:
    app = create_app(model, worker, api_key, metrics)
    config = uvicorn.Config(app, log_config=log_config(log_level), log_level=log_level,
                            timeout_graceful_shutdown=GRACEFUL_S, lifespan="off")
    return _Server(config, worker)


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def run(model: ServedModel, worker: EngineWorker, sock: socket.socket, api_key: str | None,
        log_level: str = "info", metrics: bool = False) -> None:
    """Serves until Ctrl-C (KeyboardInterrupt propagates once the server has shut down)."""
    server = make_server(model, worker, api_key, log_level, metrics)
    worker.start()
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
        worker.join(timeout=GRACEFUL_S)
