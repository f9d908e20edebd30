"""What the routers ask FastAPI for: the service's state, and the access checks on it."""
from __future__ import annotations

import hmac

from fastapi import Depends, Request

from nmt_serve.service.security import bearer_token, client_id, unauthorized
from nmt_serve.service.state import ServiceState


async def get_state(request: Request) -> ServiceState:
    # async: FastAPI runs a plain def dependency on its thread pool, two thread hops per request
    return request.app.state.service


def authorize(state: ServiceState, request: Request, body_key: str | None = None) -> None:
    """Check the API key (LibreTranslate's api_key field, else the Authorization header: a proxy's header
    does not override a LibreTranslate client's key) and the rate limit."""
    key = body_key or bearer_token(request)
    if state.keys.enabled and not state.keys.valid(key):
        raise unauthorized()
    state.rate_limiter.check(client_id(request, key if state.keys.enabled else None))


async def require_api_key(request: Request, state: ServiceState = Depends(get_state)) -> None:
    authorize(state, request)


async def require_metrics_token(request: Request, state: ServiceState = Depends(get_state)) -> None:
    token = state.settings.metrics_token
    if token and not hmac.compare_digest((bearer_token(request) or "").encode(), token.encode()):
        raise unauthorized("/metrics needs 'Authorization: Bearer <metrics token>'")
