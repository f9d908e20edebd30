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
from nmt_serve.engine.loader import check_prefer, discover
from nmt_serve.network.checkpoint_info import CheckpointError
from nmt_serve.service.server import LOG_FORMAT, serve
from nmt_serve.service.settings import Settings, unknown_variables

PROG = "python -m nmt_serve.service"


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
    for name, check in (("models_dir", lambda: discover(settings.models_dir)), ("api_keys_file", settings.keys),
                        ("prefer", lambda: check_prefer(settings.models_dir, settings.prefer))):
        try:
            check()
        except (OSError, UnicodeDecodeError, ValueError, CheckpointError) as exc:
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


if __name__ == "__main__":
    sys.exit(main())
