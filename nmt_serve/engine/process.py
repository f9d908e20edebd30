"""The engine process: `python -m nmt_serve.engine.process --config JSON` (started by the supervisor).

It binds two ZeroMQ sockets in the directory it is given: `calls` (ROUTER: calls from any number of
API processes, replies routed back to the caller) and `status` (PUB: an EngineStatus every
STATUS_INTERVAL_S from the start; while it starts, not ready and how far it is: startup_status.py).
Then it loads the models and runs two threads: the I/O thread (serve_calls) owns the calls socket,
answers at once what needs no step (refusals by admission, a full queue, expired deadlines) and hands
the rest over; the main thread takes what was handed over, lets the core run one step of every batch,
passes the replies back, and blocks for calls only when nothing runs; with each status it touches the
heartbeat file, whose age tells the supervisor that a serving engine is stuck, and keeps the admission
rate for an engine that replaces it (remembered_rate.py). On SIGTERM it stops taking calls, finishes
what runs (up to `graceful_shutdown_s`) and exits; a load failure exits with LOAD_FAILED, which the
supervisor does not restart.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import zmq

from nmt_serve.engine.protocol import (
    FAILED,
    SHUTTING_DOWN,
    Cancel,
    EngineStatus,
    Reply,
    dumps,
    loads,
)
from nmt_serve.engine.remembered_rate import RateKeeper, RememberedRate
from nmt_serve.engine.startup_status import StartupStatus
from nmt_serve.garbage_collection import CollectorClock, freeze_startup_heap, rarer_young_collections

log = logging.getLogger("engine")
STATUS_INTERVAL_S = 0.1
IDLE_POLL_MS = 50
REPLIES_ADDRESS = "inproc://replies"
CALL_MESSAGES_PER_ROUND = 64
LOAD_FAILED = 3  # exit code: the models cannot load; restarting would not help


def addresses(directory: str | Path) -> tuple[str, str]:
    """The calls and status socket addresses of the engine that uses `directory`."""
    return f"ipc://{Path(directory) / 'calls'}", f"ipc://{Path(directory) / 'status'}"


def heartbeat_file(directory: str | Path) -> Path:
    """Touched by the engine's main loop with every status it sends once it serves: its age tells the
    supervisor, which reads no status, how long the engine has been stuck."""
    return Path(directory) / "heartbeat"


def serve_calls(calls: zmq.Socket, replies: zmq.Socket, core, inbox: queue.Queue, stopping: dict, done: threading.Event) -> None:
    """The I/O thread: owns the calls socket. A call is screened here (core.screen: refusals, expired
    deadlines, unknown models are answered at once, while the main thread is inside a step or a
    join) and the rest go to the main thread through `inbox`; its replies come back on `replies` and
    are routed to the API process that made the call. Blocked in zmq it holds no GIL, and the main
    thread releases the GIL inside every torch op, so an answer waits for at most a few ms."""
    routes: dict[str, bytes] = {}  # call id -> the caller's socket identity
    outgoing: dict[bytes, list[bytes]] = {}  # per caller, its replies of this round: one message each
    poller = zmq.Poller()
    poller.register(calls, zmq.POLLIN)
    poller.register(replies, zmq.POLLIN)

    def answer(reply: Reply) -> None:
        identity = routes.pop(str(reply.id), None)
        if identity is not None:
            outgoing.setdefault(identity, []).append(dumps(reply))

    def take(identity: bytes, payload: bytes) -> None:
        try:
            message = loads(payload)
        except Exception:  # noqa: BLE001 - not one of our messages: nothing to answer it with
            log.exception("an unreadable call was dropped")
            return
        if isinstance(message, Cancel):  # nothing is sent back for a cancelled call
            routes.pop(str(message.id), None)
            inbox.put(message)
            return
        routes[str(message.id)] = identity
        if stopping["at"] is not None:  # the main loop may already have taken its last call
            answer(Reply(message.id, error=SHUTTING_DOWN, message="the engine is shutting down"))
            return
        try:
            settled = core.screen(message)
        except Exception as exc:  # noqa: BLE001 - one bad call must not stop the thread every call goes through
            log.exception("screening a call failed")
            settled = [Reply(message.id, error=FAILED, message=str(exc))]
        if settled is None:
            inbox.put(message)
        for reply in settled or ():
            answer(reply)

    while True:
        last_round = done.is_set()  # replies pushed before `done` was set are drained below
        events = dict(poller.poll(0 if last_round else IDLE_POLL_MS))
        # a message: the caller's identity, then its calls (protocol.py); at most CALL_MESSAGES_PER_ROUND a round,
        # so that a flood of calls does not hold back the replies (refusals among them) of the ones taken; every one
        # in the last round, each answered that the engine shuts down
        budget = 0 if calls not in events else (1 << 62 if last_round else CALL_MESSAGES_PER_ROUND)
        for _ in range(budget):
            try:
                identity, *payloads = calls.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            for payload in payloads:
                take(identity, payload)
        while True:  # the core's replies (and at the end, what it sent before it stopped): id, reply, id, reply, ...
            try:
                frames = replies.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            for call_id, payload in zip(frames[::2], frames[1::2]):
                identity = routes.pop(call_id.decode(), None)
                if identity is not None:
                    outgoing.setdefault(identity, []).append(payload)
        for identity, payloads in outgoing.items():
            calls.send_multipart([identity, *payloads])
        outgoing.clear()
        if last_round:
            return


def send_replies(socket: zmq.Socket, replies: list[Reply]) -> None:
    """The core's replies of one round to the I/O thread, in one message: id, reply, id, reply, ..."""
    if replies:
        socket.send_multipart([part for reply in replies for part in (str(reply.id).encode(), dumps(reply))])


