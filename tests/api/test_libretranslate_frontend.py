"""LibreTranslate's own web page (its index.html and app.js, v1.9.6) against this server, written as the API
calls the page makes, since the page itself cannot be vendored here: every flow a user clicks must answer 200.

What app.js sends: GET /frontend/settings and GET /languages on load; POST /translate as multipart form data
(FormData) with q, source, target, format ("text"/"html"), alternatives=3, api_key (empty without keys) and a
"secret" field; Auto Detect is source "auto" and reads detectedLanguage {language, confidence}; swap
exchanges source and target when the target's `targets` hold the source; a link's ?source=&target=&q= picks
the languages (when /languages lists them) and translates q; a file goes to POST /translate_file (file,
source, target, api_key, secret), then the page follows translatedFileUrl.

The models are tiny and random: what is checked is what the page reads, not the translations.
"""
from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from conftest import running_server

GERMAN = "Ein Hund rennt über die Wiese."
ENGLISH = "Two children are playing in the garden behind the house."
SPANISH = "¿Dónde está la biblioteca? Necesito un libro para mi clase de historia."
KEY = "page-key"


@pytest.fixture(scope="module")
def base(models_dir):
    with running_server(models_dir) as url:
        yield url


@pytest.fixture(scope="module")
def keyed(models_dir):
    with running_server(models_dir, "--api-keys", KEY) as url:
        yield url


@pytest.fixture(scope="module")
def http():
    with httpx.Client(timeout=60) as client:
        yield client


def form(fields: dict) -> dict:
    """FormData as the browser sends it: multipart, every value a string."""
    return {k: (None, str(v)) for k, v in fields.items()}


