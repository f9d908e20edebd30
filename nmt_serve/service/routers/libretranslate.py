"""LibreTranslate's API, so its clients and front-ends work unchanged: POST /translate, /detect,
/translate_file and /suggest, GET /languages, /frontend/settings and /download_file/<id>.

As upstream, every parameter may come in the query string, a form (urlencoded or multipart) or a JSON
body (the body wins over the query string), and errors are {"error": "message"}: 400 for a bad
parameter (where our own endpoints say 422), 403 for a missing or wrong API key (ours: 401), and our
413, 429, 500, 503 and 504 with their headers (Retry-After).

/translate_file translates a file in the request, as upstream, up to sync_file_chars; a larger .txt or
document becomes a job (jobs_files.translate_or_submit) and the answer, at once, is the same URL, whose
download answers 202 with the job's progress until the file is there.
"""
from __future__ import annotations

import asyncio
import html
import json
import logging
import math
import os
import re
import tempfile
from typing import Annotated, Any, Callable, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from nmt_serve.service.deadlines import until_disconnected
from nmt_serve.service.dependencies import authorize, get_state, job_owner
from nmt_serve.service.errors import APIError, bad_request, printable
from nmt_serve.service.file_store import FILE_CONTENT, FileStore
from nmt_serve.service.file_translation import FORMATS, attachment_headers, check_format, translated_name
from nmt_serve.service.file_translation import media_type as media_type_of
from nmt_serve.service.jobs_files import translate_or_submit, translated_file
from nmt_serve.service.jobs_store import CANCELLED, DONE, FAILED, FINISHED
from nmt_serve.service.limits import unpaired_surrogate
from nmt_serve.service.pipeline import AUTO, FALLBACK_LANGUAGE, stored_glossary, terminology, translate_texts
from nmt_serve.service.schemas import GlossaryTerm, JobStatus, Language
from nmt_serve.service.security import bearer_token
from nmt_serve.service.state import ServiceState
from nmt_serve.text.glossary import Terminology
from nmt_serve.text.language_detection import language_name

log = logging.getLogger("nmt_serve.service.libretranslate")
GLOSSARY_ID = re.compile("[0-9a-f]{32}")

FILE_FORMATS = FORMATS  # .txt, .html, .htm, .docx, .pptx, .xlsx, .odt, .odp, .epub, .srt, .vtt, .po, .xlf, .xliff, .md, .markdown
FRONTEND_TIMEOUT_MS = 500  # upstream's default: how long its front-end waits after typing before it translates


def libretranslate_error(request: Request, exc: Exception) -> JSONResponse:
    """Any failure on these endpoints, as LibreTranslate reports it."""
    headers = None
    if isinstance(exc, APIError):
        status, message, headers = exc.status, exc.message, dict(exc.headers or {})
        if status == 401:  # LibreTranslate's clients take 403 for "bad key" (deep-translator raises on it)
            status = 403
            headers.pop("WWW-Authenticate", None)
        elif status == 422:
            status = 400
            message = f"Invalid request: {message}" + (f" ({exc.param})" if exc.param else "")
    elif isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        status, message = 400, f"Invalid request: {first.get('msg', 'invalid parameters')}" + (f" ({loc})" if loc else "")
    elif isinstance(exc, StarletteHTTPException):
        status, message, headers = exc.status_code, str(exc.detail), getattr(exc, "headers", None)
    else:
        # the details go to the log, not to the client
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        status, message = 500, "the server failed to process this request"
    return JSONResponse({"error": printable(message)}, status, headers=headers or None)


