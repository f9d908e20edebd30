"""What the routers ask FastAPI for: the service's state, and the access checks on it."""
from __future__ import annotations

import hashlib
import os

from fastapi import Depends, Request

from nmt_serve.service.errors import APIError
from nmt_serve.service.security import RateLimiter, bearer_token, client_id, same_secret, unauthorized
from nmt_serve.service.state import ServiceState

RATE_LIMIT_FILE = "rate-limits"  # in the directory the API workers share (the engine's sockets)


async def get_state(request: Request) -> ServiceState:
    # async: FastAPI runs a plain def dependency on its thread pool, two thread hops per request
    return request.app.state.service


def rate_limiter(state: ServiceState) -> RateLimiter:
    """The state's limiter; with several API workers (their parent's engine directory set) one table that
    all of them share, so that `rate_limit_per_minute` is the limit of the server, not of each worker."""
    limiter = state.rate_limiter
    directory = next(iter(state.settings.engine_dirs), "")
    if limiter.per_minute and directory and limiter.path is None:
        limiter = state.rate_limiter = RateLimiter(limiter.per_minute, os.path.join(directory, RATE_LIMIT_FILE))
    return limiter


def check_key(state: ServiceState, request: Request, key: str | None) -> None:
    """401 for a missing or wrong key (when keys are set). A wrong key is charged to the client's address
    under the rate limit: past it, guesses get 429 instead of being answered as fast as they come."""
    if not state.keys.enabled or state.keys.valid(key):
        return
    try:
        rate_limiter(state).check(client_id(request, None))
    except APIError as exc:
        raise APIError(429, "rate_limited", f"too many requests without a valid API key: {exc.message}", None, exc.headers) from None
    raise unauthorized()


def authorize(state: ServiceState, request: Request, body_key: str | None = None) -> None:
    """Check the API key (LibreTranslate's api_key field, else the Authorization header: a proxy's header
    does not override a LibreTranslate client's key) and the rate limit."""
    key = body_key or bearer_token(request)
    check_key(state, request, key)
    limiter = rate_limiter(state)
    if limiter.per_minute:  # (the client's id, an address parsed, only where a limit counts it)
        limiter.check(client_id(request, key if state.keys.enabled else None))


def job_owner(state: ServiceState, request: Request, body_key: str | None = None) -> str:
    """Who owns the jobs a request makes and may read, list and delete: a digest of its API key (the key
    itself is never written to disk); "" on a server without keys, where every client is the same one."""
    if not state.keys.enabled:
        return ""
    key = body_key or bearer_token(request) or ""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def seen_owner(state: ServiceState, request: Request) -> str | None:
    """Whose jobs and glossaries a request sees: its key's (job_owner), or everyone's (None) on a server
    without keys."""
    return job_owner(state, request) if state.keys.enabled else None


async def require_metrics_token(request: Request, state: ServiceState = Depends(get_state)) -> None:
    token = state.settings.metrics_token
    if token and not same_secret(bearer_token(request), token):
        raise unauthorized("/metrics needs 'Authorization: Bearer <metrics token>'")
