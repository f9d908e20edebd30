"""POST /v1/translate and POST /v1/attention, GET /v1/models."""
from __future__ import annotations

from fastapi import APIRouter, Depends, File, Form, Query, Request, Response, UploadFile
from pydantic import BaseModel

from nmt_serve.service.deadlines import request_timeout, with_deadline
from nmt_serve.service.dependencies import get_state, seen_owner
from nmt_serve.service.errors import bad_request
from nmt_serve.service.file_store import FILE_CONTENT
from nmt_serve.service.file_translation import (
    FORMATS,
    attachment_headers,
    media_type,
    translated_name,
)
from nmt_serve.service.file_translation import translate_file as translate_whole_file
from nmt_serve.service.model_listing import narrowed, whole_listing
from nmt_serve.service.pipeline import stored_glossary, terminology, translate_texts
from nmt_serve.service.schemas import (
    AttentionRequest,
    AttentionResponse,
    ModelList,
    TranslateRequest,
    TranslateResponse,
    Translation,
    Usage,
)
from nmt_serve.service.state import ServiceState

router = APIRouter(prefix="/v1", tags=["translation"])  # access checked before: middleware.BodySizeLimit


def json_response(model: BaseModel) -> Response:
    """A response model as JSON, serialized once: returned as it is, FastAPI would first validate it against
    the route's response_model (which still documents it) and then serialize it, at a few percent of the API
    process's CPU for a one-sentence request."""
    return Response(model.model_dump_json(exclude_none=True), media_type="application/json")


@router.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True)
async def translate(body: TranslateRequest, request: Request) -> Response:
    state: ServiceState = request.app.state.service  # not Depends(get_state): its solving is ~2% of a request's CPU
    texts = [body.text] if isinstance(body.text, str) else body.text
    options = state.limits.decode_options(body.beam_size, body.num_hypotheses, body.max_length, body.length_penalty, body.return_scores)
    stored = await stored_glossary(state, body.glossary_id, seen_owner(state, request), body.source, body.target)
    results = await translate_texts(state, request, source=body.source, target=body.target, texts=texts, options=options,
                                    param="text", format=body.format, split_sentences=body.split_sentences,
                                    terminology=terminology(body.glossary, body.avoid, stored), attention_check=True)
    translations = [Translation.of(r, body.num_hypotheses) for r in results]
    usage = Usage(source_tokens=sum(r.source_tokens for r in results), generated_tokens=sum(r.generated_tokens for r in results),
                  sentences=sum(r.sentences for r in results))
    response = TranslateResponse(model=",".join(dict.fromkeys(r.model for r in results if r.model)), translations=translations, usage=usage)
    return json_response(response)


@router.post(
    "/translate_file", response_class=Response,
    responses={200: {"description": "the translated file, as an attachment named <name>_<target>.<extension>",
                     "content": FILE_CONTENT},
               400: {"description": "a format not in " + ", ".join(FORMATS) + ", or a file that cannot be read as its "
                                    "extension says (corrupt, encrypted, another format)",
                     "content": {"application/json": {"example": {"error": {
                         "type": "invalid_request", "param": "file",
                         "message": "the file cannot be read as .docx: it is damaged or another format (BadZipFile)"}}}}},
               413: {"description": "larger than max_file_bytes, or more text than max_document_chars",
                     "content": {"application/json": {"example": {"error": {
                         "type": "request_too_large", "param": "file",
                         "message": "the document has 120000 characters of text; the limit is 100000 (max_document_chars)"}}}}}},
)
async def translate_file(request: Request, file: UploadFile = File(description=f"the document: {', '.join(FORMATS)}"),
                         source: str = Form(min_length=1, description='source language code, or "auto"'),
                         target: str = Form(min_length=1),
                         glossary_id: str = Form("", pattern="^([0-9a-f]{32})?$", description="a stored glossary "
                                                        "(POST /v1/glossaries) for the file's direction"),
                         state: ServiceState = Depends(get_state)) -> Response:
    """A whole file translated in place: paragraphs, runs' formatting, tables, headers, footers, notes
    and comments kept (see README: Documents)."""
    name = (file.filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    try:
        data = await file.read()
    finally:
        await file.close()
    stored = await stored_glossary(state, glossary_id, seen_owner(state, request), source, target)
    translated = await translate_whole_file(state, request, name=name, data=data, source=source, target=target,
                                            terminology=terminology(None, None, stored))
    out = translated_name(name, target)
    return Response(translated, media_type=media_type(out), headers=attachment_headers(out))


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
    [source] = state.limits.encode(model.encode, [body.text])
    if body.target_text is not None:
        state.limits.encode(model.encode, [body.target_text], "target_text")
    info = model.info
    state.limits.decode_options(body.beam_size, 1, None)
    layers = _indices(body.layers, info["n_decoder_layers"], "layers")
    heads = _indices(body.heads, info["n_heads"], "heads")
    encoder_layers = _indices(body.layers, info["n_encoder_layers"], "layers") if "encoder_self" in body.include else []
    timeout = request_timeout(state, request)
    maps = await with_deadline(state, request, timeout, engine.attention(
        model.engine_model, timeout, source=source, target_text=body.target_text, target_prefix=model.target_prefix,
        beam_size=body.beam_size, include=tuple(body.include),
        layers=layers, heads=heads, encoder_layers=encoder_layers, average_heads=body.average_heads,
    ))
    return AttentionResponse(
        model=model.engine_model, layers=layers, heads=None if body.average_heads else heads,
        num_layers=info["n_decoder_layers"], num_heads=info["n_heads"], **maps,
    )


@router.get(
    "/models", response_model=ModelList,
    responses={200: {"content": {"application/json": {"example": {"models": [
        {"id": "de-en", "source": "de", "target": "en", "model": "de-en", "multilingual": False, "parameters": 7583744,
         "device": "cpu", "dtype": "float32", "quantization": "none",
         "step_mode": "auto", "static_decoder": None, "path": "checkpoints/de-en"},
    ]}}}}},
)
async def models(request: Request, source: str | None = Query(None, description="only the directions from this language"),
                 target: str | None = Query(None, description="only the directions into this language"),
                 model: str | None = Query(None, description="only the directions this model serves (a pivot direction: "
                                                             "either of its two)")) -> Response:
    state: ServiceState = request.app.state.service
    if source or target or model:
        return Response(narrowed(state, source, target, model).model_dump_json(), media_type="application/json")
    listing = await whole_listing(state)
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(listing.gzipped, media_type="application/json", headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
    return Response(listing.body, media_type="application/json", headers={"Vary": "Accept-Encoding"})