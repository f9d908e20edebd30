"""LibreTranslate's API (nmt_serve/service/routers/libretranslate.py) on the real server, and LibreTranslate's own
Python clients against it: libretranslatepy, libretranslate-aio and deep-translator.

The models are tiny and random: translations are nonsense, but well-formed; what is checked is the API.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error

import httpx
import pytest
from conftest import distinct, running_server
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.file_store import FileStore
from nmt_serve.service.settings import Settings

GERMAN = "Ein Hund rennt über die Wiese."
GERMAN_2 = "Zwei Kinder spielen im Garten hinter dem Haus."
ENGLISH = "Two children are playing in the garden behind the house."
SPANISH = "El perro corre por el parque mientras los niños juegan con la pelota."
CHAR_LIMIT = 400


@pytest.fixture(scope="module")
def base(models_dir):
    with running_server(models_dir, "--max-chars-per-text", str(CHAR_LIMIT)) as url:
        yield url


@pytest.fixture(scope="module")
def secured(models_dir):
    with running_server(models_dir, "--api-keys", "key-one") as url:
        yield url


@pytest.fixture(scope="module")
def http():
    with httpx.Client(timeout=60) as client:
        yield client


def error_of(response: httpx.Response, status: int) -> str:
    """LibreTranslate's error shape: {"error": "message"} and nothing else."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    return body["error"]


# ---------------------------------------------------------------------------------------- parameters


def test_parameters_from_the_query_a_form_or_json_alike(base, http):
    params = {"q": GERMAN, "source": "de", "target": "en"}
    answers = [
        http.post(base + "/translate", params=params),  # what deep-translator sends: no body at all
        http.post(base + "/translate", data=params),  # urlencoded form (libretranslatepy)
        http.post(base + "/translate", files={k: (None, v) for k, v in params.items()}),  # multipart form
        http.post(base + "/translate", json=params),
    ]
    for r in answers:
        assert r.status_code == 200, r.text
    texts = {r.json()["translatedText"] for r in answers}
    assert len(texts) == 1 and isinstance(texts.pop(), str)
    # the body wins over the query string
    mixed = http.post(base + "/translate", params={"source": "en", "target": "de"}, json=params)
    assert mixed.json() == answers[0].json()


def test_line_breaks_from_a_query_string_or_a_form_are_line_feeds(base, http):
    # upstream reads every non-JSON q through splitlines: CRLF and a lone CR come out as LF
    text = f"{GERMAN}\r\n{GERMAN_2}\r{GERMAN}"
    for r in (http.post(base + "/translate", params={"q": text, "source": "de", "target": "en"}),
              http.post(base + "/translate", data={"q": text, "source": "de", "target": "en"})):
        out = r.json()["translatedText"]
        assert "\r" not in out and out.count("\n") == 2, out
    assert http.post(base + "/translate", json={"q": text, "source": "de", "target": "en"}).json()["translatedText"].count("\r") == 2


def test_language_codes_in_any_case(base, http):
    # as upstream, which lowercases them
    lower = http.post(base + "/translate", json={"q": GERMAN, "source": "de", "target": "en"}).json()
    assert http.post(base + "/translate", json={"q": GERMAN, "source": "DE", "target": "En"}).json() == lower
    assert http.post(base + "/translate", json={"q": GERMAN, "source": "DE", "target": "de"}).json() == {"translatedText": GERMAN}
    assert http.post(base + "/v1/translate", json={"text": GERMAN, "source": "De", "target": "EN"}).status_code == 200
    assert upload(http, base, "a.txt", GERMAN.encode(), source="DE", target="EN").status_code == 200
    assert error_of(http.post(base + "/translate", json={"q": GERMAN, "source": "DE", "target": "XX"}), 400) == "XX is not supported"


def test_a_repeated_q_is_a_list_of_texts(base, http):
    for r in (http.post(base + "/translate", params=[("q", GERMAN), ("q", GERMAN_2), ("source", "de"), ("target", "en")]),
              http.post(base + "/translate", data={"q": [GERMAN, GERMAN_2], "source": "de", "target": "en"}),
              http.post(base + "/translate", json={"q": [GERMAN, GERMAN_2], "source": "de", "target": "en"})):
        assert r.status_code == 200, r.text
        assert len(r.json()["translatedText"]) == 2


def test_unknown_parameters_are_ignored(base, http):
    assert http.post(base + "/translate", json={"q": GERMAN, "source": "de", "target": "en", "temperature": 0.7}).status_code == 200


