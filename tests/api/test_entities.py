"""Entities through the service with the shipped models, which learned `&amp;` for `&` from Multi30k's English side:
text format gives `&` back, HTML format escapes once (pipeline.py decodes the model's references once,
text/entities.py)."""
from __future__ import annotations

import re
import time

import pytest
from conftest import ROOT
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings


@pytest.fixture(scope="module")
def client():
    settings = Settings(models_dir=str(ROOT / "checkpoints"), device="cpu")
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        deadline = time.time() + 60
        while c.get("/health/ready").status_code != 200:
            assert time.time() < deadline, "the shipped models did not load"
            time.sleep(0.05)
        yield c


def translate(client, text, **fields) -> str:
    r = client.post("/v1/translate", json={"text": text, "source": "de", "target": "en", **fields})
    assert r.status_code == 200, r.text
    return r.json()["translations"][0]["text"]


def libretranslate(client, q, **fields) -> str:
    r = client.post("/translate", json={"q": q, "source": "de", "target": "en", **fields})
    assert r.status_code == 200, r.text
    return r.json()["translatedText"]


AMPERSANDS = ["Tom & Jerry laufen.", "Ein Mann & eine Frau gehen spazieren.", "Schwarz & Weiß: zwei Hunde spielen."]


def test_text_format_has_no_references(client):
    outputs = [out for text in AMPERSANDS for out in (translate(client, text), libretranslate(client, text))]
    assert not [out for out in outputs if "&amp;" in out or "&lt;" in out], outputs
    # the model did write its entity for some of them (else this would test nothing): it comes out as "&"
    assert any("&" in out for out in outputs), outputs


def test_html_format_is_escaped_once(client):
    for html in ["<p>5 &lt; 6 &amp; 7</p>", "<p>Tom &amp; Jerry laufen.</p>", "<p>Ein <b>Mann</b> &amp; eine Frau.</p>"]:
        for out in (translate(client, html, format="html"), libretranslate(client, html, format="html")):
            assert "&amp;amp;" not in out and "&amp;lt;" not in out and "&amp;gt;" not in out, (html, out)
            assert out.startswith("<p>") and out.endswith("</p>")
    out = translate(client, "<p>5 &lt; 6 &amp; 7</p>", format="html")
    # the "&" the model wrote (as "&amp;") is escaped once, and no bare "&" or "<" is left in the text
    assert "&amp;" in out and re.search(r"&(?!amp;|lt;|gt;)", out) is None and "< " not in out, out

