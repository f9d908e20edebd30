"""One API process: a uvicorn server of the app, alone (it supervises the engine process itself) or as
one of the workers of workers.py, on the socket their parent bound."""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

from nmt_serve.service.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RETIRE = signal.SIGUSR1  # to one of several workers: stop taking connections, finish what it holds


def uvicorn_config(app, settings: Settings, **overrides):
    """uvicorn's configuration of the app: the address, and the connections' bounds of the settings (the
    request head's: http_protocol.py)."""
    import uvicorn

    from nmt_serve.service.http_protocol import bounded_protocol

    # uvicorn refuses a request once the connections (its own among them) reach limit_concurrency
    limit = settings.max_connections + 1 if settings.max_connections else None
    # uvicorn's loggers (the access log among them) at the level the process logs at: --log-level warning
    # leaves out the access log's line per request
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    return uvicorn.Config(app, **{
        "host": settings.host, "port": settings.port, "log_level": level,
        "http": bounded_protocol(settings.max_header_bytes, settings.header_timeout_s),
        "timeout_graceful_shutdown": settings.graceful_shutdown_s or None,
        "timeout_keep_alive": settings.keep_alive_s, "limit_concurrency": limit, **overrides})


def serve(settings: Settings, sockets: list[socket.socket] | None = None, on_ready: Callable[[], None] | None = None) -> int:
    """One API process. Alone (no sockets), it starts and supervises the engine process itself (see
    app.py); as one of the workers of workers.py, it serves on the socket its parent bound, in front of
    the engine its parent runs (the parent, not the worker, stops everything when the models fail to load).
    on_ready: called when it is ready (the models it serves known), each time it becomes so."""
    if sockets is None:
        # a multiprocess directory inherited from the environment is not this process's: its files
        # would be summed into this server's metrics (see metrics.py)
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    import uvicorn

    from nmt_serve.service.app import create_app

    server: uvicorn.Server | None = None

    def stop_server() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_load_failure=None if sockets else stop_server, on_ready=on_ready)
    state = app.state.service

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # SIGTERM/SIGINT: readiness turns 503 at once; uvicorn stops accepting connections and
            # lets in-flight requests finish (up to graceful_shutdown_s) before the lifespan ends
            state.draining = True
            super().handle_exit(sig, frame)

    server = Server(uvicorn_config(app, settings))
    if sockets is not None:
        # retired by its parent (SIGHUP, SIGTTOU) while its siblings go on: it stops accepting and finishes
        # what it holds, serving it (the engine stays), where a drain of the whole server refuses new work
        signal.signal(RETIRE, lambda *_: setattr(server, "should_exit", True))
    server.run(sockets=sockets)
    if state.load_error:
        print(f"error: model loading failed: {state.load_error}", file=sys.stderr)
        return 1
    return 0

