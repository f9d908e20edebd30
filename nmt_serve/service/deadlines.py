"""A request's deadline: from the settings or the X-Request-Timeout header, and the wait for its work
that gives up at the deadline (504) or when the client goes away (499), dropping the work either way."""
from __future__ import annotations

import asyncio
import re

from fastapi import Request

from nmt_serve.service.errors import APIError, timed_out
from nmt_serve.service.state import ServiceState

DEADLINE_HEADER = "x-request-timeout"
# Seconds as HTTP headers write numbers: float() alone also takes "1_0", "nan" and "1e400".
SECONDS = re.compile(r"\s*(\d+(\.\d*)?|\.\d+)\s*")


def request_timeout(state: ServiceState, request: Request) -> float:
    """The request's deadline in seconds: the setting, or less when the X-Request-Timeout header asks."""
    limit = state.settings.request_timeout_s
    header = request.headers.get(DEADLINE_HEADER)
    if header is None:
        return limit
    asked = float(header) if SECONDS.fullmatch(header) else float("nan")
    if not 0 < asked < float("inf"):
        raise APIError(422, "validation_error", "X-Request-Timeout must be a positive number of seconds", DEADLINE_HEADER)
    return min(asked, limit)


async def until_disconnected(request: Request) -> None:
    """Returns when the client goes away. The body has been read, so the next ASGI message is
    http.disconnect (the server sends it when the connection closes, or once the response is done);
    awaiting it costs nothing while the request waits, where polling is_disconnected() for every
    waiting request took about a quarter of the API process's CPU under a flood."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def with_deadline(state: ServiceState, request: Request, timeout: float, awaitable):
    """Await the work, but give up at the deadline (504) or when the client goes away (499); either way the
    work is cancelled, and the engine drops the request's sentences (queued or running).

    The work runs in the request's own task, which a timer or the disconnect watcher cancels: a task and
    asyncio.wait() per request for this were ~6% of a one-sentence request's CPU."""
    task = asyncio.current_task()
    reason: str | None = None

    def stop(why: str) -> None:
        nonlocal reason
        if reason is None:  # the first of the deadline and the disconnect, and neither once the work is over
            reason = why
            task.cancel()

    watcher = asyncio.ensure_future(until_disconnected(request))
    watcher.add_done_callback(lambda w: None if w.cancelled() else stop("disconnect"))
    timer = asyncio.get_running_loop().call_later(timeout, stop, "timeout")
    try:
        return await awaitable
    except asyncio.CancelledError:
        if reason is None:
            raise  # cancelled from elsewhere (the server shutting down): not ours to turn into an answer
        if hasattr(task, "uncancel"):  # Python 3.11: the cancel was ours and is handled
            task.uncancel()
    finally:
        if reason is None:
            reason = "over"
        timer.cancel()
        watcher.cancel()
    state.metrics.dropped.labels(reason=reason).inc()
    raise timed_out(timeout) if reason == "timeout" else APIError(499, "client_closed_request", "the client went away")
