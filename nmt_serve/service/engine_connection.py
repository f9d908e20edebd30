"""The API process's connection to one engine process, over ZeroMQ.

Every call gets an id unique to this connection, goes out on a DEALER socket and is answered once on it;
the awaiting coroutine gets the reply, or an EngineUnavailable error when the engine is lost first.
Cancelling the coroutine (timeout, client gone) tells the engine to drop the call's work.
The engine's status (readiness, models, statistics for /metrics) arrives a few times a second on a
SUB socket. The engine that held the waiting calls is gone when its process (the status names it) has
exited, which is checked every WATCH_INTERVAL_S, when a status comes from a new incarnation, or when
none came for `heartbeat_timeout_s` from an engine that serves (a live process that stopped answering:
stuck, which its supervisor kills and restarts): the calls fail at once with 503 rather than wait for
their deadline. A live engine that is only slow (starved of CPU by its neighbours, inside a long step)
is not taken for a dead one, nor is one still loading its models.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any, Callable

import zmq
import zmq.asyncio

from nmt_serve.engine.protocol import (
    Cancel,
    EngineStatus,
    Reply,
    dumps,
    loads,
)

log = logging.getLogger("nmt_serve.service.engine_calls")
WATCH_INTERVAL_S = 0.25  # how often the engine process's liveness and the heartbeat are checked
SEND_RETRY_S = 0.005  # calls that find the engine's queue full (ZeroMQ's high-water mark) try again this often


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


class EngineUnavailable(Exception):
    """The engine is not running (starting, restarting, or it died with the call)."""


class EngineConnection:
    def __init__(self, calls_address: str, status_address: str, *, heartbeat_timeout_s: float = 30.0,
                 on_status: Callable[[EngineStatus], None] | None = None):
        self.calls_address, self.status_address = calls_address, status_address
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.on_status = on_status
        self.status: EngineStatus | None = None
        self.last_status_at = 0.0
        self.losses = 0  # times the engine was lost while this client ran
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}-{id(self):x}"
        self._pending: dict[Any, asyncio.Future] = {}
        self._movable: dict[Any, str] = {}  # of the pending calls, those another engine may take over: id -> model
        self.work_in_flight = 0.0  # the work of the calls in _pending (call's `work`)
        self._tasks: list[asyncio.Task] = []
        self._context: zmq.asyncio.Context | None = None
        self._outbox: list[bytes] = []  # calls (and cancels) for the next flush, in order
        self._flush_due = False
        self._settled = asyncio.Event()  # set at the first status that says the engine serves, or cannot

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        # the calls socket is a plain one read from the event loop directly (_read_replies): zmq.asyncio's
        # futures, events and flag enums per message cost about 2.5x the CPU of a round trip this way
        self._calls = zmq.Socket(self._context, zmq.DEALER)
        self._calls.setsockopt(zmq.LINGER, 0)
        self._calls.connect(self.calls_address)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._calls.getsockopt(zmq.FD), self._read_replies)
        self._status = self._context.socket(zmq.SUB)
        self._status.setsockopt(zmq.SUBSCRIBE, b"")
        self._status.setsockopt(zmq.LINGER, 0)
        self._status.connect(self.status_address)
        self._tasks = [asyncio.create_task(self._read_status(), name="engine-status"),
                       asyncio.create_task(self._watch(), name="engine-watch")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self.engine_lost("the server is shutting down")
        if self._context is not None:
            self._loop.remove_reader(self._calls.getsockopt(zmq.FD))
            self._calls.close()
            self._status.close()
            self._context.term()
            self._context = None

    async def wait_for_settled(self, timeout: float) -> bool:
        """Wait (up to timeout seconds) until the engine has said that it serves, or that its models cannot load
        (a starting engine's statuses, which say how far it is, do not end the wait)."""
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    @property
    def in_flight(self) -> int:
        """Calls sent (or about to be) and not answered yet."""
        return len(self._pending)

    def pending_ids(self) -> list:
        return list(self._pending)

    @property
    def alive(self) -> bool:
        return self.status is not None and time.monotonic() - self.last_status_at < self.heartbeat_timeout_s

    @property
    def ready(self) -> bool:
        return self.alive and self.status.ready

    def engine_lost(self, why: str, *, down: bool = False) -> None:
        """Fail every waiting call at once (the engine that held them is gone); down: the engine
        process exited, or was silent past the heartbeat timeout (its supervisor kills it), so not
        ready until an engine reports again."""
        if down:
            if self.last_status_at:  # heard of once, whoever notices first (the supervisor, the watch)
                self.losses += 1
            self.last_status_at = 0.0
        pending, self._pending = self._pending, {}
        self._movable = {}
        self._outbox = []  # calls not sent yet are among those failed: the next engine must not do their work
        for future in pending.values():
            if not future.done():
                future.set_exception(EngineUnavailable(why))

    # ------------------------------------------------------------------ calls
    def new_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    async def call(self, message: Any, work: float = 1.0, movable: bool = False) -> Reply:
        """Send a call (its id from new_id()) and await its reply; work: what it asks of the engine (its source
        tokens), counted in work_in_flight meanwhile; movable: should this engine stall, the call may be taken from
        it (move_waiting)."""
        if not self.ready:
            raise EngineUnavailable("the engine is not ready")
        future = self._loop.create_future()
        self._pending[message.id] = future
        if movable:
            self._movable[message.id] = message.model
        self.work_in_flight += work
        try:
            self._send(dumps(message))
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(message.id, None) is not None and self._context is not None:
                self._send(dumps(Cancel(message.id)))  # the engine drops its work
            raise
        finally:
            self._pending.pop(message.id, None)
            if movable:
                self._movable.pop(message.id, None)
            self.work_in_flight -= work

    def move_waiting(self, elsewhere: Callable[[str], bool], why: str) -> int:
        """Fail the movable waiting calls whose model `elsewhere` serves, as if this engine were lost (their callers
        send them to another), and tell this engine to drop their work, which it does when it runs again. The
        number of calls moved."""
        moved = 0
        for call_id in [call_id for call_id, model in self._movable.items() if elsewhere(model)]:
            del self._movable[call_id]
            future = self._pending.pop(call_id, None)
            if future is not None and not future.done():
                future.set_exception(EngineUnavailable(why))
                self._send(dumps(Cancel(call_id)))
                moved += 1
        return moved

    def _send(self, data: bytes) -> None:
        """Queue a call for the next flush: the calls made in one turn of the event loop go out as one
        message (the engine takes a message's calls together; a message per call cost each side's
        ZeroMQ and the engine's I/O thread several times as much CPU per call)."""
        self._outbox.append(data)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if not self._outbox or self._context is None:
            return
        try:
            self._calls.send_multipart(self._outbox, zmq.NOBLOCK)
        except zmq.Again:  # SNDHWM messages queued for an engine that takes none (stuck, or not started yet)
            self._flush_due = True
            self._loop.call_later(SEND_RETRY_S, self._flush)
            return
        self._outbox = []
        # the socket's descriptor signals only changes (edge-triggered), and a send may have taken in the
        # arrival of replies: read what is there now, or the reader would not be woken for it
        if self._calls.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._read_replies()

    def _read_replies(self) -> None:
        """Every reply that has arrived (the loop calls this when the calls socket's descriptor signals)."""
        while True:
            try:
                frames = self._calls.recv_multipart(zmq.NOBLOCK)  # one or more replies (protocol.py)
            except zmq.Again:
                return
            except zmq.ZMQError:  # closed (stopping)
                return
            for data in frames:
                try:
                    reply: Reply = loads(data)
                except Exception:  # noqa: BLE001 - not one of the engine's replies: the others are read on
                    log.exception("an unreadable reply was dropped")
                    continue
                future = self._pending.pop(reply.id, None)
                if future is not None and not future.done():
                    future.set_result(reply)

    async def _read_status(self) -> None:
        while True:
            status: EngineStatus = loads(await self._status.recv())
            previous = self.status
            if previous is not None and previous.incarnation != status.incarnation and self.alive:
                self.losses += 1  # a restart nobody had noticed yet
                self.engine_lost("the engine restarted; the call was lost with it")
            self.status = status
            self.last_status_at = time.monotonic()
            if self.on_status:
                self.on_status(status)
            if status.ready or status.load_error:
                self._settled.set()

    async def _watch(self) -> None:
        """The engine's process exited, or it sent no status for heartbeat_timeout_s (stuck): fail what
        waits on it."""
        while True:
            await asyncio.sleep(min(WATCH_INTERVAL_S, self.heartbeat_timeout_s / 4))
            if self.status is not None and self.last_status_at and not process_exists(self.status.pid):
                log.error("the engine process (pid %d) exited", self.status.pid)
                self.engine_lost(f"the engine process (pid {self.status.pid}) exited", down=True)
            # only a serving engine's silence means it is stuck: a starting one's statuses come from a thread of
            # their own (startup_status.py) while it loads (minutes for a large model), which a slow disk or a
            # busy CPU may hold up as well, and it is never killed for silence
            if self.status is not None and self.status.ready and not self.alive and self.last_status_at:
                # counted once: its supervisor now kills it, and that exit is the same loss
                log.error("no status from the engine for %.1fs", time.monotonic() - self.last_status_at)
                self.engine_lost("the engine stopped answering", down=True)
