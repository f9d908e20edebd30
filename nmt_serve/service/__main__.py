"""python -m nmt_serve.service [--host H] [--port P] [--models-dir DIR] [--device auto|cpu|cuda] ...

Every flag is also an environment variable NMT_<NAME> (flags win). See service/settings.py.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError

from nmt_serve.cli.common import describe, fail
from nmt_serve.engine.loader import discover
from nmt_serve.service.settings import Settings, unknown_variables

PROG = "python -m nmt_serve.service"


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_settings(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        described = (field.description or "").replace("%", "%%")  # argparse formats help with %
        if field.annotation is bool:
            # the value goes to pydantic as text, like NMT_<NAME>: "maybe" is an error, not a quiet false
            parser.add_argument(flag, default=None, metavar="BOOL", help=f"{described} (true|false, default {field.default})")
        else:
            parser.add_argument(flag, default=None, help=f"{described} (default {field.default})")
    parser.add_argument("--log-level", default="info")
    args = vars(parser.parse_args(argv))
    level = args.pop("log_level")
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    misspelt, other = unknown_variables(os.environ)
    if misspelt:
        fail(parser, "; ".join(misspelt))
    for line in other:
        logging.getLogger("service").warning(line)
    try:
        return Settings(**{k: v for k, v in args.items() if v is not None})
    except ValidationError as exc:  # pydantic's report is a page long: one line, naming each bad value's flag and variable
        names = [".".join(map(str, e["loc"])) for e in exc.errors()]
        fail(parser, "; ".join(f"--{name.replace('_', '-')} (NMT_{name.upper()}) {e['input']!r}: {e['msg']}"
                               for name, e in zip(names, exc.errors())))


def device_problem(device: str) -> str | None:
    """Why an explicit CUDA device cannot serve, asked of a child process: the API process never imports
    torch (3 s and 200 MB it has no use for), and the engine would find out only after the server is up."""
    if not device.startswith("cuda"):
        return None
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from nmt_serve.engine.loader import device_problem; print(device_problem(sys.argv[1]) or '')", device],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        return f"checking it failed: {lines[-1] if lines else f'exit status {probe.returncode}'}"
    return probe.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    # paths are read now, not when the engine or the first request needs them: a wrong one fails the
    # start with the setting's name rather than leaving a server that answers 503 or 401 forever
    for name, check in (("models_dir", lambda: discover(settings.models_dir)), ("api_keys_file", settings.keys)):
        try:
            check()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{PROG}: error: --{name.replace('_', '-')} (NMT_{name.upper()}): {describe(exc)}", file=sys.stderr)
            return 2
    # an explicit device that cannot serve is a configuration error, not a reason to serve on the CPU
    if problem := device_problem(settings.device):
        print(f"{PROG}: error: --device (NMT_DEVICE) {settings.device}: not usable: {problem}", file=sys.stderr)
        return 2
    if settings.workers > 1:
        from nmt_serve.service.workers import serve_workers

        return serve_workers(settings)
    return serve(settings)


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


if __name__ == "__main__":
    sys.exit(main())
