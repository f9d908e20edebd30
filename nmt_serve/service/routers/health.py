"""GET /health (liveness), GET /health/ready (readiness), GET /metrics (Prometheus)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nmt_serve.service.dependencies import get_state, require_metrics_token
from nmt_serve.service.errors import error_body
from nmt_serve.service.schemas import Health
from nmt_serve.service.state import ServiceState

router = APIRouter(tags=["operations"])


def example(body) -> dict:
    return {"content": {"application/json": {"example": body}}}


@router.get("/health", response_model=Health, responses={200: example({"status": "ok", "models": ["de-en", "en-de"]})})
async def health(state: ServiceState = Depends(get_state)) -> Response:
    return Response(state.health_body("ok"), media_type="application/json")


@router.get(
    "/health/ready", response_model=Health,
    responses={
        200: example({"status": "ready", "models": ["de-en", "en-de"]}),
        503: {"description": "models not loaded yet (or failed to load)",
              **example({"error": {"type": "not_ready", "message": "models are still loading (loading de-en, model 2 of 12; started 14.2 s ago)",
                                   "param": None}})},
    },
)
async def ready(state: ServiceState = Depends(get_state)):
    if state.ready:
        return Response(state.health_body("ready"), media_type="application/json")
    return JSONResponse(error_body("not_ready", state.unready_reason()), 503, headers={"Retry-After": "1"})


@router.get(
    "/metrics", response_class=Response, dependencies=[Depends(require_metrics_token)],
    responses={200: {"content": {"text/plain": {"example": "nmt_requests_total{endpoint=\"/v1/translate\",status=\"200\"} 42.0"}}}},
)
async def metrics(state: ServiceState = Depends(get_state)) -> Response:
    # off the event loop: a scrape reads every worker's files and every job's record
    return Response(await asyncio.to_thread(generate_latest, state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
