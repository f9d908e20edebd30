"""The engine process: `python -m engine.process --config JSON` (started by the supervisor).

It binds two ZeroMQ sockets in the directory it is given: `calls` (ROUTER: calls from any number of
API processes, replies routed back to the caller) and `status` (PUB: an EngineStatus every
STATUS_INTERVAL_S, from before the models load until it exits). Then it loads the models and runs
the loop: take every call that has arrived, let the core run one step of every batch, send the
replies, and block for calls only when nothing runs. On SIGTERM it stops taking calls, finishes
what runs (up to `graceful_shutdown_s`) and exits; a load failure exits with LOAD_FAILED, which the
supervisor does not restart.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import zmq

from .protocol import SHUTTING_DOWN, Cancel, EngineStatus, Reply, Translate, dumps, loads

log = logging.getLogger("engine")
STATUS_INTERVAL_S = 0.1
IDLE_POLL_MS = 50
LOAD_FAILED = 3  # exit code: the models cannot load; restarting would not help


def addresses(directory: str | Path) -> tuple[str, str]:
    """The calls and status socket addresses of the engine that uses `directory`."""
    return f"ipc://{Path(directory) / 'calls'}", f"ipc://{Path(directory) / 'status'}"


def run(config: dict) -> int:
    from .core import EngineConfig, EngineCore
    from .models import load_models

    context = zmq.Context()
    calls_address, status_address = addresses(config["socket_dir"])
    calls = context.socket(zmq.ROUTER)
    calls.setsockopt(zmq.LINGER, 1000)
    calls.bind(calls_address)
    status = context.socket(zmq.PUB)
    status.setsockopt(zmq.LINGER, 1000)
    status.bind(status_address)
    incarnation = uuid.uuid4().hex
    stopping = {"at": None}

    def on_sigterm(signum, frame):
        stopping["at"] = stopping["at"] or time.monotonic()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides

    def publish(message: EngineStatus) -> None:
        status.send(dumps(message))

    publish(EngineStatus(incarnation, ready=False))
    try:
        import torch

        if config.get("threads"):
            torch.set_num_threads(int(config["threads"]))
        loaded = load_models(config["models_dir"], config["device"], config.get("dtype"), config.get("quantization", "none"),
                             config.get("step_mode", "auto"))
    except Exception as exc:  # noqa: BLE001 - reported to every API process, then exit
        message = f"{type(exc).__name__}: {exc}"
        log.error("model loading failed: %s", message)
        for _ in range(int(2 / STATUS_INTERVAL_S)):  # long enough for the subscribers to hear it
            publish(EngineStatus(incarnation, ready=False, load_error=message))
            time.sleep(STATUS_INTERVAL_S)
        return LOAD_FAILED
    engine_config = EngineConfig(**{k: config[k] for k in EngineConfig.__dataclass_fields__ if k in config})
    meta = {mid: dict(path=path, load_seconds=seconds, src_tokenizer=str(t.src_tokenizer.model_file),
                      src_vocab=str(t.src_tokenizer.vocab_file) if t.src_tokenizer.vocab_file else None)
            for mid, (t, seconds, path) in loaded.items()}
    core = EngineCore({mid: t for mid, (t, _, _) in loaded.items()}, engine_config, model_meta=meta)
    core.incarnation = incarnation
    started = time.perf_counter()
    if programs := core.warmup():
        log.info("captured %d decoder programs in %.1fs", programs, time.perf_counter() - started)
    if engine_config.admission:
        core.calibrate()
    log.info("engine ready: %s (pid %d)", ", ".join(sorted(core.models)), os.getpid())

    routes: dict = {}  # call id -> the caller's socket identity
    poller = zmq.Poller()
    poller.register(calls, zmq.POLLIN)
    last_status = 0.0
    graceful = float(config.get("graceful_shutdown_s", 30.0))
    while True:
        now = time.monotonic()
        if stopping["at"] is not None and (not core.calls or now - stopping["at"] > graceful):
            break
        replies: list[Reply] = []
        if dict(poller.poll(0 if core.busy else IDLE_POLL_MS)):
            while True:
                started = time.perf_counter()
                try:
                    identity, payload = calls.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                message = loads(payload)
                core.stats["io_seconds"] += time.perf_counter() - started
                if stopping["at"] is not None and isinstance(message, Translate):
                    replies.append(Reply(message.id, error=SHUTTING_DOWN, message="the engine is shutting down"))
                    routes[message.id] = identity
                    continue
                if isinstance(message, Cancel):  # nothing is sent back for a cancelled call
                    routes.pop(message.id, None)
                else:
                    routes[message.id] = identity
                replies += core.handle(message)
        replies += core.work()
        started = time.perf_counter()
        for reply in replies:
            identity = routes.pop(reply.id, None)
            if identity is not None:
                calls.send_multipart([identity, dumps(reply)])
        core.stats["io_seconds"] += time.perf_counter() - started
        if now - last_status >= STATUS_INTERVAL_S:
            publish(core.status())
            last_status = now
    for call_id in list(core.calls):  # past the grace period
        identity = routes.pop(call_id, None)
        if identity is not None:
            calls.send_multipart([identity, dumps(Reply(call_id, error=SHUTTING_DOWN, message="the engine shut down"))])
    calls.close()
    status.close()
    context.term()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.process", description=__doc__)
    parser.add_argument("--config", required=True, help="JSON object: the engine's settings and socket_dir")
    args = parser.parse_args(argv)
    config = json.loads(args.config)
    logging.basicConfig(level=str(config.get("log_level", "info")).upper(),
                        format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
