"""/docs and /redoc work offline, and the OpenAPI schema documents the errors the service really sends.

The schema tests need no engine (the app's lifespan does not run); the browser tests run the real server
on loopback in a headless Chromium that may reach nothing else, and skip without Playwright or Chromium.
"""
from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest
from conftest import ROOT, headless_chromium, running_server
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings

LIBRETRANSLATE = "LibreTranslate compatible"
ERROR_REF = "#/components/schemas/Error"
LIBRETRANSLATE_ERROR_REF = "#/components/schemas/LibreTranslateError"


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(Settings(models_dir="/nonexistent")))  # not entered: no engine started


@pytest.fixture(scope="module")
def spec(client) -> dict:
    return client.get("/openapi.json").json()


def operations(spec: dict):
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            yield method, path, op


def error_responses(op: dict) -> dict[str, dict]:
    return {status: r for status, r in op["responses"].items() if status[0] in "45"}


# ---------------------------------------------------------------------------------------- pages and assets


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_doc_pages_load_nothing_from_the_internet(client, page):
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert assets and not [a for a in assets if re.match(r"(https?:)?//", a)], assets
    assert "fonts.googleapis" not in r.text and "cdn." not in r.text
    for asset in assets:  # every one is served here
        response = client.get(asset)
        assert response.status_code == 200 and len(response.content) > 1000, asset
    assert "/openapi.json" in r.text


def test_swagger_oauth2_redirect_page_is_served(client):
    assert client.get("/docs/oauth2-redirect").status_code == 200


def test_doc_pages_are_not_in_the_schema(spec):
    assert not [p for p in spec["paths"] if p.startswith(("/docs", "/redoc"))]


# ---------------------------------------------------------------------------------------- the schema's errors


def test_no_fastapi_validation_error_shape_is_left(spec):
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert '"detail"' not in json.dumps(spec)


def test_error_schemas_are_the_services_shapes(spec):
    schemas = spec["components"]["schemas"]
    error = schemas["Error"]["properties"]["error"]
    assert error["type"] == "object" and set(error["properties"]) == set(error["required"]) == {"type", "message", "param"}
    assert {"type": "null"} in error["properties"]["param"]["anyOf"]
    assert schemas["LibreTranslateError"]["properties"] == {"error": {"type": "string", "description": schemas["LibreTranslateError"]["properties"]["error"]["description"]}}


def test_every_error_response_uses_the_shape_of_its_route(spec):
    for method, path, op in operations(spec):
        ref = LIBRETRANSLATE_ERROR_REF if LIBRETRANSLATE in op["tags"] else ERROR_REF
        for status, response in error_responses(op).items():
            media = response["content"]["application/json"]
            assert media["schema"] == {"$ref": ref}, (method, path, status)
            assert response["description"], (method, path, status)
            examples = [media["example"]] if "example" in media else [e["value"] for e in media["examples"].values()]
            for example in examples:
                if ref == ERROR_REF:
                    assert set(example["error"]) == {"type", "message", "param"}, (method, path, status)
                else:
                    assert isinstance(example["error"], str), (method, path, status)


