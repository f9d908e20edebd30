"""The service's facade to the model: translate and attention calls to the engine process, with its
failures turned into the service's errors (one shape, see errors.py)."""
from __future__ import annotations

import math
import time

from nmt_serve.engine.protocol import (
    EXPIRED, INVALID, OUT_OF_MEMORY, REFUSED, SHUTTING_DOWN, Attention, DecodeOptions, Hypothesis, Reply, Translate,
)

from nmt_serve.service.engine_client import EngineClient, EngineUnavailable
from nmt_serve.service.errors import APIError, bad_request, overloaded, timed_out


class Engine:
    def __init__(self, client: EngineClient):
        self.client = client

    @property
    def ready(self) -> bool:
        return self.client.ready

    def backlog_seconds(self) -> float:
        """How long the work the engine had admitted at its last status (at most a status interval
        old) takes at its measured rate; 0 when not known."""
        stats = self.client.status.stats if self.client.status is not None else {}
        rate = stats.get("rate_units_per_second", 0.0)
        return stats.get("pending_units", 0.0) / rate if rate > 0 else 0.0

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

    async def translate(self, model_id: str, sources: list[list[int]], options: DecodeOptions, timeout: float) -> list[list[Hypothesis]]:
        """Per text (its source ids, eos excluded), its n-best translations (best first)."""
        call = Translate(self.client.new_id(), model_id, sources, options, time.monotonic() + timeout)
        return self._value(await self._call(call), timeout)

    async def attention(self, model_id: str, timeout: float, **fields) -> dict:
        call = Attention(self.client.new_id(), model_id, deadline=time.monotonic() + timeout, **fields)
        return self._value(await self._call(call), timeout)

    async def _call(self, message) -> Reply:
        try:
            return await self.client.call(message)
        except EngineUnavailable as exc:
            raise APIError(503, "engine_unavailable", f"{exc}; retry shortly", None, {"Retry-After": "1"}) from None

    @staticmethod
    def _value(reply: Reply, timeout: float):
        if reply.error is None:
            return reply.value
        if reply.error == REFUSED:
            raise overloaded(max(1, math.ceil(reply.retry_after or 1)), reply.message)
        if reply.error == EXPIRED:
            raise timed_out(timeout)
        if reply.error == INVALID:
            raise bad_request(reply.message, "text")
        if reply.error == OUT_OF_MEMORY:
            raise APIError(503, "out_of_memory", "the model ran out of memory on this batch; retry with fewer or shorter texts",
                           None, {"Retry-After": "1"})
        if reply.error == SHUTTING_DOWN:
            raise APIError(503, "shutting_down", "the server is shutting down; retry on another replica", None, {"Retry-After": "1"})
        raise APIError(500, "internal_error", "the server failed to process this request")