# ---------------------------------------------------------------------------------------- translate


def test_alternatives_one_text_and_a_list(base, http):
    one = http.post(base + "/translate", json={"q": GERMAN, "source": "de", "target": "en", "alternatives": 2}).json()
    assert isinstance(one["translatedText"], str) and len(one["alternatives"]) <= 2
    assert one["translatedText"] not in one["alternatives"]
    assert "detectedLanguage" not in one  # only with source auto
    many = http.post(base + "/translate", data={"q": [GERMAN, GERMAN_2], "source": "de", "target": "en", "alternatives": "1"}).json()
    assert len(many["translatedText"]) == 2 and len(many["alternatives"]) == 2 and all(len(a) <= 1 for a in many["alternatives"])
    plain = http.post(base + "/translate", json={"q": GERMAN, "source": "de", "target": "en"}).json()
    assert set(plain) == {"translatedText"}
    # null, as the published schema allows, and a form's empty field: none
    assert http.post(base + "/translate", json={"q": GERMAN, "source": "de", "target": "en", "alternatives": None}).json() == plain
    assert http.post(base + "/translate", data={"q": GERMAN, "source": "de", "target": "en", "alternatives": ""}).json() == plain


def test_source_auto_detects_the_language(base, http):
    r = http.post(base + "/translate", json={"q": GERMAN, "source": "auto", "target": "en"})
    assert r.status_code == 200, r.text
    detected = r.json()["detectedLanguage"]
    assert detected["language"] == "de" and 50 < detected["confidence"] <= 100
    # a list: one detection per text, as upstream answers
    r = http.post(base + "/translate", json={"q": [GERMAN, GERMAN_2], "source": "auto", "target": "en"}).json()
    assert [d["language"] for d in r["detectedLanguage"]] == ["de", "de"] and len(r["translatedText"]) == 2
    r = http.post(base + "/translate", data={"q": ENGLISH, "source": "auto", "target": "de"}).json()
    assert r["detectedLanguage"]["language"] == "en"


def test_source_auto_on_a_language_no_model_serves_falls_back_to_english(base, http):
    """As upstream: English at confidence 0 (our own /v1/translate refuses it, naming the language)."""
    r = http.post(base + "/translate", json={"q": SPANISH, "source": "auto", "target": "en"})
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": SPANISH, "detectedLanguage": {"confidence": 0.0, "language": "en"}}


def test_html_keeps_the_markup(base, http):
    html = "<p>Ein <b>Hund</b> rennt über die <a href='https://example.org/'>Wiese</a>.</p>"
    r = http.post(base + "/translate", json={"q": html, "source": "de", "target": "en", "format": "html"})
    assert r.status_code == 200, r.text
    out = r.json()["translatedText"]
    assert out.startswith("<p>") and out.endswith("</p>") and "<b>" in out and "</b>" in out
    assert 'href="https://example.org/"' in out or "href='https://example.org/'" in out


# ---------------------------------------------------------------------------------------- detect, languages, settings


def test_detect(base, http):
    for r in (http.post(base + "/detect", data={"q": GERMAN}), http.post(base + "/detect", json={"q": GERMAN}),
              http.post(base + "/detect", params={"q": GERMAN})):
        assert r.status_code == 200, r.text
        found = r.json()
        assert found[0]["language"] == "de" and found[0]["confidence"] > 50
        assert [d["confidence"] for d in found] == sorted((d["confidence"] for d in found), reverse=True)
        assert sum(d["confidence"] for d in found) == pytest.approx(100, abs=0.1)
    assert http.post(base + "/detect", data={"q": ENGLISH}).json()[0]["language"] == "en"
    # served languages only, as upstream
    assert {d["language"] for d in http.post(base + "/detect", json={"q": SPANISH}).json()} <= {"de", "en"}
    # nothing to go by: upstream's answer
    assert http.post(base + "/detect", json={"q": "12345"}).json() == [{"confidence": 0.0, "language": "en"}]
    assert error_of(http.post(base + "/detect", json={}), 400) == "Invalid request: missing q parameter"


def test_languages(base, http):
    langs = http.get(base + "/languages").json()
    assert {"code": "de", "name": "German", "targets": ["en"]} in langs
    assert {"code": "en", "name": "English", "targets": ["de"]} in langs


