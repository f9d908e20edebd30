"""A starting engine's statuses: not ready, with how far it is (protocol.StartupProgress), published every
interval from a thread of their own until the engine serves or refuses.

Repeated rather than sent once: an API process's status socket that connects while the engine binds its
own misses whatever was published before the connection is made (ZeroMQ's slow joiner: a SUB socket
retries every 100 ms), so a single status at the start was lost, and an engine loading a large model was
silent to the API, its readiness probe saying nothing but "loading", for as long as it loaded.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from nmt_serve.engine.protocol import STARTUP_PHASES, EngineStatus, StartupProgress


class StartupStatus:
    """Owns the engine's status socket from start() to stop(): the main thread only says where it is."""

    def __init__(self, publish: Callable[[EngineStatus], None], incarnation: str, interval_s: float,
                 began: float | None = None):
        """began: when the engine began (time.monotonic()), what progress' seconds count from; default now."""
        self._publish, self.incarnation, self.interval_s = publish, incarnation, interval_s
        self._began = time.monotonic() if began is None else began
        self._where: tuple[str, str | None, int, int] = (STARTUP_PHASES[0], None, 0, 0)  # phase, model, loaded, total:
        # replaced whole, so that the thread never reads one phase's model with another's counts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-startup-status", daemon=True)

    def start(self) -> StartupStatus:
        self._thread.start()
        return self

    def set(self, phase: str, *, models_loaded: int | None = None, models_total: int | None = None) -> None:
        if phase not in STARTUP_PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}")
        _, _, loaded, total = self._where
        self._where = (phase, None, loaded if models_loaded is None else models_loaded, total if models_total is None else models_total)

    def loading(self, model_id: str, loaded: int) -> None:
        """The model about to be read, with how many were read before it."""
        self._where = ("loading", model_id, loaded, self._where[3])

    def progress(self) -> StartupProgress:
        phase, model, loaded, total = self._where
        return StartupProgress(phase, time.monotonic() - self._began, model, loaded, total)

    def stop(self) -> None:
        """No status from here on: the socket is the caller's again (its next status says ready, or why not)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            self._publish(EngineStatus(self.incarnation, ready=False, loading=self.progress()))
            if self._stop.wait(self.interval_s):
                return