class LibreTranslateRoute(APIRoute):
    """Catches what the handler raises (its parameters' validation and the body limit included), so
    that these routes answer in LibreTranslate's shape while the app's handlers keep ours everywhere else."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # noqa: BLE001 - every failure becomes an error response
                return libretranslate_error(request, exc)

        return answer


router = APIRouter(tags=["LibreTranslate compatible"], route_class=LibreTranslateRoute)


def is_libretranslate_path(path: str) -> bool:
    """Whether errors on this path take LibreTranslate's shape: its routes' own, and routing's (a method
    they do not take, a download name that matches nothing)."""
    return path.startswith("/download_file/") or any(path == route.path for route in router.routes)


# ---------------------------------------------------------------------------------------- parameters


async def read_params(request: Request) -> dict[str, Any]:
    """The query string's parameters, overridden by the body's: a form or a JSON object. A repeated
    q is a list of texts."""
    params = _line_feeds(_multi(request.query_params))
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        params.update(_line_feeds(_multi(await request.form())))
    else:
        body = await request.body()
        if body.strip():
            try:
                data = json.loads(body)
            except (ValueError, RecursionError):  # RecursionError: nested past what the parser takes
                raise bad_request("Invalid request: the body is neither a form nor valid JSON") from None
            if not isinstance(data, dict):
                raise bad_request("Invalid request: the JSON body must be an object")
            params.update(data)
    for key, value in params.items():
        if problem := unpaired_surrogate(value):
            raise bad_request(f"Invalid request: {key} {problem}", key)
    return params


def _line_feeds(params: dict[str, Any]) -> dict[str, Any]:
    """Texts from a query string or a form with their line breaks as LF: browsers send a textarea's as CRLF,
    and upstream counts and translates them as LF (JSON's texts are taken as they are, as upstream does)."""
    for key in ("q", "s"):
        if isinstance(params.get(key), str):
            params[key] = _LINE_BREAK.sub("\n", params[key])
        elif isinstance(params.get(key), list):
            params[key] = [_LINE_BREAK.sub("\n", v) if isinstance(v, str) else v for v in params[key]]
    return params


_LINE_BREAK = re.compile(r"\r\n?")


def _multi(items) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in dict.fromkeys(items.keys()):
        values = items.getlist(key)
        out[key] = values if key == "q" and len(values) > 1 else values[-1]
    return out


def text_param(params: dict, name: str, required: bool = True, default: str | None = None) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise bad_request(f"Invalid request: missing {name} parameter", name)
        return default
    if not isinstance(value, str):
        raise bad_request(f"Invalid request: {name} must be a string", name)
    return value


def texts_param(params: dict) -> str | list[str]:
    q = params.get("q")
    if isinstance(q, list):
        if not q or not all(isinstance(t, str) for t in q):
            raise bad_request("Invalid request: q must be a text or a non-empty list of texts", "q")
        return q
    return text_param(params, "q")


def authorize_libretranslate(state: ServiceState, request: Request, params: dict) -> None:
    """The key from the api_key parameter (or an Authorization: Bearer header); 403 as upstream."""
    key = params.get("api_key")
    if key is not None and not isinstance(key, str):
        raise bad_request("Invalid request: api_key must be a string", "api_key")
    key = key or None
    try:
        authorize(state, request, key)
    except APIError as exc:
        if exc.status != 401:
            raise
        message = "Invalid API key" if key or bearer_token(request) else "Please provide an API key (the api_key parameter)"
        raise APIError(403, "forbidden", message) from None


def check_source(state: ServiceState, source: str, param: str = "source") -> None:
    if source != AUTO and state.language(source) not in state.sources:
        raise bad_request(f"{source} is not supported", param)


def check_target(state: ServiceState, target: str) -> None:
    if state.language(target) not in state.targets:
        raise bad_request(f"{target} is not supported", "target")


def check_languages(state: ServiceState, source: str, target: str) -> None:
    """Both languages known; the source equal to the target is any served language (upstream gives
    the text back: LibreTranslate's page keeps the old target when the source changes to it)."""
    if state.to_itself(source, target):
        return
    check_source(state, source)
    check_target(state, target)


def detected_language(result) -> dict:
    return {"confidence": round(result.detected.confidence * 100, 2), "language": result.detected.language}


# ---------------------------------------------------------------------------------------- documentation


class LibreDetectedLanguage(BaseModel):
    confidence: float = Field(description="0-100")
    language: str


class LibreTranslation(BaseModel):
    translatedText: str | list[str]
    alternatives: list[str] | list[list[str]] | None = Field(None, description="with alternatives > 0")
    detectedLanguage: LibreDetectedLanguage | list[LibreDetectedLanguage] | None = Field(None, description='with source "auto"')


class LibreTranslateParams(BaseModel):
    q: Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1)] = Field(description="text(s) to translate")
    source: str = Field(description='source language code, or "auto" to detect it')
    target: str
    # null is the default, as upstream takes it
    format: Literal["text", "html"] | None = "text"
    alternatives: Annotated[int, Field(ge=0)] | None = Field(0, description="alternative translations to return as well")
    api_key: str | None = None
    glossary: str | list[GlossaryTerm] | None = Field(None, description="an extension of ours (upstream has none): "
                                                      "terminology as /v1/translate's glossary; in a form, as JSON text")
    avoid: str | list[str] | None = Field(None, description="an extension of ours: target terms no translation may "
                                                            "contain, as /v1/translate's avoid; in a form, as JSON text")
    glossary_id: str | None = Field(None, description="an extension of ours: a stored glossary (POST /v1/glossaries), "
                                                    "as /v1/translate's glossary_id")


