"""One API process: a uvicorn server of the app, alone (it supervises the engine process itself) or as
one of the workers of workers.py, on the socket their parent bound."""
from __future__ import annotations

import os
import socket
import sys

from nmt_serve.service.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def serve(settings: Settings, sockets: list[socket.socket] | None = None) -> int:
    """One API process. Alone (no sockets), it starts and supervises the engine process itself (see
    app.py); as one of the workers of workers.py, it serves on the socket its parent bound, in front of
    the engine its parent runs (the parent, not the worker, stops everything when the models fail to load)."""
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

    app = create_app(settings, on_load_failure=None if sockets else stop_server)
    state = app.state.service

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # SIGTERM/SIGINT: readiness turns 503 at once; uvicorn stops accepting connections and
            # lets in-flight requests finish (up to graceful_shutdown_s) before the lifespan ends
            state.draining = True
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="info",
        timeout_graceful_shutdown=settings.graceful_shutdown_s or None,
    )
    server = Server(config)
    server.run(sockets=sockets)
    if state.load_error:
        print(f"error: model loading failed: {state.load_error}", file=sys.stderr)
        return 1
    return 0

