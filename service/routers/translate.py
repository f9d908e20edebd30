"""POST /v1/translate and POST /v1/attention, GET /v1/models."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from engine.protocol import DecodeOptions

from ..errors import APIError, bad_request, timed_out
from ..schemas import (
    AttentionRequest, AttentionResponse, Hypothesis, ModelInfo, ModelList, TranslateRequest, TranslateResponse,
    Translation, Usage,
)
from ..security import require_api_key
from ..state import ServiceState, get_state

router = APIRouter(prefix="/v1", tags=["translation"], dependencies=[Depends(require_api_key)])
DEADLINE_HEADER = "x-request-timeout"


def decode_options(state: ServiceState, beam_size: int, num_hypotheses: int, max_length: int | None,
                   length_penalty: float = 1.0, return_scores: bool = False) -> DecodeOptions:
    s = state.settings
    if beam_size > s.max_beam_size:
        raise APIError(422, "validation_error", f"beam_size must be at most {s.max_beam_size}", "beam_size")
    if num_hypotheses > beam_size:
        raise APIError(422, "validation_error", "num_hypotheses must be at most beam_size", "num_hypotheses")
    if max_length is not None and max_length > s.max_output_length:
        raise APIError(422, "validation_error", f"max_length must be at most {s.max_output_length}", "max_length")
    return DecodeOptions(beam_size, num_hypotheses, max_length, length_penalty, return_scores)


def request_timeout(state: ServiceState, request: Request) -> float:
    """The request's deadline in seconds: the setting, or less when the X-Request-Timeout header asks."""
    limit = state.settings.request_timeout_s
    header = request.headers.get(DEADLINE_HEADER)
    if header is None:
        return limit
    try:
        asked = float(header)
    except ValueError:
        asked = float("nan")
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
    """Await the work, but give up at the deadline (504) or when the client goes away; either way the
    work is cancelled, and the engine drops the request's sentences (queued or running)."""
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work in done:
        return work.result()
    work.cancel()
    reason = "disconnect" if watcher in done else "timeout"
    state.metrics.dropped.labels(reason=reason).inc()
    raise timed_out(timeout) if reason == "timeout" else APIError(499, "client_closed_request", "the client went away")


async def translate_texts(state: ServiceState, request: Request, source: str, target: str, texts: list[str], options: DecodeOptions, param: str):
    """Shared by /v1/translate and the LibreTranslate route: validate, send to the engine, await with a
    deadline. Returns the model, the source token counts and per text its n-best (best first)."""
    engine = state.require_ready()
    model = state.model_for(source, target)
    timeout = request_timeout(state, request)
    if state.settings.admission and (refusal := engine.refusal(timeout, state.settings.admission_margin)):
        state.metrics.refused_early.inc()
        raise refusal
    sources = state.check_texts(model, texts, param)
    results = await with_deadline(state, request, timeout, engine.translate(model.id, sources, options, timeout))
    return model, [len(ids) for ids in sources], results


@router.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True)
async def translate(body: TranslateRequest, request: Request, state: ServiceState = Depends(get_state)) -> TranslateResponse:
    texts = [body.text] if isinstance(body.text, str) else body.text
    options = decode_options(state, body.beam_size, body.num_hypotheses, body.max_length, body.length_penalty, body.return_scores)
    model, counts, results = await translate_texts(state, request, body.source, body.target, texts, options, "text")
    translations = []
    for nbest in results:
        best = nbest[0]
        translations.append(Translation(
            text=best.text, score=best.score, normalized_score=best.normalized_score,
            hypotheses=[Hypothesis(text=h.text, score=h.score) for h in nbest] if body.num_hypotheses > 1 else None,
        ))
    usage = Usage(source_tokens=sum(counts), generated_tokens=sum(nbest[0].tokens for nbest in results))
    return TranslateResponse(model=model.id, translations=translations, usage=usage)


def _indices(requested: list[int] | None, count: int, name: str) -> list[int]:
    if requested is None:
        return list(range(count))
    bad = [i for i in requested if not 0 <= i < count]
    if bad or not requested:
        raise bad_request(f"{name} must be a non-empty list of indices in 0..{count - 1}", name)
    return requested


@router.post("/attention", response_model=AttentionResponse, response_model_exclude_none=True)
async def attention(body: AttentionRequest, request: Request, state: ServiceState = Depends(get_state)) -> AttentionResponse:
    engine = state.require_ready()
    model = state.model_for(body.source, body.target)
    state.check_texts(model, [body.text])
    if body.target_text is not None:
        state.check_texts(model, [body.target_text], "target_text")
    info = model.info
    decode_options(state, body.beam_size, 1, None)
    layers = _indices(body.layers, info["n_decoder_layers"], "layers")
    heads = _indices(body.heads, info["n_heads"], "heads")
    encoder_layers = _indices(body.layers, info["n_encoder_layers"], "layers") if "encoder_self" in body.include else []
    timeout = request_timeout(state, request)
    maps = await with_deadline(state, request, timeout, engine.attention(
        model.id, timeout, text=body.text, target_text=body.target_text, beam_size=body.beam_size, include=tuple(body.include),
        layers=layers, heads=heads, encoder_layers=encoder_layers, average_heads=body.average_heads,
    ))
    return AttentionResponse(
        model=model.id, layers=layers, heads=None if body.average_heads else heads,
        num_layers=info["n_decoder_layers"], num_heads=info["n_heads"], **maps,
    )


@router.get(
    "/models", response_model=ModelList,
    responses={200: {"content": {"application/json": {"example": {"models": [
        {"id": "de-en", "source": "de", "target": "en", "parameters": 7583744, "device": "cpu", "dtype": "float32", "quantization": "none",
         "step_mode": "auto", "static_decoder": None, "path": "checkpoints/de-en"},
    ]}}}}},
)
async def models(state: ServiceState = Depends(get_state)) -> ModelList:
    return ModelList(models=[ModelInfo(**{k: m.info.get(k) for k in ModelInfo.model_fields}) for m in state.models.values()])
