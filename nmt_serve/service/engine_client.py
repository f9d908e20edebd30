"""The API process's one way to the model: the client of the engine processes.

EngineClient is what the routers use: translate and attention calls, and the engines' failures turned
into the service's errors (one shape, errors.py). Under it, an EnginePool (engine_pool.py) picks the engine
of each call, and an EngineConnection (engine_connection.py) talks ZeroMQ to one engine.
"""
from __future__ import annotations

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
from nmt_serve.service.engine_pool import EnginePool
from nmt_serve.service.errors import APIError, bad_request, overloaded, timed_out

log = logging.getLogger("nmt_serve.service.engine_calls")


class EngineClient:
    """Calls to the engines with the request's deadline; every failure comes back as an APIError."""

    def __init__(self, engines: EnginePool, on_resend: Callable[[], None] | None = None):
        """on_resend: told of every call sent again to another engine (a metric)."""
        self.engines = engines
        self.on_resend = on_resend

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
        reply = await self._call(lambda connection: Translate(connection.new_id(), model_id, sources, options, deadline,
                                                              target_prefix or [], priority=priority, terms=terms, avoid=list(avoid)),
                                 model_id, work=sum(map(len, sources)) + len(sources))
        return self._value(reply, timeout)

    async def attention(self, model_id: str, timeout: float, **fields) -> dict:
        deadline = time.monotonic() + timeout
        reply = await self._call(lambda connection: Attention(connection.new_id(), model_id, deadline=deadline, **fields), model_id)
        return self._value(reply, timeout)

    async def _call(self, make: Callable[[EngineConnection], Any], model_id: str, work: float = 1.0) -> Reply:
        """The call made by `make` for the engine it goes to, sent to the least busy ready engine; if that engine
        is lost with it, sent once more, to another ready engine, with its deadline unchanged. Only once: were the
        call what killed the engine (a sentence that faults the device), it would take down every engine in turn."""
        tried: EngineConnection | None = None
        while True:
            connection = None
            try:
                connection = self.engines.pick(avoid=tried, model_id=model_id)
                return await connection.call(make(connection), work)
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