def run(config: dict) -> int:
    # named by the supervisor itself: one that died before the engine got this far left it to init (or a
    # subreaper), whose pid would otherwise pass for the supervisor's and keep the orphan serving nobody
    supervisor = int(config.get("supervisor_pid") or os.getppid())
    began = time.monotonic()
    if config.get("engine_nice"):
        # a lower priority than the API process's, where the operator asks for it: the engine then also
        # yields to every other process of the node (the default, 0, does not)
        os.nice(int(config["engine_nice"]))

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

    startup = StartupStatus(publish, incarnation, STATUS_INTERVAL_S, began=began).start()
    # torch among them: seconds, said by the statuses from here on
    from nmt_serve.engine.core import EngineConfig, EngineCore
    from nmt_serve.engine.loader import engine_device, load_models, plan_loads, plan_memory
    from nmt_serve.network.routing import DEFAULT_CPU_COST_LIMIT

    def refuse(message: str) -> int:
        """Tell every API process why the models cannot serve, then exit (the supervisor does not restart)."""
        startup.stop()
        log.error("model loading failed: %s", message)
        for _ in range(int(2 / STATUS_INTERVAL_S)):  # long enough for the subscribers to hear it
            publish(EngineStatus(incarnation, ready=False, load_error=message))
            time.sleep(STATUS_INTERVAL_S)
        return LOAD_FAILED

    try:
        import torch

        if config.get("threads"):
            torch.set_num_threads(int(config["threads"]))
        engines = int(config.get("engines") or 1)
        gpus = torch.cuda.device_count() if config["device"] in ("cuda", "auto") and torch.cuda.is_available() else 0
        device, sharing = engine_device(config["device"], int(config.get("engine_index") or 0), engines, gpus)
        dtype, quantization = config.get("dtype"), config.get("quantization", "none")
        startup.set("planning")
        load_plan = plan_loads(config["models_dir"], device, float(config.get("cpu_cost_limit", DEFAULT_CPU_COST_LIMIT)),
                             config.get("prefer", ""))
        chosen = load_plan.chosen
        # refused here, before a weight is read, when the budget cannot hold the models and one sentence
        memory = plan_memory(chosen, device, dtype, quantization, budget_gb=float(config.get("memory_budget_gb") or 0),
                             max_batch_sentences=int(config.get("max_batch_sentences") or 0),
                             max_batch_tokens=int(config.get("max_batch_tokens") or 4096), engines=sharing,
                             weights_dir=config.get("weights_dir", ""))
        startup.set("loading", models_total=len(chosen))
        loaded = load_models(config["models_dir"], device, dtype, quantization, config.get("step_mode", "auto"),
                             chosen=chosen, static_rows=0, memory=memory, on_load=startup.loading,
                             weights_dir=config.get("weights_dir", ""))
    except Exception as exc:  # noqa: BLE001 - reported to every API process, then exit
        return refuse(f"{type(exc).__name__}: {exc}")
    # a restarted engine starts from the rate the one before it learned (remembered_rate.py), unless the operator gave one
    admission = config.get("admission", True)
    remembered = RememberedRate.load(config["socket_dir"]) if admission and not float(config.get("admission_rate") or 0) else None
    if remembered is not None:
        config = {**config, "admission_rate": remembered.rate}
        log.info("admission: the previous engine's rate, %.0f decode units/s, instead of a calibration", remembered.rate)
    engine_config = EngineConfig(**{k: config[k] for k in EngineConfig.__dataclass_fields__ if k in config})
    meta = {mid: dict(path=path, load_seconds=seconds, src_tokenizer=str(t.src_tokenizer.model_file),
                      src_vocab=str(t.src_tokenizer.vocab_file) if t.src_tokenizer.vocab_file else None)
            for mid, (t, seconds, path) in loaded.items()}
    core = EngineCore({mid: t for mid, (t, _, _) in loaded.items()}, engine_config, model_meta=meta, memory=memory,
                      unloaded=load_plan.unloaded)
    core.incarnation = incarnation
    if remembered is not None:
        core.admission.output_ratio = remembered.output_ratio
    keep_rate = RateKeeper(config["socket_dir"], remembered)
    started = time.perf_counter()
    try:  # the models' first runs: one that fails here (weights that load but do not compute) fails every time
        startup.set("capturing", models_loaded=len(loaded))
        if programs := core.warmup():
            log.info("captured %d decoder programs in %.1fs", programs, time.perf_counter() - started)
        if (over := core.over_budget()) is not None:
            return refuse(over)
        startup.set("first runs")
        core.first_runs()
    except Exception as exc:  # noqa: BLE001 - reported to every API process, then exit (no restart loop)
        log.exception("the models' first runs failed")
        return refuse(f"the first runs of {', '.join(sorted(core.models))} failed: {type(exc).__name__}: {exc}")
    # the models, the captured programs and everything else start-up built, out of the collector's reach: a
    # full collection walked ~170,000 objects for ~100 ms here, a stall of every running sentence
    core.stats["gc_frozen_objects"] = float(freeze_startup_heap())
    rarer_young_collections()
    collector = CollectorClock().start()
    startup.stop()  # the loop's statuses from here on, the first of them at once
    core.stats["startup_seconds"] = time.monotonic() - began
    log.info("engine ready: %s (pid %d)", ", ".join(sorted(core.models)), os.getpid())
    heartbeat = heartbeat_file(config["socket_dir"])

    inbox: queue.Queue = queue.Queue()  # calls screened by the I/O thread, for the core
    replies_out = context.socket(zmq.PUSH)  # the core's replies, for the I/O thread to route
    replies_out.bind(REPLIES_ADDRESS)
    replies_in = context.socket(zmq.PULL)
    replies_in.connect(REPLIES_ADDRESS)
    io_done = threading.Event()
    io = threading.Thread(target=serve_calls, args=(calls, replies_in, core, inbox, stopping, io_done), name="engine-io", daemon=True)
    io.start()
    last_status = 0.0
    graceful = float(config.get("graceful_shutdown_s", 30.0))
    while True:
        now = time.monotonic()
        if stopping["at"] is not None and inbox.empty() and (not (core.calls or core.busy) or now - stopping["at"] > graceful):
            break
        if not io.is_alive():  # no call could reach the core any more: exit, and the supervisor restarts it
            raise RuntimeError("the engine's I/O thread stopped")
        if now - last_status >= STATUS_INTERVAL_S and os.getppid() != supervisor:
            # the API process that started it is gone (killed: SIGKILL, the OOM killer) and nobody will
            # call or stop it; a new one starts an engine of its own
            log.error("the supervising process %d is gone; the engine exits", supervisor)
            shutil.rmtree(config["socket_dir"], ignore_errors=True)
            os._exit(1)  # at once: no subscriber is left for the sockets' lingering messages
        replies: list[Reply] = []
        try:
            # block for calls only when nothing runs
            message = inbox.get_nowait() if core.busy else inbox.get(timeout=IDLE_POLL_MS / 1000)
        except queue.Empty:
            message = None
        while message is not None:
            replies += core.handle(message)
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                message = None
        replies += core.work()
        started = time.perf_counter()
        send_replies(replies_out, replies)
        core.stats["io_seconds"] += time.perf_counter() - started
        if now - last_status >= STATUS_INTERVAL_S:
            # the heartbeat first: once an API process has heard this engine is ready, its supervisor
            # can tell that it serves (and kill it should it stop from then on)
            heartbeat.touch()
            if admission:
                keep_rate(core.admission.rate, core.admission.output_ratio, now)
            core.stats.update(gc_seconds=collector.seconds, gc_full_collections=float(collector.full_collections))
            publish(core.status())
            last_status = now
    # past the grace period
    send_replies(replies_out, [Reply(call_id, error=SHUTTING_DOWN, message="the engine shut down") for call_id in core.calls])
    io_done.set()  # the I/O thread sends what is queued, then stops
    io.join(timeout=5)
    replies_out.close()
    replies_in.close()
    calls.close()
    status.close()
    context.term()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nmt_serve.engine.process", description=__doc__)
    parser.add_argument("--config", required=True, help="JSON object: the engine's settings, socket_dir and supervisor_pid")
    args = parser.parse_args(argv)
    config = json.loads(args.config)
    logging.basicConfig(level=str(config.get("log_level", "info")).upper(),
                        format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