def page_translate(http, base, q: str, source: str, target: str, html: bool = False, api_key: str = "") -> dict:
    """handleInput(): the request app.js makes after typing, and what it reads from the answer."""
    r = http.post(base + "/translate", files=form({"q": q, "source": source, "target": target,
                                                   "format": "html" if html else "text", "alternatives": 3,
                                                   "api_key": api_key, "secret": "bogus"}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["translatedText"], str)  # the page shows an error card unless translatedText is there
    if source == "auto":
        detected = body["detectedLanguage"]
        assert isinstance(detected["language"], str) and 0 <= detected["confidence"] <= 100
    assert isinstance(body.get("alternatives", []), list)
    return body


def page_load(http, base) -> tuple[dict, list[dict]]:
    settings = http.get(base + "/frontend/settings")
    languages = http.get(base + "/languages")
    assert settings.status_code == 200 and languages.status_code == 200
    return settings.json(), languages.json()


def test_page_loads_settings_and_languages(base, http):
    settings, langs = page_load(http, base)
    # what mounted() reads
    assert settings["language"]["source"]["code"] == "auto"
    assert settings["language"]["target"]["code"] in {l["code"] for l in langs}
    assert isinstance(settings["charLimit"], int) and isinstance(settings["frontendTimeout"], int)
    assert settings["filesTranslation"] is True and ".txt" in settings["supportedFilesFormat"]
    assert settings["suggestions"] is False and settings["keyRequired"] is False
    # what handleLangsResponse() reads: a non-empty list of {code, name, targets}
    assert langs and all(l["code"] and l["name"] and isinstance(l["targets"], list) for l in langs)


def test_translate_text_and_html(base, http):
    body = page_translate(http, base, GERMAN, "de", "en")
    assert body["translatedText"]
    html = page_translate(http, base, "<p>Ein <b>Hund</b> rennt.</p>", "de", "en", html=True)["translatedText"]
    assert html.startswith("<p>") and "<b>" in html and html.endswith("</p>")


def test_auto_detect(base, http):
    body = page_translate(http, base, GERMAN, "auto", "en")
    assert body["detectedLanguage"]["language"] == "de" and body["detectedLanguage"]["confidence"] > 50
    english = page_translate(http, base, ENGLISH, "auto", "de")
    assert english["detectedLanguage"]["language"] == "en"


def test_auto_detect_with_nothing_to_detect(base, http):
    """Upstream: English at confidence 0, and the text back (ours said 400 "could not be detected")."""
    for target in ("en", "de"):
        body = page_translate(http, base, "12345", "auto", target)
        assert body["detectedLanguage"] == {"confidence": 0.0, "language": "en"}
        assert body["translatedText"] == "12345"


def test_auto_detect_on_a_language_no_model_serves(base, http):
    """Upstream: English at confidence 0 (ours said 400 "looks like Spanish")."""
    body = page_translate(http, base, SPANISH, "auto", "en")
    assert body["detectedLanguage"] == {"confidence": 0.0, "language": "en"}
    assert body["translatedText"] == SPANISH  # English to English: the text as it is
    body = page_translate(http, base, SPANISH, "auto", "de")  # translated as English, as upstream does
    assert body["detectedLanguage"] == {"confidence": 0.0, "language": "en"}


def test_source_equal_to_target(base, http):
    """The page keeps the old target when the source changes to it: upstream gives the text back."""
    for lang, text in (("en", ENGLISH), ("de", GERMAN)):
        body = page_translate(http, base, text, lang, lang)
        assert body["translatedText"] == text and body.get("alternatives", []) == []
    html = "<p>Ein <b>Hund</b> &amp; eine Katze.</p>"
    assert page_translate(http, base, html, "de", "de", html=True)["translatedText"] == html


def test_swap(base, http):
    _, langs = page_load(http, base)
    source, target = "de", "en"
    first = page_translate(http, base, GERMAN, source, target)["translatedText"]
    # swapLangs(): only when the target language lists the source among its targets
    assert source in next(l for l in langs if l["code"] == target)["targets"]
    source, target = target, source
    page_translate(http, base, first, source, target)


def test_link_with_source_target_and_q(base, http):
    _, langs = page_load(http, base)
    link = "/?" + urlencode({"source": "de", "target": "en", "q": GERMAN})
    query = {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}
    codes = {l["code"] for l in langs} | {"auto"}  # the page adds Auto Detect to the list
    assert query["source"] in codes and query["target"] in codes
    assert page_translate(http, base, query["q"], query["source"], query["target"])["translatedText"]
    page_translate(http, base, query["q"], "auto", query["target"])


@pytest.mark.parametrize("name, content, source", [
    ("notes.txt", "Ein Hund rennt über die Wiese.\nZwei Kinder spielen.\n", "de"),
    ("page.html", "<html><body><p>Ein <b>Hund</b> rennt.</p></body></html>", "de"),
    ("notes.txt", "Ein Hund rennt über die Wiese.", "auto"),
])
def test_file_translation(base, http, name, content, source):
    """translateFile(): the upload, then the browser follows translatedFileUrl."""
    r = http.post(base + "/translate_file", data={"source": source, "target": "en", "api_key": "", "secret": "bogus"},
                  files={"file": (name, content.encode())})
    assert r.status_code == 200, r.text
    download = http.get(r.json()["translatedFileUrl"])
    assert download.status_code == 200 and download.content
    if name.endswith(".html"):
        assert download.text.startswith("<html><body><p>") and "<b>" in download.text


def test_the_page_with_api_keys(keyed, http):
    settings, _ = page_load(http, keyed)  # settings and languages stay open: the page loads before a key is typed
    assert settings["keyRequired"] is True and settings["apiKeys"] is True
    body = page_translate(http, keyed, GERMAN, "auto", "en", api_key=KEY)
    assert body["detectedLanguage"]["language"] == "de"
    assert page_translate(http, keyed, "12345", "auto", "en", api_key=KEY)["translatedText"] == "12345"
    assert page_translate(http, keyed, ENGLISH, "en", "en", api_key=KEY)["translatedText"] == ENGLISH
    # without the key: LibreTranslate's 403 in its shape, which the page shows as the error card
    r = http.post(keyed + "/translate", files=form({"q": GERMAN, "source": "de", "target": "en", "api_key": ""}))
    assert r.status_code == 403 and set(r.json()) == {"error"}