class DetectParams(BaseModel):
    q: str = Field(min_length=1, description="text whose language to detect")
    api_key: str | None = None


class SuggestParams(BaseModel):
    q: str
    s: str = Field(description="the suggested translation")
    source: str
    target: str


class TranslateFileParams(BaseModel):
    file: bytes = Field(json_schema_extra={"format": "binary"},
                        description=f"the file: {', '.join(FILE_FORMATS)} (.txt and .html in UTF-8)")
    source: str = Field(description='source language code, or "auto"')
    target: str
    api_key: str | None = None


def inline_defs(schema: dict) -> dict:
    """pydantic's schema with each of its $defs put where it is referred to: a body documented inline has
    no place for them in the OpenAPI document (its "#/$defs/..." would not resolve)."""
    defs = schema.pop("$defs", {})

    def walk(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(dict(defs[ref.rsplit("/", 1)[-1]]))
            return {k: walk(v) for k, v in node.items()}
        return [walk(v) for v in node] if isinstance(node, list) else node

    return walk(schema)


def body_doc(model: type[BaseModel], example: dict, content_types: tuple[str, ...]) -> dict:
    schema = inline_defs(model.model_json_schema())
    return {"requestBody": {"required": True, "content": {
        ct: {"schema": schema, "example": example} for ct in content_types}}}


def example(body: Any, description: str = "") -> dict:
    return {"description": description or "OK", "content": {"application/json": {"example": body}}}


FORMS = ("application/json", "application/x-www-form-urlencoded", "multipart/form-data")
FORBIDDEN = {403: example({"error": "Invalid API key"}, "API keys are required (--api-keys) and this one is missing or wrong")}


# ---------------------------------------------------------------------------------------- endpoints


@router.post(
    "/translate", response_model=LibreTranslation, response_model_exclude_none=True,
    openapi_extra=body_doc(LibreTranslateParams, {"q": "Ein Hund rennt.", "source": "auto", "target": "en", "format": "text",
                                                  "alternatives": 2}, FORMS),
    responses={200: example({"translatedText": "A dog runs.", "alternatives": ["A dog is running.", "One dog runs."],
                             "detectedLanguage": {"confidence": 92.5, "language": "de"}}), **FORBIDDEN},
)
async def translate(request: Request):
    state: ServiceState = request.app.state.service  # not Depends(get_state): its solving is ~2% of a request's CPU
    params = await read_params(request)
    authorize_libretranslate(state, request, params)
    q = texts_param(params)
    source, target = text_param(params, "source"), text_param(params, "target")
    format_ = text_param(params, "format", required=False, default="text")
    if format_ not in ("text", "html"):
        raise bad_request(f"{format_} format is not supported", "format")
    alternatives = params.get("alternatives")
    if alternatives is None or alternatives == "":  # absent, JSON's null (the schema's default) or a form's empty field
        alternatives = 0
    try:
        # a form's "3", JSON's 3 (or 3.0); anything else is not the integer the schema says
        if isinstance(alternatives, bool) or not isinstance(alternatives, (str, int, float)) \
                or isinstance(alternatives, float) and not alternatives.is_integer():
            raise ValueError(alternatives)
        alternatives = int(alternatives)
    except (TypeError, ValueError, OverflowError):
        raise bad_request("Invalid request: alternatives parameter is not a number", "alternatives") from None
    if alternatives < 0:  # the schema says >= 0 (upstream takes a negative count as 0)
        raise bad_request("Invalid request: alternatives parameter must be >= 0", "alternatives")
    limit = state.settings.max_beam_size - 1
    if alternatives > limit:
        raise bad_request(f"Invalid request: alternatives parameter must be <= {limit}", "alternatives")
    state.require_ready()
    check_languages(state, source, target)
    n = alternatives + 1
    texts = [q] if isinstance(q, str) else q
    glossary_id = text_param(params, "glossary_id", required=False)
    if glossary_id is not None and not GLOSSARY_ID.fullmatch(glossary_id):
        raise bad_request("Invalid request: glossary_id is not a glossary's id", "glossary_id")
    owner = job_owner(state, request, params.get("api_key") or None) if state.keys.enabled else None
    stored = await stored_glossary(state, glossary_id, owner, source, target)
    results = await translate_texts(state, request, source=source, target=target, texts=texts,
                                    options=state.limits.decode_options(max(4, n), n, None), param="q", format=format_,
                                    upstream_fallbacks=True, terminology=terminology_params(params, stored))
    body: dict[str, Any] = {"translatedText": results[0].text if isinstance(q, str) else [r.text for r in results]}
    if source == AUTO:
        body["detectedLanguage"] = detected_language(results[0]) if isinstance(q, str) else [detected_language(r) for r in results]
    if alternatives:
        alts = [list(dict.fromkeys(a for a in r.alternatives if a != r.text)) for r in results]
        body["alternatives"] = alts[0] if isinstance(q, str) else alts
    return JSONResponse(body)  # what response_model documents, without FastAPI validating it against it again


def terminology_params(params: dict, stored: Terminology | None = None) -> Terminology | None:
    """The glossary and avoid extension parameters: lists in JSON bodies, JSON text in forms; stored: the
    terms of the glossary glossary_id names."""
    found = {}
    for name in ("glossary", "avoid"):
        value = params.get(name)
        if isinstance(value, str) and value.strip():
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                raise bad_request(f"Invalid request: {name} is not valid JSON", name) from None
        found[name] = None if value in (None, "") else value
    glossary, avoid = found["glossary"], found["avoid"]
    if glossary is not None and not (isinstance(glossary, list) and all(
            isinstance(e, dict) and set(e) == {"source", "target"} and isinstance(e["source"], str) and isinstance(e["target"], str)
            for e in glossary)):
        raise bad_request('Invalid request: glossary must be a list of {"source": ..., "target": ...}', "glossary")
    if avoid is not None and not (isinstance(avoid, list) and all(isinstance(t, str) for t in avoid)):
        raise bad_request("Invalid request: avoid must be a list of strings", "avoid")
    return terminology(glossary, avoid, stored)


@router.post(
    "/detect", response_model=list[LibreDetectedLanguage],
    openapi_extra=body_doc(DetectParams, {"q": "Ein Hund rennt über die Wiese."}, FORMS),
    responses={200: example([{"confidence": 97.8, "language": "de"}, {"confidence": 2.2, "language": "en"}],
                            "the served source languages the text may be in, best first"), **FORBIDDEN},
)
async def detect(request: Request, state: ServiceState = Depends(get_state)):
    params = await read_params(request)
    authorize_libretranslate(state, request, params)
    q = texts_param(params)
    texts = [q] if isinstance(q, str) else q
    state.require_ready()
    state.limits.check_texts(texts, "q")
    detector, text = state.detector(), "\n".join(texts)
    found = detector.detect(text)
    named = detector.identify(text)
    if not found or named is not None and named.language not in detector.served:
        # nothing to tell languages apart by (digits, punctuation), or a language no model serves:
        # upstream answers English with no confidence
        return [{"confidence": 0.0, "language": FALLBACK_LANGUAGE}]
    return [{"confidence": round(d.confidence * 100, 2), "language": d.language} for d in found]


@router.get(
    "/languages", response_model=list[Language],
    responses={200: example([{"code": "de", "name": "German", "targets": ["en"]}, {"code": "en", "name": "English", "targets": ["de"]}])},
)
async def languages(state: ServiceState = Depends(get_state)) -> list[Language]:
    targets: dict[str, list[str]] = {}
    for m in [*state.models.values(), *state.pivots.values()]:  # a direction through the pivot language too
        targets.setdefault(m.source, []).append(m.target)
    return [Language(code=c, name=language_name(c), targets=sorted(t)) for c, t in sorted(targets.items())]


@router.get(
    "/frontend/settings",
    responses={200: example({
        "charLimit": 20000, "frontendTimeout": FRONTEND_TIMEOUT_MS, "apiKeys": False, "keyRequired": False, "suggestions": False,
        "filesTranslation": True, "supportedFilesFormat": list(FILE_FORMATS),
        "language": {"source": {"code": "auto", "name": "Auto Detect"}, "target": {"code": "en", "name": "English"}},
    }, "what LibreTranslate's front-end and clients read")},
)
async def frontend_settings(state: ServiceState = Depends(get_state)) -> dict:
    targets = sorted(state.targets)
    target = "en" if "en" in targets else (targets[0] if targets else "en")
    source = {"code": AUTO, "name": "Auto Detect"}
    if not state.settings.language_detection:  # a served source language, another than the target where one is
        sources = sorted(state.sources, key=lambda c: (c == target, c)) or ["en"]
        source = {"code": sources[0], "name": language_name(sources[0])}
    return {
        "charLimit": state.settings.max_chars_per_text,
        "frontendTimeout": FRONTEND_TIMEOUT_MS,
        "apiKeys": state.keys.enabled,
        "keyRequired": state.keys.enabled,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": list(FILE_FORMATS),
        "language": {"source": source, "target": {"code": target, "name": language_name(target)}},
    }


@router.post(
    "/suggest",
    openapi_extra=body_doc(SuggestParams, {"q": "Ein Hund rennt.", "s": "A dog runs.", "source": "de", "target": "en"}, FORMS),
    responses={403: example({"error": "Suggestions are disabled on this server."}, "always: this server takes no suggestions")},
)
async def suggest() -> dict:
    raise APIError(403, "forbidden", "Suggestions are disabled on this server.")


def file_store(request: Request, state: ServiceState) -> FileStore:
    store = getattr(request.app.state, "libretranslate_files", None)
    if store is None:
        # under jobs_dir where it is set: shared with every other API process or replica on that directory,
        # as the jobs are (a download may reach another pod than the upload did); else the engine's socket
        # directory: shared by all API workers, private, removed at shutdown
        base = state.settings.jobs_dir or next(iter(state.settings.engine_dirs), "") or (state.supervisor.socket_dir if state.supervisor else "")
        store = FileStore(os.path.join(base, "files") if base else tempfile.mkdtemp(prefix="nmt-files-"))
        request.app.state.libretranslate_files = store
    return store


def url_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "file"


JOB_ANSWER = {"translatedFileUrl": "http://127.0.0.1:8000/download_file/5f0c9d3e8a7b41c2a1d4e6f8b9c0d1e2.roman_en.docx",
              "jobId": "5f0c9d3e8a7b41c2a1d4e6f8b9c0d1e2", "jobUrl": "http://127.0.0.1:8000/v1/jobs/5f0c9d3e8a7b41c2a1d4e6f8b9c0d1e2"}


@router.post(
    "/translate_file",
    openapi_extra=body_doc(TranslateFileParams, {"source": "de", "target": "en"}, ("multipart/form-data",)),
    responses={200: {"description": "where to download the translated file: translated in the request (kept for 30 minutes), "
                                    "or, past sync_file_chars, a job (an extension of ours: jobId and jobUrl, the job's "
                                    "GET /v1/jobs/{id}; the download answers 202 with the progress until the file is ready, "
                                    "and is kept for job_ttl_s)",
                     "content": {"application/json": {"examples": {
                         "translated": {"value": {"translatedFileUrl": "http://127.0.0.1:8000/download_file/"
                                                                       "3f2a9c0e5b7d4e1f8a6b2c9d0e1f2a3b.bericht_en.txt"}},
                         "job": {"value": JOB_ANSWER}}}}},
               413: example({"error": "the file has 17000000 bytes; the limit is 16000000 (max_job_bytes)"},
                            "past max_file_bytes; a job past max_job_bytes, max_job_texts paragraphs (lines of a .txt) or "
                            "max_chars_per_text in one of them; an HTML page past max_chars_per_text"),
               **FORBIDDEN},
)
async def translate_file(request: Request, state: ServiceState = Depends(get_state)):
    params = await read_params(request)
    authorize_libretranslate(state, request, params)
    upload = params.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("Invalid request: missing file parameter", "file")
    source, target = text_param(params, "source"), text_param(params, "target")
    name = os.path.basename((upload.filename or "").replace("\\", "/"))
    if not name:
        raise bad_request("Invalid request: empty file", "file")
    check_format(name)
    state.require_ready()
    check_source(state, source)
    check_target(state, target)
    try:
        data = await upload.read()
    finally:
        await upload.close()
    outcome = await translate_or_submit(state, request, request.app.state.jobs, name=name, data=data, source=source,
                                        target=target, download_file=True,
                                        owner=job_owner(state, request, params.get("api_key") or None))
    name = translated_name(name, target)
    if isinstance(outcome, bytes):
        file_id = file_store(request, state).put(name, outcome)
        return {"translatedFileUrl": str(request.url_for("download_file", file=f"{file_id}.{url_safe(name)}"))}
    job_id = outcome["id"]  # the download serves the job's file under the job's id
    return {"translatedFileUrl": str(request.url_for("download_file", file=f"{job_id}.{url_safe(name)}")), "jobId": job_id,
            "jobUrl": str(request.url_for("job_status", job_id=job_id))}


@router.get(
    "/download_file/{file}", response_class=Response,
    responses={200: {"description": "the translated file, as an attachment", "content": FILE_CONTENT},
               202: {"description": "a job's file not ready yet (after waiting up to `wait` seconds for it): its progress (as "
                                    "GET /v1/jobs/{id}), with Retry-After; a "
                                    "browser (Accept: text/html) gets a page that reloads itself until the file downloads",
                     "content": {"application/json": {"schema": JobStatus.model_json_schema()},
                                 "text/html": {"schema": {"type": "string"}}}},
               404: example({"error": "no such file: it was never stored or has expired"}, "unknown or expired"),
               410: example({"error": "the translation of roman.docx was cancelled"}, "a job's file whose job was cancelled"),
               500: example({"error": "the translation of roman.docx failed: text 12 has 9000 tokens; the limit is 8192"},
                            "a job's file whose job failed")},
)
async def download_file(file: str, request: Request, state: ServiceState = Depends(get_state),
                        wait: Annotated[float | None, Query(ge=0, description=
                            "seconds to wait for a job's file before answering 202 (default: the server's "
                            "file_download_wait_s; 0: answer at once, for a client that polls)")] = None) -> Response:
    file_id = file.split(".", 1)[0]
    stored = file_store(request, state).get(file_id)
    if stored is not None:
        # an uploaded page served from this origin: downloaded, never rendered or sniffed into something else
        return Response(stored.data, media_type=stored.media_type, headers=attachment_headers(stored.name))
    store = request.app.state.jobs.store
    record = await asyncio.to_thread(store.read, file_id)
    if record is None or not record.get("download_file"):  # a job of /v1/jobs/file is read there, with its key
        raise APIError(404, "not_found", "no such file: it was never stored or has expired")
    name = record["file_name"]
    if record["state"] not in FINISHED and "text/html" not in request.headers.get("accept", ""):
        # a client that fetches the URL once (libretranslate-aio's CLI --output) gets the file of a job that
        # ends meanwhile; a browser gets the self-reloading progress page at once
        seconds = state.settings.file_download_wait_s if wait is None else min(wait, state.settings.file_download_wait_s)
        record = await job_end(store, file_id, record, seconds, request)
    if record["state"] == DONE:
        try:
            out, data = await asyncio.to_thread(translated_file, store, record)
        except FileNotFoundError:  # removed (DELETE) since its record was read
            raise APIError(404, "not_found", "no such file: it was never stored or has expired") from None
        return Response(data, media_type=media_type_of(out), headers=attachment_headers(out))
    if record["state"] == CANCELLED:
        raise APIError(410, "gone", f"the translation of {name} was cancelled")
    if record["state"] == FAILED:
        raise APIError(500, "job_failed", f"the translation of {name} failed: {record['error']}")
    return job_progress(request, JobStatus.of(record), name)


DOWNLOAD_POLL_S = 0.25  # how often a waiting download looks at its job's record


async def job_end(store, job_id: str, record: dict, seconds: float, request: Request) -> dict:
    """The job's record once it has ended, or as it stands after `seconds` (or once the client has gone:
    deadlines.until_disconnected, which costs nothing while it waits)."""
    async def ended() -> None:
        nonlocal record
        while record["state"] not in FINISHED:
            await asyncio.sleep(DOWNLOAD_POLL_S)
            record = await asyncio.to_thread(store.read, job_id) or record

    if record["state"] in FINISHED or seconds <= 0:
        return record
    waits = {asyncio.ensure_future(ended()), asyncio.ensure_future(until_disconnected(request))}
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return record


def job_progress(request: Request, status: JobStatus, name: str) -> Response:
    """202 while the job runs: its progress as JSON, or for a browser (LibreTranslate's page opens the URL in
    a tab) a page that reloads itself, so that the file downloads once it is there."""
    wait = max(1, min(10, math.ceil(status.eta_seconds if status.eta_seconds is not None else 2)))
    headers = {"Retry-After": str(wait), "Cache-Control": "no-store"}
    if "text/html" not in request.headers.get("accept", ""):
        return JSONResponse(status.model_dump(), 202, headers=headers)
    left = f", about {status.eta_seconds:g} s left" if status.eta_seconds is not None else ""
    page = (f'<!DOCTYPE html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{wait}">'
            f"<title>Translating {html.escape(name)}</title></head><body><p>Translating {html.escape(name)} ({status.state}): "
            f"{status.done} of {status.total} paragraphs, {status.percent:g}%{left}.</p>"
            "<p>This page reloads itself; the file downloads when it is ready.</p></body></html>")
    return Response(page, 202, media_type="text/html; charset=utf-8",
                    headers={**headers, "Content-Security-Policy": "default-src 'none'", "X-Content-Type-Options": "nosniff"})