def test_frontend_settings(base, http):
    settings = http.get(base + "/frontend/settings").json()
    assert settings["charLimit"] == CHAR_LIMIT and settings["keyRequired"] is False and settings["apiKeys"] is False
    assert settings["suggestions"] is False and isinstance(settings["frontendTimeout"], int)
    assert settings["supportedFilesFormat"] == [".txt", ".html", ".htm", ".docx", ".pptx", ".xlsx", ".odt", ".odp", ".epub", ".srt", ".vtt", ".po", ".xlf", ".xliff", ".md", ".markdown"]
    assert settings["language"] == {"source": {"code": "auto", "name": "Auto Detect"}, "target": {"code": "en", "name": "English"}}


# ---------------------------------------------------------------------------------------- files


def upload(http, base, name: str, content: bytes, source: str = "de", target: str = "en", **extra) -> httpx.Response:
    return http.post(base + "/translate_file", data={"source": source, "target": target, **extra}, files={"file": (name, content)})


def test_translate_a_text_file_and_download_it(base, http):
    text = f"{GERMAN}\n\n{GERMAN_2}\n"
    r = upload(http, base, "bericht.txt", text.encode())
    assert r.status_code == 200, r.text
    url = r.json()["translatedFileUrl"]
    assert url.startswith(base + "/download_file/") and url.endswith(".bericht_en.txt")
    for _ in range(2):  # not single-use
        download = http.get(url)
        assert download.status_code == 200
        assert download.headers["content-type"] == "text/plain; charset=utf-8"
        assert 'filename="bericht_en.txt"' in download.headers["content-disposition"]
        assert download.headers["content-disposition"].startswith("attachment")
        translated = download.content.decode("utf-8")
        assert translated.strip() and "\n\n" in translated  # the paragraphs kept apart


def test_translate_an_html_file(base, http):
    page = f"<!DOCTYPE html>\n<html><head><title>Titel</title></head><body><h1>Überschrift</h1><p>{GERMAN}</p></body></html>"
    for name in ("seite.html", "seite.htm"):
        r = upload(http, base, name, page.encode())
        assert r.status_code == 200, r.text
        download = http.get(r.json()["translatedFileUrl"])
        assert download.headers["content-type"] == "text/html; charset=utf-8"
        assert f'filename="{name.replace("seite", "seite_en")}"' in download.headers["content-disposition"]
        out = download.text
        assert out.startswith("<!DOCTYPE html>") and "<h1>" in out and "</body></html>" in out and GERMAN not in out


def test_file_names_beyond_ascii(base, http):
    r = upload(http, base, "Überblick.txt", GERMAN.encode())
    assert r.status_code == 200, r.text
    disposition = http.get(r.json()["translatedFileUrl"]).headers["content-disposition"]
    assert "filename*=UTF-8''%C3%9Cberblick_en.txt" in disposition


def test_a_file_in_no_served_language_with_auto_is_taken_as_english(base, http):
    # as /translate answers it (upstream's fallback), not a 400: nothing to detect comes back as it is, a
    # language no model serves is taken as English
    numbers = upload(http, base, "zahlen.txt", b"12345\n67890\n", source="auto", target="de")
    assert numbers.status_code == 200, numbers.text
    assert http.get(numbers.json()["translatedFileUrl"]).content == b"12345\n67890\n"
    spanish = upload(http, base, "es.txt", (SPANISH + "\n").encode(), source="auto", target="de")
    assert spanish.status_code == 200, spanish.text
    assert http.get(spanish.json()["translatedFileUrl"]).content.decode() != SPANISH + "\n"  # translated, from English


def test_file_errors(base, http):
    assert "supported: .txt, .html, .htm" in error_of(upload(http, base, "scan.pdf", b"%PDF-1.4"), 400)
    # a text file or a web page in its language's code page is read in it (a page that declares its encoding in
    # that one: text/text_encoding.py); bytes that are no text in any are refused
    assert upload(http, base, "alt.html", "<p>Größe</p>".encode("latin-1")).status_code == 200
    assert upload(http, base, "alt.txt", "Größe".encode("latin-1")).status_code == 200
    assert "cannot be read" in error_of(upload(http, base, "bin.html", bytes(range(256)) * 4), 400)
    message = error_of(upload(http, base, "lang.txt", ("Hallo. " * 60).encode()), 413)
    assert str(CHAR_LIMIT) in message and "max_chars_per_text" in message
    assert error_of(http.post(base + "/translate_file", data={"source": "de", "target": "en"}), 400) == "Invalid request: missing file parameter"
    assert error_of(upload(http, base, "a.txt", b"Hallo", target="xx"), 400) == "xx is not supported"
    assert error_of(http.get(base + "/download_file/0123456789abcdef0123456789abcdef.a.txt"), 404)
    assert http.get(base + "/download_file/..%2F..%2Fetc%2Fpasswd").status_code == 404