def test_every_422_is_ours(spec):
    found = 0
    for method, path, op in operations(spec):
        if "422" in op["responses"]:
            found += 1
            assert op["responses"]["422"]["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}, (method, path)
            assert "Validation Error" != op["responses"]["422"]["description"]
    assert found >= 2


def test_each_operation_lists_the_statuses_it_can_answer(spec):
    paths = spec["paths"]
    for path in ("/v1/translate", "/v1/attention"):
        assert {"400", "401", "413", "422", "429", "500", "503", "504"} <= set(paths[path]["post"]["responses"]), path
    assert {"401", "429"} <= set(paths["/v1/models"]["get"]["responses"])
    assert {"400", "403", "413", "429", "503", "504"} <= set(paths["/translate"]["post"]["responses"])
    assert "503" in paths["/health/ready"]["get"]["responses"] and "401" in paths["/metrics"]["get"]["responses"]
    assert not error_responses(paths["/health"]["get"])


def test_retry_after_and_authenticate_headers_are_documented(spec):
    responses = spec["paths"]["/v1/translate"]["post"]["responses"]
    assert "Retry-After" in responses["503"]["headers"] and "Retry-After" in responses["429"]["headers"]
    assert "WWW-Authenticate" in responses["401"]["headers"]
    assert "Retry-After" in spec["paths"]["/health/ready"]["get"]["responses"]["503"]["headers"]
    examples = responses["503"]["content"]["application/json"]["examples"]
    assert {"not_ready", "overloaded", "engine_unavailable"} <= set(examples)


def test_libretranslate_operations_use_their_own_error_shape(spec):
    tagged = [(m, p, op) for m, p, op in operations(spec) if LIBRETRANSLATE in op["tags"]]
    assert {p for _, p, _ in tagged} >= {"/translate", "/languages"}
    translate = spec["paths"]["/translate"]["post"]["responses"]
    assert translate["400"]["content"]["application/json"]["schema"] == {"$ref": LIBRETRANSLATE_ERROR_REF}
    for method, path, op in tagged:
        for response in error_responses(op).values():
            assert "LibreTranslateError" in json.dumps(response) and '"#/components/schemas/Error"' not in json.dumps(response)
        # its routes say 403 for a key (ours: 401) and 400 for a bad parameter (ours: 422)
        assert not {"401", "422"} & set(op["responses"]), (method, path)
        assert "WWW-Authenticate" not in json.dumps(op["responses"]), (method, path)


def test_a_real_error_matches_the_documented_one(client, spec):
    r = client.post("/v1/translate", json={"source": "de"})  # no text: refused by validation, before any engine work
    assert r.status_code == 422
    documented = spec["components"]["schemas"]["Error"]
    assert set(r.json()) == set(documented["required"])
    assert set(r.json()["error"]) == set(documented["properties"]["error"]["required"])


def test_a_real_libretranslate_error_matches_the_documented_one(client, spec):
    r = client.post("/translate", json={"source": "de", "target": "en"})  # no q
    assert r.status_code == 400 and "400" in spec["paths"]["/translate"]["post"]["responses"]
    assert list(r.json()) == ["error"] and isinstance(r.json()["error"], str)


def test_the_schema_is_built_once(client):
    app = client.app
    assert app.openapi() is app.openapi()


# ---------------------------------------------------------------------------------------- in a browser, offline


ARTIFACTS = ROOT / "test-artifacts"
# ReDoc's sidebar credit always asks for this image, and hides it when it does not load: decoration only
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def server(browser, models_dir):
    with running_server(models_dir) as base:
        yield base


@pytest.fixture
def offline_page(browser, server):
    """A page that may reach the server and nothing else; `page.blocked` lists what it tried."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    own = urlsplit(server).netloc
    blocked: list[str] = []

    def only_the_server(route):
        if urlsplit(route.request.url).netloc == own:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_server)
    page = context.new_page()
    page.blocked = blocked
    yield page
    context.close()


def test_swagger_ui_renders_offline(offline_page, server):
    page = offline_page
    page.goto(server + "/docs")
    page.wait_for_selector(".opblock:has-text('/v1/translate')", timeout=20_000)
    paths = page.eval_on_selector_all(".opblock .opblock-summary-path", "xs => xs.map(x => x.textContent.trim())")
    assert {"/v1/translate", "/v1/attention", "/translate", "/health/ready"} <= {p.replace("\u200b", "") for p in paths}
    # open POST /v1/translate: its documented error statuses are on the page
    page.click(".opblock-post:has(.opblock-summary-path[data-path='/v1/translate']) .opblock-summary")
    page.wait_for_selector(".opblock.is-open .responses-table")
    statuses = page.eval_on_selector_all(".opblock.is-open .responses-table td.response-col_status",
                                         "xs => xs.map(x => x.textContent.trim())")
    assert {"400", "413", "422", "503", "504"} <= {s[:3] for s in statuses}
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-swagger.png"))
    assert page.blocked == []


def test_redoc_renders_offline(offline_page, server):
    page = offline_page
    page.goto(server + "/redoc")
    page.wait_for_selector("h2:has-text('Attention')", timeout=20_000)  # POST /v1/attention's summary
    assert page.locator("text=LibreTranslate compatible").count() >= 1
    assert page.locator("text=Error").count() >= 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-redoc.png"))
    assert [url for url in page.blocked if url != REDOC_LOGO] == []
    assert page.locator(f"img[src='{REDOC_LOGO}']").count() == 0  # gone, not a broken image
