"""The API process's one way to the model: the client of the engine processes.

EngineClient is what the routers use: translate and attention calls, and the engines' failures turned
into the service's errors (one shape, errors.py). Under it, an EnginePool (engine_pool.py) picks the engine
of each call, and an EngineConnection (engine_connection.py) talks ZeroMQ to one engine.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Callable

from nmt_serve.engine.protocol import (
    EXPIRED,
    INTERACTIVE,
    INVALID,
    OUT_OF_MEMORY,
    REFUSED,
    SHUTTING_DOWN,
    Attention,
    DecodeOptions,
    EngineHypothesis,
    Reply,
    Translate,
)
from nmt_serve.service.engine_connection import EngineConnection, EngineUnavailable
from nmt_serve.service.engine_pool import EnginePool, affinity_key
from nmt_serve.service.errors import APIError, bad_request, overloaded, timed_out

log = logging.getLogger("nmt_serve.service.engine_calls")
# a call of at least twice this many sentences is split between the ready engines that serve its model, at least
# this many sentences a part: one request of many sentences (an evaluation script's batch, a job's chunk) runs on
# all of them, where one engine would hold it all while the others wait
SPLIT_MIN_SENTENCES = 4


def balanced_bounds(work: list[int], parts: int) -> list[tuple[int, int]]:
    """[start, stop) of `parts` consecutive runs of the items, none empty, each near an equal share of the work."""
    total, bounds, start, done = sum(work), [], 0, 0
    for k in range(1, parts):
        stop, target = start + 1, total * k / parts
        done += work[start]
        while stop < len(work) - (parts - k) and done + work[stop] / 2 < target:
            done += work[stop]
            stop += 1
        bounds.append((start, stop))
        start = stop
    return bounds + [(start, len(work))]


async def first_failure_cancels(parts: list) -> list:
    """The parts' results, concatenated in order; the first to fail cancels the others (their engines drop their
    work) and its error is raised."""
    tasks = [asyncio.ensure_future(part) for part in parts]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # a part failed, or this call was cancelled (its deadline, its client gone)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    return [item for task in tasks for item in task.result()]


class EngineClient:
    """Calls to the engines with the request's deadline; every failure comes back as an APIError."""

    def __init__(self, engines: EnginePool, on_resend: Callable[[], None] | None = None, *, engines_cache: bool = False):
        """on_resend: told of every call sent again to another engine (a metric); engines_cache: the engines keep the
        translation cache (several API workers), so a call goes to its content's own engine (EnginePool.pick), where
        a repeat finds it."""
        self.engines = engines
        self.on_resend = on_resend
        self._several = len(engines) > 1  # calls may move from a stalled engine to another
        self._affinity = engines_cache and self._several

    @property
    def ready(self) -> bool:
        return self.engines.ready

    def backlog_seconds(self) -> float:
        """How long the work the least busy ready engine had admitted at its last status (at most a status
        interval old) takes at its measured rate; 0 when not known."""
        backlogs = []
        for status in self.engines.ready_statuses():
            rate = status.stats.get("rate_units_per_second", 0.0)
            backlogs.append(status.stats.get("pending_units", 0.0) / rate if rate > 0 else 0.0)
        return min(backlogs, default=0.0)

    def refusal(self, timeout: float, margin: float) -> APIError | None:
        """The 503 the engine's admission would give any request with this deadline, known here
        without tokenizing it or a round trip: the work already admitted does not finish within
        `margin` of it. Under a flood most refusals are made here, for a fraction of the CPU (and
        the engine's I/O thread decides the rest, exactly)."""
        backlog = self.backlog_seconds()
        if backlog > margin * timeout:
            return overloaded(max(1, math.ceil(backlog)), "the server is busy: the work queued ahead would not finish before "
                                                          "this request's deadline, retry later")
        return None

    async def translate(self, model_id: str, sources: list[list[int]], options: DecodeOptions, timeout: float,
                        target_prefix: list[int] | None = None, priority: int = INTERACTIVE, *,
                        terms: list[list[str]] | None = None, avoid: tuple[str, ...] = ()) -> list[list[EngineHypothesis]]:
        """Per text (its source ids, eos excluded), its n-best translations (best first); priority
        BACKGROUND for a job's chunk (it yields to interactive calls in the engine); terms: per text the
        target terms it must contain, avoid: terms none may (protocol.Translate)."""
        deadline = time.monotonic() + timeout
        parts = min(self.engines.serving(model_id), len(sources) // SPLIT_MIN_SENTENCES) if len(self.engines) > 1 else 1
        if parts > 1:  # side by side on several engines, as one engine's lanes would take them (CPU)
            bounds = balanced_bounds([len(s) + 1 for s in sources], parts)
            return await first_failure_cancels([
                self._translate(model_id, sources[a:b], options, deadline, timeout, target_prefix, priority,
                                terms[a:b] if terms is not None else None, avoid) for a, b in bounds])
        return await self._translate(model_id, sources, options, deadline, timeout, target_prefix, priority, terms, avoid)

    async def _translate(self, model_id: str, sources: list[list[int]], options: DecodeOptions, deadline: float, timeout: float,
                         target_prefix: list[int] | None, priority: int, terms: list[list[str]] | None,
                         avoid: tuple[str, ...]) -> list[list[EngineHypothesis]]:
        reply = await self._call(lambda connection: Translate(connection.new_id(), model_id, sources, options, deadline,
                                                              target_prefix or [], priority=priority, terms=terms, avoid=list(avoid)),
                                 model_id, work=sum(map(len, sources)) + len(sources),
                                 key=affinity_key(sources) if self._affinity else None)
        return self._value(reply, timeout)

    async def attention(self, model_id: str, timeout: float, **fields) -> dict:
        deadline = time.monotonic() + timeout
        reply = await self._call(lambda connection: Attention(connection.new_id(), model_id, deadline=deadline, **fields), model_id)
        return self._value(reply, timeout)

    async def _call(self, make: Callable[[EngineConnection], Any], model_id: str, work: float = 1.0, key: int | None = None) -> Reply:
        """The call made by `make` for the engine it goes to, sent to the least busy ready engine; if that engine
        is lost with it, or stalls (EnginePool.move_stalled), sent once more, to another ready engine, with its deadline
        unchanged. Only once: were the call what killed the engine (a sentence that faults the device), it would take
        down every engine in turn."""
        tried: EngineConnection | None = None
        while True:
            connection = None
            try:
                connection = self.engines.pick(avoid=tried, model_id=model_id, key=key)
                return await connection.call(make(connection), work, movable=tried is None and self._several)
            except EngineUnavailable as exc:
                if tried is not None or len(self.engines) == 1 or not self.engines.ready or connection is None:
                    raise APIError(503, "engine_unavailable", f"{exc}; retry shortly", None, {"Retry-After": "1"}) from None
                # the loss itself is logged once, by whoever noticed it; its calls are counted, not logged one by one
                log.debug("an engine was lost with a call (%s); sending it to another", exc)
                if self.on_resend is not None:
                    self.on_resend()
                tried = connection

    @staticmethod
    def _value(reply: Reply, timeout: float):
        if reply.error is None:
            return reply.value
        if reply.error == REFUSED:
            raise overloaded(max(1, math.ceil(reply.retry_after or 1)), reply.message)
        if reply.error == EXPIRED:
            raise timed_out(timeout)
        if reply.error == INVALID:
            raise bad_request(reply.message, reply.param or "text")
        if reply.error == OUT_OF_MEMORY:
            raise APIError(503, "out_of_memory", "the model ran out of memory on this batch; retry with fewer or shorter texts",
                           None, {"Retry-After": "1"})
        if reply.error == SHUTTING_DOWN:
            raise APIError(503, "shutting_down", "the server is shutting down; retry on another replica", None, {"Retry-After": "1"})
        raise APIError(500, "internal_error", "the server failed to process this request")