def test_downloads_work_from_any_worker(models_dir, http):
    """With several API workers the download may reach another worker than the upload: the files are
    kept where all of them see them."""
    with running_server(models_dir, "--workers", "2", timeout=120) as url:
        for i in range(8):
            r = upload(http, url, f"datei{i}.txt", GERMAN.encode())
            assert r.status_code == 200, r.text
            with httpx.Client(timeout=60) as fresh:  # a new connection: any worker may take it
                assert fresh.get(r.json()["translatedFileUrl"]).status_code == 200


def test_file_store_expiry_cap_and_ids(tmp_path):
    store = FileStore(tmp_path / "files", ttl_s=60, max_bytes=40)  # each file is its name, a newline and the bytes
    first = store.put("a.txt", b"0123456789")
    assert store.get(first).name == "a.txt" and store.get(first).data == b"0123456789"
    assert store.get(first).media_type == "text/plain; charset=utf-8"
    second = store.put("b.html", b"0123456789")
    os.utime(tmp_path / "files" / first, (time.time() - 10, time.time() - 10))  # the older one
    third = store.put("c.txt", b"0123456789")  # over 40 bytes with all three: the oldest goes
    assert store.get(first) is None and store.get(second) is not None and store.get(third) is not None
    old = time.time() - 61
    os.utime(tmp_path / "files" / second, (old, old))
    assert store.get(second) is None  # expired
    for bad in ("../files", "x" * 32, third.upper(), third + "/"):
        assert store.get(bad) is None


# ---------------------------------------------------------------------------------------- errors


