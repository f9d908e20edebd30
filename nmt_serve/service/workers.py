"""Several API worker processes in front of the engine processes (`--workers N`, N > 1).

The parent (serve_workers) runs the engines' supervisors (`--engines`, one by default), binds the listening
socket and starts the workers, each a uvicorn server on that socket set up as a single API process is
(run_worker: the same `serve`, its draining flag set at SIGTERM, its logging). They get their settings from
the parent, connect to every one of the parent's engines, and write their metrics where any of them sums
them for a scrape (prometheus_client's multiprocess mode, in a private directory removed at exit).

Signals to the parent, as uvicorn's and gunicorn's supervisors take them: SIGTERM and SIGINT drain and
stop; SIGHUP replaces every worker, one after another (each old one drains once its replacement is
ready, so no capacity is lost on the way); SIGTTIN adds a worker, SIGTTOU retires one (never the last).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time

from nmt_serve.service.settings import Settings

log = logging.getLogger("service")
QUICK_DEATH_S = 10.0  # a worker that exits this soon after it started ...
RESTART_PAUSE_S = 1.0  # ... is replaced after this pause
PARENT_CHECK_S = 0.5  # how often a worker checks that its parent lives


def listening_socket(settings: Settings) -> socket.socket:
    """The socket every worker serves, bound as uvicorn binds it for its own workers (and logged as a single API
    process logs it), and listening from here on: a connection made while the workers start (or one is replaced
    after all had exited) waits in the backlog for the first to accept it instead of being refused; uvicorn's
    bind alone leaves the listen to the workers' servers."""
    import uvicorn

    config = uvicorn.Config("", host=settings.host, port=settings.port, workers=settings.workers, log_level="info")
    sock = config.bind_socket()
    sock.listen(config.backlog)  # the backlog each worker's server listens with (listen again changes nothing)
    return sock


