"""python -m service [--host H] [--port P] [--models-dir DIR] [--device auto|cpu|cuda] ...

Every flag is also an environment variable NMT_<NAME> (flags win). See service/settings.py.
"""
from __future__ import annotations

import argparse
import logging
import sys

from .models import discover
from .settings import Settings


def parse_settings(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, type=lambda v: v.lower() in ("1", "true", "yes", "on"), default=None, metavar="BOOL", help=field.description)
        else:
            parser.add_argument(flag, default=None, help=f"{field.description or ''} (default {field.default})")
    parser.add_argument("--log-level", default="info")
    args = vars(parser.parse_args(argv))
    level = args.pop("log_level")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return Settings(**{k: v for k, v in args.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from .app import create_app

    settings = parse_settings(argv)
    try:
        discover(settings.models_dir)  # fail at once on a wrong path rather than serve 503 forever
        settings.keys()
    except (FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server: uvicorn.Server | None = None

    def stop_server() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_load_failure=stop_server)
    state = app.state.service

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # SIGTERM/SIGINT: readiness turns 503 at once; uvicorn stops accepting connections and
            # lets in-flight requests finish (up to graceful_shutdown_s) before the lifespan ends
            state.ready = False
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="info",
        timeout_graceful_shutdown=settings.graceful_shutdown_s or None,
    )
    server = Server(config)
    server.run()
    if state.load_error:
        print(f"error: model loading failed: {state.load_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
