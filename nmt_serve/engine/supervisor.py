"""Starts the engine process and keeps it running.

The process that owns the supervisor (the API server, or with several API workers their parent)
starts `python -m nmt_serve.engine.process` with the engine's settings and a private socket directory, and a
thread waits on it. If the engine dies (killed for memory, a CUDA error, a crash) the thread logs
it, tells `on_exit` (so that the calls waiting on it fail at once) and starts a new one, with a
growing pause if it keeps dying. An engine that serves but sent no status for
`engine_heartbeat_timeout_s` (stopped, deadlocked, stuck in a kernel) is killed, and so restarted like
one that died; one still loading its models is not (loading may take minutes). An engine whose
models cannot load is not restarted: `on_exit` hears the LOAD_FAILED code. `stop()` sends SIGTERM (the engine
finishes what runs, see process.py) and removes the directory of the engines' shared weights (weights_dir.py).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from nmt_serve.engine.process import LOAD_FAILED, STATUS_INTERVAL_S, addresses, heartbeat_file
from nmt_serve.engine.weights_dir import remove_weights_dir

log = logging.getLogger("nmt_serve.engine.supervisor")
ROOT = Path(__file__).resolve().parents[2]
RESTART_PAUSES_S = (0.0, 0.5, 1, 2, 5, 10)  # after the 1st, 2nd, ... death in a row
STABLE_AFTER_S = 30.0  # an engine that ran this long resets the pause
WATCH_INTERVAL_S = 0.5  # how often the heartbeat's age is checked
# How long an OpenMP thread of the engine spins, waiting for more work, before it sleeps (GNU OpenMP's
# GOMP_SPINCOUNT, whose default of 300,000 kept a core busy ~7.5 ms after each op of several threads on this
# project's AMD EPYC): the engine's steps leave microseconds between their ops, but after a step that ran on
# several threads (a lone search on cores the others left idle: cpu_room.py) the spinning took the core the
# API process and the lanes wanted. 10,000 spins ~0.25 ms; a lone sentence's step was as fast (BENCHMARKS.md).
# An operator's own setting is kept.
OPENMP_SPINCOUNT = "10000"


def engine_environment() -> dict[str, str]:
    """The engine process's environment: this process's, with OPENMP_SPINCOUNT unless one is set."""
    return {"GOMP_SPINCOUNT": OPENMP_SPINCOUNT, **os.environ}


class EngineSupervisor:
    def __init__(self, config: dict, *, on_exit: Callable[[int], None] | None = None):
        """config: the engine's settings (see process.py); on_exit(code) hears every engine exit."""
        self.socket_dir = tempfile.mkdtemp(prefix="nmt-engine-")  # private (0700): only this user reaches the sockets
        # supervisor_pid: the engine exits once its parent is no longer this process (process.py)
        self.config = dict(config, socket_dir=self.socket_dir, supervisor_pid=os.getpid())
        self.on_exit = on_exit
        self.heartbeat_timeout_s = float(config.get("engine_heartbeat_timeout_s") or 30.0)
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def addresses(self) -> tuple[str, str]:
        return addresses(self.socket_dir)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="engine-supervisor", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        heartbeat_file(self.socket_dir).unlink(missing_ok=True)  # the last engine's: this one has not served yet
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nmt_serve.engine.process", "--config", json.dumps(self.config)], cwd=ROOT,
            env=engine_environment(),
        )
        self._spawned_at = time.monotonic()
        log.info("engine process started (pid %d)", self.process.pid)

    def _watch(self) -> None:
        deaths = 0
        while True:
            code = self._wait_or_kill_if_stuck()
            if self._stopping.is_set():
                return
            if self.on_exit:
                self.on_exit(code)
            if code == LOAD_FAILED:
                log.error("the engine could not load its models; not restarting it")
                return
            deaths = 1 if time.monotonic() - self._spawned_at > STABLE_AFTER_S else deaths + 1
            pause = RESTART_PAUSES_S[min(deaths, len(RESTART_PAUSES_S)) - 1]
            log.error("the engine process exited with code %s; restarting it in %.1fs", code, pause)
            if self._stopping.wait(pause):
                return
            self.restarts += 1
            self._spawn()

    def _wait_or_kill_if_stuck(self) -> int:
        """The engine's exit code; an engine that serves but whose heartbeat is older than the timeout
        gets SIGKILL (SIGTERM would wait on the loop that is stuck, and a stopped process runs no
        handler), and its exit is then handled as any other."""
        heartbeat = heartbeat_file(self.socket_dir)
        while True:
            try:
                return self.process.wait(WATCH_INTERVAL_S)
            except subprocess.TimeoutExpired:
                pass
            if self._stopping.is_set():
                continue
            try:
                silent = time.time() - heartbeat.stat().st_mtime
            except FileNotFoundError:  # loading its models: not serving yet
                continue
            if silent > max(self.heartbeat_timeout_s, 10 * STATUS_INTERVAL_S):
                log.error("the engine sent no status for %.1fs; killing it (pid %d) to restart it", silent, self.process.pid)
                self.process.kill()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, wait up to `timeout` for the engine to finish, then kill it."""
        self._stopping.set()
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        # the siblings' too (one directory for all): an engine still running keeps what it mapped
        remove_weights_dir(self.config.get("weights_dir", ""))
