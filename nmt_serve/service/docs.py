"""/docs (Swagger UI) and /redoc served from the fastapi-offline package, and an OpenAPI schema whose
error responses are the ones this service really sends."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

# FastAPI's own pages load Swagger UI and ReDoc from a CDN, so they are blank without internet; the
# package ships the same bundles, which upgrade with it instead of being copied into this repository
ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/docs/assets"

LIBRETRANSLATE_TAG = "LibreTranslate compatible"

ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["type", "message", "param"],
        "properties": {
            "type": {"type": "string", "description": "machine-readable kind, e.g. invalid_request, overloaded"},
            "message": {"type": "string", "description": "what went wrong, in plain words"},
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}],
                      "description": "the request field (or header) at fault, when one is"},
        },
    }},
}
LIBRETRANSLATE_ERROR_SCHEMA = {
    "title": "LibreTranslateError",
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "what went wrong, in plain words"}},
}

RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
WWW_AUTHENTICATE = {"WWW-Authenticate": {"description": "the scheme to authenticate with", "schema": {"type": "string", "example": "Bearer"}}}

# status -> (description, headers, [(example name, type, message, param)]); the messages are the
# service's own (errors.py, state.py, engine.py, security.py, middleware.py), shortened where they vary
ERRORS: dict[int, tuple[str, dict, list[tuple[str, str, str, str | None]]]] = {
    400: ("The request is well-formed but cannot be served: no model for the language pair, an empty list of texts, "
          "or an option this endpoint does not support.", {}, [
              ("no_model", "invalid_request", "no model for fr->en; supported pairs: de-en, en-de", "source"),
              ("empty", "invalid_request", "the list of texts is empty", "text"),
          ]),
    401: ("Credentials are required and missing or wrong: an API key (with `--api-keys`), or on /metrics the metrics "
          "token (with `--metrics-token`); send `Authorization: Bearer <key>`.",
          WWW_AUTHENTICATE, [
              ("unauthorized", "unauthorized", "a valid API key is required: send 'Authorization: Bearer <key>'", None),
          ]),
    413: ("The body is larger than `--max-body-bytes`, or there are more texts, characters or tokens than the "
          "per-request limits allow.", {}, [
              ("body", "http_error", "request body larger than the limit of 1000000 bytes", None),
              ("tokens", "request_too_large", "text 0 has 812 tokens; the limit is 256", "text"),
          ]),
    422: ("The body, a parameter or the X-Request-Timeout header is invalid (wrong type, out of range, unknown field).",
          {}, [
              ("missing", "validation_error", "Field required", "text"),
              ("beam_size", "validation_error", "beam_size must be at most 8", "beam_size"),
          ]),
    429: ("This client (API key, or address when keys are off) went over `--rate-limit-per-minute`.", RETRY_AFTER, [
        ("rate_limited", "rate_limited", "rate limit of 60 requests per minute exceeded", None),
    ]),
    500: ("The server failed to process the request; the details are in the server log.", {}, [
        ("internal_error", "internal_error", "the server failed to process this request", None),
    ]),
    503: ("Retry later (see Retry-After): the models are still loading, the queue is full or the work queued ahead "
          "would not finish before this request's deadline, the engine process is restarting, a batch ran out of "
          "memory, or the server is shutting down.", RETRY_AFTER, [
              ("not_ready", "not_ready", "models are still loading", None),
              ("overloaded", "overloaded", "the server is busy: the queue is full, retry later", None),
              ("engine_unavailable", "engine_unavailable", "the engine stopped answering; retry shortly", None),
              ("out_of_memory", "out_of_memory",
               "the model ran out of memory on this batch; retry with fewer or shorter texts", None),
          ]),
    504: ("The request did not finish within its deadline (`--request-timeout-s`, or less when X-Request-Timeout asks); "
          "its work was dropped.", {}, [
              ("timeout", "timeout", "the request did not finish within 30s", None),
          ]),
}

# LibreTranslate's routes answer in its own way (routers/libretranslate.py): 403 for a missing or wrong
# key where ours say 401, and 400 for any invalid parameter where ours say 422
LIBRETRANSLATE_STATUS = {401: 403, 422: 400}
LIBRETRANSLATE_ERRORS: dict[int, tuple[str, list[tuple[str, str]]]] = {
    400: ("A parameter is missing or invalid, the language is not served, or the format is not supported.", [
        ("missing", "Invalid request: missing q parameter"),
        ("language", "fr is not supported"),
    ]),
    403: ("API keys are required (`--api-keys`) and the `api_key` parameter (or `Authorization: Bearer <key>`) is "
          "missing or wrong.", [
              ("invalid_key", "Invalid API key"),
          ]),
}

# What each handler can answer besides what its schema already implies (a body: 413 and 422; parameters:
# 422). The client that gets 499 (it went away) never reads it, so it is left out.
ENGINE_ERRORS = (400, 500, 503, 504)
RAISED: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/translate"): ENGINE_ERRORS,
    ("post", "/v1/attention"): ENGINE_ERRORS,
    # the LibreTranslate handlers authorize themselves: the key may come as a parameter
    ("post", "/translate"): (*ENGINE_ERRORS, 401, 429),
    ("post", "/translate_file"): (*ENGINE_ERRORS, 401, 429),
    ("post", "/v1/translate_file"): ENGINE_ERRORS,
    ("post", "/detect"): (400, 401, 429, 503),
    # entries refused, the models loading or the directory unwritable (409 and 507: the router documents them)
    ("post", "/v1/glossaries"): (400, 503),
    ("delete", "/v1/glossaries/{glossary_id}"): (503,),
    ("get", "/health/ready"): (503,),
    ("get", "/metrics"): (401,),  # with --metrics-token
}
KEYED_PREFIX = "/v1/"  # checked before the routers (middleware.BodySizeLimit): 401 with --api-keys, 429 with a rate limit


def _error_response(status: int, libretranslate: bool) -> dict:
    description, headers, examples = ERRORS.get(status, ("Error", {}, []))
    if libretranslate:
        headers = {k: v for k, v in headers.items() if k != "WWW-Authenticate"}
        values = {name: {"error": message} for name, _, message, _ in examples}
        if status in LIBRETRANSLATE_ERRORS:
            description, own = LIBRETRANSLATE_ERRORS[status]
            values = {name: {"error": message} for name, message in own}
        ref = "#/components/schemas/LibreTranslateError"
    else:
        values = {name: {"error": {"type": type_, "message": message, "param": param}} for name, type_, message, param in examples}
        ref = "#/components/schemas/Error"
    media: dict = {"schema": {"$ref": ref}}
    if values:
        media["examples"] = {name: {"summary": name.replace("_", " "), "value": value} for name, value in values.items()}
    response = {"description": description, "content": {"application/json": media}}
    if headers:
        response["headers"] = copy.deepcopy(headers)
    return response


def _statuses(method: str, path: str, operation: dict) -> set[int]:
    statuses = set(RAISED.get((method, path), ()))
    libretranslate = LIBRETRANSLATE_TAG in operation.get("tags", [])
    if "requestBody" in operation:
        statuses.add(413)  # the body limit (middleware) applies to every body
        if not libretranslate:  # (those handlers parse their bodies themselves: RAISED says what they refuse)
            statuses.add(422)
    if any(p.get("in") != "path" or p.get("schema", {}).get("type") != "string" for p in operation.get("parameters", [])):
        statuses.add(422)  # (any string is a valid string path parameter)
    if path.startswith(KEYED_PREFIX):
        statuses |= {401, 429}
    if libretranslate:
        statuses = {LIBRETRANSLATE_STATUS.get(s, s) for s in statuses}
    # and whatever error a router documents itself gets the error schema too
    return statuses | {int(s) for s in operation.get("responses", {}) if s.isdigit() and int(s) >= 400}


def document_errors(schema: dict) -> dict:
    """Give every operation the error responses it can return, in the shape it returns them:
    {"error": {"type", "message", "param"}}, or LibreTranslate's {"error": str} on its endpoints."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    components["LibreTranslateError"] = LIBRETRANSLATE_ERROR_SCHEMA
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            libretranslate = LIBRETRANSLATE_TAG in operation.get("tags", [])
            responses = operation.setdefault("responses", {})
            if "HTTPValidationError" in json.dumps(responses.get("422", {})):
                # FastAPI's: its {"detail": [...]} is a shape this service never sends
                del responses["422"]
            for status in sorted(_statuses(method, path, operation)):
                ours = _error_response(status, libretranslate)
                given = responses.get(str(status))
                if given:
                    # a router's own description and example say more about that endpoint than ours
                    media = given.setdefault("content", {}).setdefault("application/json", {})
                    media["schema"] = ours["content"]["application/json"]["schema"]
                    if "example" not in media and "examples" not in media and "examples" in ours["content"]["application/json"]:
                        media["examples"] = ours["content"]["application/json"]["examples"]
                    error = media.get("example", {}).get("error")
                    if not libretranslate and isinstance(error, dict):
                        error.setdefault("param", None)  # FastAPI drops the nulls of a router's example
                    given.setdefault("headers", ours.get("headers", {}))
                    if not given["headers"]:
                        del given["headers"]
                else:
                    responses[str(status)] = ours
            operation["responses"] = dict(sorted(responses.items()))
    text = json.dumps(schema["paths"]) + json.dumps({k: v for k, v in components.items()
                                                     if k not in ("HTTPValidationError", "ValidationError")})
    for unused in ("HTTPValidationError", "ValidationError"):
        if f'"#/components/schemas/{unused}"' not in text:
            components.pop(unused, None)
    return schema