def test_errors_have_libretranslates_shape_and_statuses(base, http):
    translate = base + "/translate"
    assert error_of(http.post(translate, json={"source": "de", "target": "en"}), 400) == "Invalid request: missing q parameter"
    assert error_of(http.post(translate, data={"q": GERMAN, "target": "en"}), 400) == "Invalid request: missing source parameter"
    assert error_of(http.post(translate, json={"q": GERMAN, "source": "xx", "target": "en"}), 400) == "xx is not supported"
    assert error_of(http.post(translate, json={"q": GERMAN, "source": "de", "target": "xx"}), 400) == "xx is not supported"
    assert error_of(http.post(translate, json={"q": GERMAN, "source": "de", "target": "en", "format": "xml"}), 400) == "xml format is not supported"
    assert "not a number" in error_of(http.post(translate, data={"q": GERMAN, "source": "de", "target": "en", "alternatives": "a few"}), 400)
    assert "<= 7" in error_of(http.post(translate, json={"q": GERMAN, "source": "de", "target": "en", "alternatives": 50}), 400)
    assert error_of(http.post(translate, content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert error_of(http.post(translate, json=[GERMAN]), 400)
    assert str(CHAR_LIMIT) in error_of(http.post(translate, json={"q": "x" * (CHAR_LIMIT + 1), "source": "de", "target": "en"}), 413)
    assert error_of(http.post(translate, json={"q": GERMAN, "source": "de", "target": "en"}, headers={"X-Request-Timeout": "soon"}), 400)
    slow = {"q": distinct(GERMAN * 8, 32), "source": "de", "target": "en", "alternatives": 7}
    assert "did not finish" in error_of(http.post(translate, json=slow, headers={"X-Request-Timeout": "0.05"}), 504)
    assert error_of(http.post(base + "/suggest", data={"q": "a", "s": "b", "source": "de", "target": "en"}), 403)
    # routing's own answers on these paths too: a method a route does not take, a download that matches nothing
    assert error_of(http.get(translate), 405) == "Method Not Allowed"
    assert error_of(http.post(base + "/languages"), 405)
    assert error_of(http.get(base + "/download_file/..%2F..%2Fetc%2Fpasswd"), 404)
    # our own endpoints keep our shape
    r = http.post(base + "/v1/translate", json={"source": "de"})
    assert r.status_code == 422 and set(r.json()["error"]) == {"type", "message", "param"}
    assert set(http.get(base + "/v1/nowhere").json()["error"]) == {"type", "message", "param"}


def test_text_that_is_not_valid_unicode_is_400_not_500(base, http):
    # JSON's escapes carry half a surrogate pair, which no UTF-8 can encode; the request bodies are
    # written by json.dumps (ASCII escapes), as a client may send them
    broken = "Ein Hund \ud83d rennt."
    for path, body, param in (("/translate", {"q": broken, "source": "de", "target": "en"}, "q"),
                              ("/translate", {"q": [GERMAN, broken], "source": "auto", "target": "en"}, "q"),
                              ("/translate", {"q": broken, "source": "de", "target": "de"}, "q"),
                              ("/translate", {"q": GERMAN, "source": "\udc00", "target": "en"}, "source"),
                              ("/detect", {"q": broken}, "q")):
        r = http.post(base + path, content=json.dumps(body), headers={"content-type": "application/json"})
        assert error_of(r, 400).startswith(f"Invalid request: {param} is not valid Unicode"), body
    # an unknown parameter is ignored, whatever its name; the connection still serves
    r = http.post(base + "/translate", content=json.dumps({"q": GERMAN, "source": "de", "target": "en", "\ud83d": 1}),
                  headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_api_keys(secured, http):
    body = {"q": GERMAN, "source": "de", "target": "en"}
    assert "API key" in error_of(http.post(secured + "/translate", json=body), 403)
    assert error_of(http.post(secured + "/translate", json={**body, "api_key": "wrong"}), 403) == "Invalid API key"
    # the api_key parameter wins over an Authorization header (a proxy's), which upstream does not read at all
    wrong_header = {"Authorization": "Bearer wrong"}
    assert http.post(secured + "/translate", json={**body, "api_key": "key-one"}, headers=wrong_header).status_code == 200
    assert error_of(http.post(secured + "/translate", json=body, headers=wrong_header), 403) == "Invalid API key"
    for r in (http.post(secured + "/translate", json={**body, "api_key": "key-one"}),
              http.post(secured + "/translate", data={**body, "api_key": "key-one"}),
              http.post(secured + "/translate", params={**body, "api_key": "key-one"}),
              http.post(secured + "/translate", json=body, headers={"Authorization": "Bearer key-one"})):
        assert r.status_code == 200, r.text
    assert error_of(http.post(secured + "/detect", data={"q": GERMAN}), 403)
    assert error_of(upload(http, secured, "a.txt", GERMAN.encode()), 403)
    assert upload(http, secured, "a.txt", GERMAN.encode(), api_key="key-one").status_code == 200
    # open, as upstream: the languages and the front-end's settings
    assert http.get(secured + "/languages").status_code == 200
    settings = http.get(secured + "/frontend/settings").json()
    assert settings["apiKeys"] is True and settings["keyRequired"] is True


def test_rate_limit_and_overload_in_libretranslates_shape(models_dir, monkeypatch):
    from nmt_serve.service.engine_client import EngineClient

    with TestClient(create_app(Settings(models_dir=str(models_dir), device="cpu", rate_limit_per_minute=2, max_body_bytes=4000)),
                    raise_server_exceptions=False) as c:
        wait_ready(c)
        body = {"q": GERMAN, "source": "de", "target": "en"}
        assert c.post("/translate", json=body).status_code == 200
        assert c.post("/translate", json=body).status_code == 200
        limited = c.post("/translate", json=body)
        assert error_of(limited, 429) and int(limited.headers["retry-after"]) >= 1

        def chunks():  # streamed, no Content-Length: the limit trips while the handler reads the body
            for _ in range(10):
                yield b"q=" + b"x" * 1000
        assert "4000 bytes" in error_of(c.post("/detect", content=chunks(), headers={"content-type": "application/x-www-form-urlencoded"}), 413)
        # announced by Content-Length: refused before routing, in the same shape
        assert "4000 bytes" in error_of(c.post("/translate", json={"q": "x" * 5000, "source": "de", "target": "en"}), 413)

    monkeypatch.setattr(EngineClient, "backlog_seconds", lambda self: 100.0)
    with TestClient(create_app(Settings(models_dir=str(models_dir), device="cpu")), raise_server_exceptions=False) as c:
        wait_ready(c)
        refused = c.post("/translate", json={"q": GERMAN, "source": "de", "target": "en"})
        assert error_of(refused, 503) and refused.headers["retry-after"] == "100"

        def broken(*args, **kwargs):
            raise RuntimeError("/secret/path/model.safetensors is corrupt")
        monkeypatch.setattr("nmt_serve.service.routers.libretranslate.translate_texts", broken)
        failed = c.post("/translate", json={"q": GERMAN, "source": "de", "target": "en"})
        assert error_of(failed, 500) == "the server failed to process this request"


def wait_ready(client: TestClient, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while client.get("/health/ready").status_code != 200:
        assert time.time() < deadline, "not ready"
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------- real clients


def test_libretranslatepy(base):
    from libretranslatepy import LibreTranslateAPI

    lt = LibreTranslateAPI(base)
    assert isinstance(lt.translate(GERMAN, "de", "en"), str)
    assert isinstance(lt.translate(GERMAN, "auto", "en"), str)
    assert isinstance(lt.translate(ENGLISH, "en", "de"), str)
    assert {"code": "de", "name": "German", "targets": ["en"]} in lt.languages()
    found = lt.detect(GERMAN)
    assert found[0]["language"] == "de" and found[0]["confidence"] > 50


def test_libretranslatepy_with_keys(secured):
    from libretranslatepy import LibreTranslateAPI

    assert isinstance(LibreTranslateAPI(secured, api_key="key-one").translate(GERMAN, "de", "en"), str)
    with pytest.raises(urllib.error.HTTPError) as refused:
        LibreTranslateAPI(secured).translate(GERMAN, "de", "en")
    assert refused.value.code == 403 and "error" in json.loads(refused.value.read())


def test_libretranslate_aio(base, http, tmp_path):
    from libretranslate_aio.client import LibreTranslate
    from libretranslate_aio.exceptions import BadRequestError, ForbiddenError

    with LibreTranslate(base) as lt:
        one = lt.translate(GERMAN, "de", "en")
        assert isinstance(one.translated_text, str) and one.detected_language is None
        many = lt.translate([GERMAN, GERMAN_2], "de", "en", alternatives=2)
        assert len(many.translated_text) == 2 and len(many.alternatives) == 2
        auto = lt.translate(GERMAN, "auto", "en")
        assert auto.detected_language.language == "de" and auto.detected_language.confidence > 50
        autos = lt.translate([GERMAN, GERMAN_2], "auto", "en")
        assert [d.language for d in autos.detected_language] == ["de", "de"]
        html = lt.translate("<p>Ein <i>Hund</i> rennt.</p>", "de", "en", format="html").translated_text
        assert html.startswith("<p>") and "<i>" in html and html.endswith("</p>")
        assert lt.detect(GERMAN)[0].language == "de"
        assert {(lang.code, tuple(lang.targets)) for lang in lt.languages()} == {("de", ("en",)), ("en", ("de",))}
        settings = lt.frontend_settings()
        assert settings.char_limit == CHAR_LIMIT and settings.supported_files_format == [".txt", ".html", ".htm", ".docx", ".pptx", ".xlsx", ".odt", ".odp", ".epub", ".srt", ".vtt", ".po", ".xlf", ".xliff", ".md", ".markdown"]
        assert settings.language.source.code == "auto" and not settings.key_required
        assert lt.health() is True
        path = tmp_path / "notiz.txt"
        path.write_text(f"{GERMAN}\n{GERMAN_2}\n", encoding="utf-8")
        url = lt.translate_file(path, "de", "en").translated_file_url
        assert url.endswith("notiz_en.txt") and http.get(url).status_code == 200
        with pytest.raises(BadRequestError, match="xx is not supported"):
            lt.translate(GERMAN, "xx", "en")
        with pytest.raises(ForbiddenError):
            lt.suggest("Hund", "dog", "de", "en")


def test_deep_translator(base, secured):
    from deep_translator import LibreTranslator
    from deep_translator.exceptions import AuthorizationException

    # it wants a key even where none is needed, and posts its parameters in the query string
    auto = LibreTranslator(source="auto", target="en", api_key="unused", use_free_api=False, custom_url=base + "/")
    assert isinstance(auto.translate(GERMAN), str) and auto.translate(GERMAN)
    named = LibreTranslator(source="German", target="English", api_key="unused", use_free_api=False, custom_url=base + "/")
    assert isinstance(named.translate(GERMAN), str)
    assert len(named.translate_batch([GERMAN, GERMAN_2])) == 2
    back = LibreTranslator(source="en", target="de", api_key="unused", use_free_api=False, custom_url=base + "/")
    assert isinstance(back.translate(ENGLISH), str)
    keyed = LibreTranslator(source="de", target="en", api_key="key-one", use_free_api=False, custom_url=secured + "/")
    assert isinstance(keyed.translate(GERMAN), str)
    with pytest.raises(AuthorizationException):
        LibreTranslator(source="de", target="en", api_key="wrong", use_free_api=False, custom_url=secured + "/").translate(GERMAN)