def run_worker(settings: Settings, sock: socket.socket, metrics_dir: str, log_level: int, ready=None) -> None:
    """An API worker process (spawned by serve_workers), set up as a single API process is; ready: a
    multiprocessing Event it sets once it is ready (what a SIGHUP's replacement waits for)."""
    # prometheus_client picks where values live (memory or files) when it is first imported
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    from nmt_serve.service.server import LOG_FORMAT, serve

    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    threading.Thread(target=exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    try:
        sys.exit(serve(settings, [sock], on_ready=ready.set if ready is not None else None))
    except KeyboardInterrupt:  # uvicorn raises the SIGINT it drained for again, once it is done
        pass


def exit_with_parent(parent: int) -> None:
    """A worker whose parent died (SIGKILL, the OOM killer) drains and exits, as at its parent's SIGTERM:
    left running, it would keep the port, and answer 503 for want of the engine, which exits too."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    log.error("the parent process (pid %d) is gone; stopping", parent)
    os.kill(os.getpid(), signal.SIGTERM)


def serve_workers(settings: Settings) -> int:
    """Several API processes in front of the engine processes run from here. The workers are uvicorn
    servers on the socket bound here, each as a single API process is (its draining flag set at
    SIGTERM, its logging), with these settings and the engines' sockets; they write their metrics
    where any of them sums them for a scrape (prometheus_client's multiprocess mode, in a private
    directory removed at exit).

    Not uvicorn's own worker supervisor: at SIGTERM or SIGINT the listening socket must close here at
    once (a copy left open here keeps taking connections that nobody accepts: they hang instead of
    being refused), and every worker gets SIGTERM at once, so that all of them turn readiness 503,
    stop accepting and finish what they hold together; the engines stop after the last of them."""
    import multiprocessing
    import shutil
    import tempfile
    from multiprocessing.connection import wait

    from prometheus_client import multiprocess
    from uvicorn.config import STARTUP_FAILURE

    from nmt_serve.engine.process import LOAD_FAILED
    from nmt_serve.engine.supervisor import EngineSupervisor
    from nmt_serve.engine.weights_dir import make_weights_dir
    from nmt_serve.service.server import RETIRE

    # the signal handlers only wake the loop below (a pipe it waits on beside the workers), which does
    # the work: a handler that ran while a worker was being replaced would miss the new one
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    stop = threading.Event()
    failure: list[str] = []
    asked: list[int] = []  # SIGHUP, SIGTTIN, SIGTTOU received, in order, for the loop to act on

    def wake() -> None:
        try:
            os.write(wake_write, b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def request_stop(*_) -> None:
        stop.set()
        wake()

    def request_change(signum, _frame) -> None:
        asked.append(signum)
        wake()

    def on_engine_exit(code: int) -> None:  # on the supervisor's thread
        if code == LOAD_FAILED:  # no models: stop the whole server
            failure.append("model loading failed; see the engine's log above")
            request_stop()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    for signum in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(signum, request_change)
    weights_dir = make_weights_dir(settings.engines, settings.device, settings.shared_weights)
    supervisors = [EngineSupervisor(settings.engine_config(i, weights_dir), on_exit=on_engine_exit) for i in range(settings.engines)]
    for supervisor in supervisors:
        supervisor.start()
    metrics_dir = tempfile.mkdtemp(prefix="nmt-metrics-")
    workers: list[multiprocessing.process.BaseProcess] = []
    retiring: list[multiprocessing.process.BaseProcess] = []  # told to drain and stop: not replaced
    try:
        worker_settings = settings.model_copy(update={"engine_socket_dir": os.pathsep.join(s.socket_dir for s in supervisors)})
        sock = listening_socket(settings)
        spawn = multiprocessing.get_context("spawn")
        level = logging.getLogger().level

        started_at: dict[int, float] = {}
        ready_of: dict[int, multiprocessing.synchronize.Event] = {}

        def start_worker() -> multiprocessing.process.BaseProcess:
            ready = spawn.Event()
            worker = spawn.Process(target=run_worker, args=(worker_settings, sock, metrics_dir, level, ready), name="nmt-serve-worker")
            worker.start()
            started_at[worker.pid] = time.monotonic()
            ready_of[worker.pid] = ready
            return worker

        def retire(worker: multiprocessing.process.BaseProcess) -> None:
            os.kill(worker.pid, RETIRE)  # it stops accepting and serves what it holds, as its siblings go on
            retiring.append(worker)

        def replace(old: multiprocessing.process.BaseProcess) -> multiprocessing.process.BaseProcess:
            """A new worker in old's place; old drains once the new one is ready (or stays, if it fails)."""
            new = start_worker()
            while not ready_of[new.pid].wait(0.1):
                if stop.is_set() or new.exitcode is not None:
                    break
            if new.exitcode is not None and not stop.is_set():
                log.error("the new API worker (pid %d) exited with code %s; pid %d stays", new.pid, new.exitcode, old.pid)
                started_at.pop(new.pid, None)
                ready_of.pop(new.pid, None)
                return old
            retire(old)
            return new

        for _ in range(settings.workers):
            workers.append(start_worker())
        log.info("API workers started (pids %s)", ", ".join(str(w.pid) for w in workers))
        while not stop.is_set():
            wait([wake_read] + [w.sentinel for w in workers + retiring])
            while _readable(wake_read):  # the wake-ups are read: the next wait waits
                os.read(wake_read, 4096)
            for worker in [w for w in retiring if w.exitcode is not None]:
                retiring.remove(worker)
                started_at.pop(worker.pid, None)
                ready_of.pop(worker.pid, None)
                multiprocess.mark_process_dead(worker.pid, metrics_dir)
            while asked and not stop.is_set():
                signum = asked.pop(0)
                if signum == signal.SIGHUP:  # one after another: a new worker ready, then the old one drains
                    log.info("SIGHUP: replacing the API workers (pids %s)", ", ".join(str(w.pid) for w in workers))
                    for i, old in enumerate(workers):
                        if not stop.is_set():
                            workers[i] = replace(old)
                    log.info("API workers replaced (pids %s)", ", ".join(str(w.pid) for w in workers))
                elif signum == signal.SIGTTIN:
                    workers.append(start_worker())
                    log.info("SIGTTIN: %d API workers (pid %d started)", len(workers), workers[-1].pid)
                elif len(workers) > 1:  # SIGTTOU
                    retire(workers.pop())
                    log.info("SIGTTOU: %d API workers (pid %d drains and stops)", len(workers), retiring[-1].pid)
                else:
                    log.warning("SIGTTOU ignored: the last API worker stays")
            for i, worker in enumerate(workers):
                if worker.exitcode is None or stop.is_set():
                    continue
                multiprocess.mark_process_dead(worker.pid, metrics_dir)  # its requests in flight went with it
                if worker.exitcode == STARTUP_FAILURE:  # the app or the socket is broken: another would fail alike
                    failure.append(f"an API worker (pid {worker.pid}) failed to start")
                    stop.set()
                    break
                log.error("API worker (pid %d) exited with code %s; starting another", worker.pid, worker.exitcode)
                ready_of.pop(worker.pid, None)
                if time.monotonic() - started_at.pop(worker.pid) < QUICK_DEATH_S:
                    wait([wake_read], RESTART_PAUSE_S)  # one that dies as it starts is not restarted in a tight loop
                    if stop.is_set():
                        break
                workers[i] = start_worker()
        sock.close()
        for worker in workers:
            if worker.exitcode is None:
                worker.terminate()  # SIGTERM: it drains as a single API process does
        for worker in workers + retiring:
            worker.join()
        log.info("API workers stopped")
    finally:
        for worker in workers + retiring:  # left by an error above: none keeps serving, or holding the socket
            if worker.exitcode is None:
                worker.terminate()
                worker.join()
        stopping = [threading.Thread(target=s.stop, args=(settings.graceful_shutdown_s,)) for s in supervisors]
        for thread in stopping:  # side by side: each engine may take up to graceful_shutdown_s to finish
            thread.start()
        for thread in stopping:
            thread.join()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.close(wake_read)
        os.close(wake_write)
    if failure:
        print(f"error: {failure[0]}", file=sys.stderr)
        return 1
    return 0


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])