def _set(node: dict | None, **bounds) -> None:
    """Bounds on a property: on the branch of its anyOf whose type they fit (an integer or null: the integer)."""
    if not node:
        return
    for branch in node.get("anyOf", [node]):
        if branch.get("type") == "integer" and {"minimum", "maximum"} & set(bounds):
            branch.update({k: v for k, v in bounds.items() if k in ("minimum", "maximum")})
        elif branch.get("type") == "string" and "maxLength" in bounds:
            branch.update({"maxLength": bounds["maxLength"], "minLength": max(branch.get("minLength", 0), bounds.get("minLength", 0))})
        elif branch.get("type") == "array" and "maxItems" in bounds:
            branch.update({"maxItems": bounds["maxItems"], "minItems": max(branch.get("minItems", 0), 1)})
            _set(branch.get("items"), maxLength=bounds["maxLength"])


def _languages(node: dict | None, codes: list[str]) -> None:
    if node is not None and codes:
        node["enum"] = codes


def document_limits(schema: dict, state) -> dict:
    """What a request may hold on this server, in the schema: the limits it was started with (settings) and
    the languages and layers of the models it serves, so that a request the schema allows is one it takes.
    (Without models yet there are no language lists: the schema is then not kept, see install_openapi.)"""
    s = state.settings
    models = list(state.models.values())
    sources, targets = sorted(state.sources), sorted(state.targets)
    text = dict(maxLength=s.max_chars_per_text, maxItems=s.max_texts_per_request)
    components = schema.get("components", {}).get("schemas", {})
    for name in ("TranslateRequest", "AttentionRequest", "JobRequest"):
        properties = components.get(name, {}).get("properties", {})
        _set(properties.get("beam_size"), maximum=s.max_beam_size)
        _set(properties.get("num_hypotheses"), maximum=s.max_beam_size)
        _set(properties.get("max_length"), maximum=s.max_output_length)
        _set(properties.get("text"), **text)
        _set(properties.get("q"), maxLength=s.max_chars_per_text, maxItems=s.max_job_texts)  # a job's texts
        _languages(properties.get("source"), sources if name == "AttentionRequest" else sources + ["auto"])
        _languages(properties.get("target"), targets)
    attention = components.get("AttentionRequest", {}).get("properties", {})
    if models:
        # indices every served model has (a request names no model until its pair picks one)
        for key, count in (("layers", min(m.info["n_decoder_layers"] for m in models)),
                           ("heads", min(m.info["n_heads"] for m in models))):
            for branch in attention.get(key, {}).get("anyOf", []):
                if branch.get("type") == "array":
                    branch["items"].update(minimum=0, maximum=count - 1)
    # LibreTranslate's routes document their parameters inline (routers/libretranslate.py)
    for path in ("/translate", "/detect"):
        for media in schema.get("paths", {}).get(path, {}).get("post", {}).get("requestBody", {}).get("content", {}).values():
            properties = media.get("schema", {}).get("properties", {})
            _set(properties.get("q"), **text)
            _set(properties.get("alternatives"), maximum=s.max_beam_size - 1)
            _languages(properties.get("source"), sources + ["auto"])
            _languages(properties.get("target"), sorted(set(sources) | set(targets)))
    return schema


def install_openapi(app: FastAPI) -> None:
    generate = app.openapi

    built_for: list = [None]  # the served directions the kept schema was built for (their languages are in it)

    def openapi() -> dict:
        state = getattr(app.state, "service", None)
        directions = tuple(state.directions) if state is not None else ()
        if app.openapi_schema is None or built_for[0] != directions:
            app.openapi_schema = None  # generate() caches its result in app.openapi_schema; ours replaces it
            schema = document_errors(generate())
            app.openapi_schema = document_limits(schema, state) if state is not None else schema
            built_for[0] = directions
        return app.openapi_schema

    app.openapi = openapi


def install_docs(app: FastAPI) -> None:
    """/docs, /redoc (with their assets from the package, so they work offline) and the documented errors.
    The app must be created with docs_url=None and redoc_url=None."""
    install_openapi(app)
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    oauth2_redirect = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")  # behind a proxy that strips a prefix
        return get_swagger_ui_html(
            openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js", swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png", oauth2_redirect_url=root + oauth2_redirect,
            init_oauth=app.swagger_ui_init_oauth, swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(oauth2_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=root + app.openapi_url, title=f"{app.title} - ReDoc", redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png", with_google_fonts=False,
        )
