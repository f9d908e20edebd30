"""One error shape for every failure: {"error": {"type", "message", "param"}}."""
from __future__ import annotations

import logging
import re
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

log = logging.getLogger("nmt_serve.service.errors")


class APIError(Exception):
    def __init__(self, status: int, type_: str, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.type, self.message, self.param, self.headers = status, type_, message, param, headers


def printable(text: str | None) -> str | None:
    """A message or name as a response can encode it: what a request sent may hold an unpaired surrogate."""
    return text if text is None or text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(type_: str, message: str, param: str | None = None) -> dict:
    return {"error": {"type": type_, "message": printable(message), "param": printable(param)}}


def documented_error(description: str, type_: str, message: str, param: str | None = None) -> dict:
    """A documented error response with its example (docs.py gives it the error schema)."""
    return {"description": description, "content": {"application/json": {
        "example": {"error": {"type": type_, "message": message, "param": param}}}}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, "invalid_request", message, param)


def too_large(message: str, param: str | None = None) -> APIError:
    return APIError(413, "request_too_large", message, param)


def overloaded(retry_after_s: int, message: str = "the server is busy: the queue is full, retry later") -> APIError:
    return APIError(503, "overloaded", message, None, {"Retry-After": str(retry_after_s)})


def not_ready(message: str = "models are still loading") -> APIError:
    return APIError(503, "not_ready", message, None, {"Retry-After": "1"})


def timed_out(seconds: float) -> APIError:
    return APIError(504, "timeout", f"the request did not finish within {seconds:g}s")


# what pydantic puts in an error's location for the branch of a union it tried ("str", "list[str]"), not a field
_UNION_BRANCH = re.compile(r"str|int|float|bool|bytes|constrained-\w+|[a-z-]+\[.*\]")


def http_error_type(status: int) -> str:
    """The error type of a status raised outside the handlers (the body limits, routing's 404 and 405)."""
    return {413: "request_too_large", 408: "request_timeout"}.get(status, "http_error")


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """The methods some route of the app takes at the request's path: each asked of the routes in turn."""
    routes = request.app.router.routes
    return [method for method in METHODS
            if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)]


def install_handlers(app: FastAPI, plain_errors: Callable[[str], bool] = lambda path: False) -> None:
    """plain_errors: the paths whose errors, routing's own included, take LibreTranslate's {"error": message}."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError):
        return JSONResponse(error_body(exc.type, exc.message, exc.param), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its location is a character offset, not a parameter
            where = first.get("loc", ("body", None))[-1]
            detail = (first.get("ctx") or {}).get("error")
            message = "the body is not valid JSON" + (f": {detail}" if detail else "") + (f" (at character {where})" if isinstance(where, int) else "")
            return JSONResponse(error_body("validation_error", message), 422)
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query")
               and not (isinstance(p, str) and _UNION_BRANCH.fullmatch(p))]
        message = first.get("msg", "invalid request")
        return JSONResponse(error_body("validation_error", message, ".".join(loc) or None), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # routing answers with the methods of the first route whose path matched; a path served by
            # several routes (GET and POST /v1/jobs) takes all of theirs
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        if plain_errors(request.url.path):
            return JSONResponse({"error": printable(str(exc.detail))}, exc.status_code, headers=headers)
        return JSONResponse(error_body(http_error_type(exc.status_code), str(exc.detail)), exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        # the details go to the log, not to the client: no stack traces or file paths in error bodies
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return JSONResponse(error_body("internal_error", "the server failed to process this request"), 500)
