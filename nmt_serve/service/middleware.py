"""Pure ASGI middleware (no BaseHTTPMiddleware: it breaks disconnect detection): metrics (and the API key
kept out of the access log), and what holds a request's body: its size, how slowly it may come, and that
no body is read for a /v1 request that its key or the rate limit refuses."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from fastapi import Request
from starlette.exceptions import HTTPException

from nmt_serve.service.dependencies import authorize
from nmt_serve.service.errors import APIError, error_body, http_error_type, printable
from nmt_serve.service.metrics import Metrics
from nmt_serve.service.security import redacted_query



def hide_key(scope) -> None:
    """Redact LibreTranslate's api_key in the query string: uvicorn's access log writes the path and query
    string of each request when it sends the response's start, from this very scope."""
    query = scope.get("query_string")
    if query:
        scope["query_string"] = redacted_query(query)


class MetricsMiddleware:
    """Counts requests by route and status, times them, and tracks requests in flight."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics
        # (endpoint, status) -> its counter and histogram children: labels() takes a lock and checks its
        # arguments on every call (the routes and statuses are few)
        self._children: dict[tuple[str, int], tuple] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what an exception that escapes the app becomes
        started = time.perf_counter()

        async def send_and_record(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                hide_key(scope)  # the handler has read its parameters by now
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            hide_key(scope)  # an exception's 500 is sent (and logged) outside of this middleware
            self.metrics.in_flight.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or ("/ui" if scope["path"].startswith("/ui") else "unmatched")
            children = self._children.get((endpoint, status))
            if children is None:
                children = self._children[(endpoint, status)] = (
                    self.metrics.requests.labels(endpoint=endpoint, status=str(status)), self.metrics.latency.labels(endpoint=endpoint))
            children[0].inc()
            children[1].observe(time.perf_counter() - started)


async def within(awaitable, seconds: float):
    if hasattr(asyncio, "timeout"):  # Python 3.11: no task of its own per call
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def keyed_path(path: str) -> bool:
    """Paths whose every route needs the Authorization header's key (routers v1 and jobs)."""
    return path == "/v1" or path.startswith("/v1/")


class BodySizeLimit:
    """413 for bodies over max_bytes, whether announced by Content-Length or streamed in chunks; 408 for a
    body that comes too slowly (its first bytes and each next ones within body_timeout_s, and past that at
    an average of body_min_rate bytes/s: uvicorn has no timeout on a body); and the access check of every /v1
    request (its key where API keys are set, the rate limit where one is set) before any of its body is read
    (FastAPI reads and parses a body before it runs a route's dependencies: up to max_job_bytes of JSON,
    seconds of CPU, from anyone). A refusal
    that leaves a body of no announced length unread closes the connection, so that the client cannot go
    on sending it."""

    def __init__(self, app, max_bytes: int, body_timeout_s: float, body_min_rate: float,
                 plain_errors: Callable[[str], bool] = lambda path: False, path_limits: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        # LibreTranslate's routes answer {"error": "message"}, which its clients read
        self.plain_errors = plain_errors
        self.path_limits = path_limits or {}  # paths that take larger bodies (file uploads)
        self.body_timeout_s = body_timeout_s
        self.body_min_rate = body_min_rate

    def too_large(self, limit: int) -> HTTPException:
        return HTTPException(413, f"request body larger than the limit of {limit} bytes")

    def too_slow(self, timeout: float, rate: float) -> HTTPException:
        return HTTPException(408, f"the request body came too slowly: it must start within {timeout:g} s, pause no "
                                  f"longer than that, and average at least {rate:g} bytes/s after it")

    def refusal(self, scope) -> APIError | None:
        """For a /v1 request, the access check (dependencies.authorize): 401 without a valid key where keys
        are set (429 for too many of them), 429 past the rate limit where one is set. Here rather than a
        dependency of the routers: a refusal costs no body, and FastAPI's solving of a dependency was ~4%
        of a one-sentence request's CPU."""
        if not keyed_path(scope.get("path", "")):
            return None
        state = getattr(getattr(scope.get("app"), "state", None), "service", None)
        if state is None or not (state.keys.enabled or state.rate_limiter.per_minute):
            return None
        try:
            authorize(state, Request(scope))
        except APIError as exc:
            return exc
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.path_limits.get(scope.get("path"), self.max_bytes)
        length, chunked = None, False
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit():
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = True
        if length is not None and length > limit:
            return await self.reject(scope, send, limit)
        body_follows = chunked or bool(length)
        if refused := self.refusal(scope):
            # a body of a Content-Length (within the limit) uvicorn reads past and drops, and the client reads the
            # answer; a chunked one has no end it must come to: the connection closes
            return await self.respond(scope, send, refused.status, refused.type, refused.message, refused.headers, close=chunked)

        timeout, rate = self.body_timeout_s, self.body_min_rate
        loop = asyncio.get_running_loop()
        received, done, started, close = 0, not body_follows, None, False

        async def limited_receive():
            nonlocal received, done, started, close
            if done:  # the body is in: what follows is http.disconnect, awaited as long as the request runs
                return await receive()
            now = loop.time()
            started = now if started is None else started
            wait = min(timeout, started + timeout + received / rate - now)
            try:
                if wait <= 0:
                    raise TimeoutError
                message = await within(receive(), wait)
            except (TimeoutError, asyncio.TimeoutError):
                close = True
                raise self.too_slow(timeout, rate) from None
            if message["type"] != "http.request":
                done = True
                return message
            received += len(message.get("body", b""))
            done = not message.get("more_body", False)
            if received > limit:
                close = True
                raise self.too_large(limit)  # FastAPI passes HTTPException through to the handlers
            return message

        async def send_closing(message):
            if close and message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"connection" for name, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, limited_receive, send_closing)

    async def reject(self, scope, send, limit: int) -> None:
        await self.respond(scope, send, 413, http_error_type(413), str(self.too_large(limit).detail), close=True)

    async def respond(self, scope, send, status: int, type_: str, message: str, headers: dict | None = None,
                      close: bool = False) -> None:
        """An error sent before the app runs, in the shape its path takes."""
        plain = self.plain_errors(scope.get("path", ""))
        body = json.dumps({"error": printable(message)} if plain else error_body(type_, message)).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        raw += [(name.lower().encode("latin-1"), str(value).encode("latin-1")) for name, value in (headers or {}).items()]
        if close:
            raw.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})
