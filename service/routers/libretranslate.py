"""LibreTranslate-compatible POST /translate and GET /languages, so its clients work unchanged."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ..errors import APIError, bad_request
from ..models import LANGUAGE_NAMES
from ..schemas import Language, LibreTranslateRequest, LibreTranslateResponse
from ..security import authorize
from ..state import ServiceState, get_state
from .translate import decode_options, translate_texts

router = APIRouter(tags=["LibreTranslate compatible"])


async def read_body(request: Request) -> LibreTranslateRequest:
    """LibreTranslate accepts JSON and form posts alike."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        data = {k: v for k, v in form.items()}
        if len(form.getlist("q")) > 1:
            data["q"] = form.getlist("q")
    else:
        try:
            data = await request.json()
        except ValueError:
            raise APIError(422, "validation_error", "body is not valid JSON") from None
    try:
        return LibreTranslateRequest.model_validate(data)
    except Exception as exc:  # pydantic ValidationError
        errors = getattr(exc, "errors", lambda: [])()
        first = errors[0] if errors else {}
        raise APIError(422, "validation_error", first.get("msg", str(exc)), ".".join(str(p) for p in first.get("loc", ())) or None) from None


@router.post(
    "/translate", response_model=LibreTranslateResponse, response_model_exclude_none=True,
    openapi_extra={"requestBody": {"content": {"application/json": {
        "schema": LibreTranslateRequest.model_json_schema(),
        "example": {"q": "Ein Hund rennt.", "source": "de", "target": "en", "format": "text", "alternatives": 2},
    }}}},
)
async def translate(request: Request, state: ServiceState = Depends(get_state)) -> LibreTranslateResponse:
    body = await read_body(request)
    authorize(state, request, body.api_key)
    if body.source == "auto":
        raise bad_request("source 'auto' (language detection) is not supported; name the source language", "source")
    if body.format == "html":
        raise bad_request("format 'html' is not supported; send plain text", "format")
    texts = [body.q] if isinstance(body.q, str) else body.q
    n = body.alternatives + 1
    options = decode_options(state, max(4, n), n, None)
    _, _, results = await translate_texts(state, request, body.source, body.target, texts, options, "q")
    best = [nbest[0].text for nbest in results]
    alternatives = [[h.text for h in nbest[1:]] for nbest in results]
    if isinstance(body.q, str):
        return LibreTranslateResponse(translatedText=best[0], alternatives=alternatives[0] if body.alternatives else None)
    return LibreTranslateResponse(translatedText=best, alternatives=alternatives if body.alternatives else None)


@router.get(
    "/languages", response_model=list[Language],
    responses={200: {"content": {"application/json": {"example": [
        {"code": "de", "name": "German", "targets": ["en"]}, {"code": "en", "name": "English", "targets": ["de"]},
    ]}}}},
)
async def languages(state: ServiceState = Depends(get_state)) -> list[Language]:
    targets: dict[str, list[str]] = {}
    for m in state.models.values():
        targets.setdefault(m.source, []).append(m.target)
    return [Language(code=c, name=LANGUAGE_NAMES.get(c, c), targets=sorted(t)) for c, t in sorted(targets.items())]
