"""python -m nmt_serve.service [--host H] [--port P] [--models-dir DIR] [--device auto|cpu|cuda] ...

Every flag is also an environment variable NMT_<NAME> (flags win). See service/settings.py.
"""
from __future__ import annotations

import argparse
import logging
import os
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
        return serve_workers(settings)
    return serve(settings)


def serve(settings: Settings) -> int:
    """One API process; it starts and supervises the engine process itself (see app.py)."""
    import uvicorn

    from nmt_serve.service.app import create_app

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
            state.draining = True
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


def serve_workers(settings: Settings) -> int:
    """Several API processes (uvicorn workers) in front of one engine process run from here: the
    workers read their settings from NMT_* variables and connect to this engine's sockets, and write
    their metrics where any of them sums them for a scrape (prometheus_client's multiprocess mode)."""
    import copy
    import os
    import shutil
    import signal
    import tempfile

    import uvicorn
    from prometheus_client import multiprocess
    from uvicorn.config import LOGGING_CONFIG
    from uvicorn.supervisors import Multiprocess

    from nmt_serve.engine.process import LOAD_FAILED
    from nmt_serve.engine.supervisor import EngineSupervisor

    class Workers(Multiprocess):
        """uvicorn's workers, but the listening socket closes in this process at the first SIGTERM or
        SIGINT: the workers close their copies as they start draining, and a copy left open here
        would keep taking connections that nobody accepts (they hang instead of being refused)."""

        def handle_term(self) -> None:
            self._close_sockets()
            super().handle_term()

        def handle_int(self) -> None:
            self._close_sockets()
            super().handle_int()

        def _close_sockets(self) -> None:
            for sock in self.sockets:
                sock.close()

        def keep_subprocess_alive(self) -> None:
            before = {p.pid for p in self.processes}
            super().keep_subprocess_alive()
            for pid in before - {p.pid for p in self.processes}:  # a worker died: its in-flight gauge goes with it
                multiprocess.mark_process_dead(pid)

    failed = {"code": None}

    def on_exit(code: int) -> None:
        if code == LOAD_FAILED:  # no models: stop the whole server
            failed["code"] = code
            os.kill(os.getpid(), signal.SIGTERM)

    supervisor = EngineSupervisor(settings.engine_config(), on_exit=on_exit)
    supervisor.start()
    metrics_dir = tempfile.mkdtemp(prefix="nmt-metrics-")
    try:
        values = settings.model_dump()
        values["engine_socket_dir"] = supervisor.socket_dir
        for name, value in values.items():
            os.environ[f"NMT_{name.upper()}"] = "" if value is None else str(value)
        if settings.dtype is None:
            del os.environ["NMT_DTYPE"]
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # read by the workers' prometheus_client at import
        # the workers log as a single API process does (uvicorn configures logging in each worker)
        log_config = copy.deepcopy(LOGGING_CONFIG)
        log_config["formatters"]["service"] = {"format": LOG_FORMAT}
        log_config["handlers"]["service"] = {"formatter": "service", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
        log_config["root"] = {"handlers": ["service"], "level": logging.getLevelName(logging.getLogger().level)}
        config = uvicorn.Config("nmt_serve.service.app:create_app", factory=True, host=settings.host, port=settings.port,
                                workers=settings.workers, log_level="info", log_config=log_config,
                                timeout_graceful_shutdown=settings.graceful_shutdown_s or None)
        Workers(config, sockets=[config.bind_socket()]).run()
    finally:
        supervisor.stop(settings.graceful_shutdown_s)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if failed["code"] is not None:
        print("error: model loading failed; see the engine's log above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
