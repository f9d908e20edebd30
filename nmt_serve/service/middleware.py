"""Pure ASGI middleware (no BaseHTTPMiddleware: it breaks disconnect detection): metrics and body size."""
from __future__ import annotations

import time
from collections.abc import Callable

from starlette.exceptions import HTTPException

from nmt_serve.service.metrics import Metrics


class MetricsMiddleware:
    """Counts requests by route and status, times them, and tracks requests in flight."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what an exception that escapes the app becomes
        started = time.perf_counter()

        async def send_and_record(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or ("/ui" if scope["path"].startswith("/ui") else "unmatched")
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - started)


class BodySizeLimit:
    """413 for bodies over max_bytes, whether announced by Content-Length or streamed in chunks."""

    def __init__(self, app, max_bytes: int, plain_errors: Callable[[str], bool] = lambda path: False,
                 path_limits: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        # LibreTranslate's routes answer {"error": "message"}, which its clients read
        self.plain_errors = plain_errors
        self.path_limits = path_limits or {}  # paths that take larger bodies (file uploads)

    def too_large(self, limit: int) -> HTTPException:
        return HTTPException(413, f"request body larger than the limit of {limit} bytes")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.path_limits.get(scope.get("path"), self.max_bytes)
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return await self.reject(scope, send, limit)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise self.too_large(limit)  # FastAPI passes HTTPException through to the handlers
            return message

        await self.app(scope, limited_receive, send)

    async def reject(self, scope, send, limit: int) -> None:
        import json

        from nmt_serve.service.errors import error_body, http_error_type

        message = str(self.too_large(limit).detail)
        plain = self.plain_errors(scope.get("path", ""))
        body = json.dumps({"error": message} if plain else error_body(http_error_type(413), message)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
