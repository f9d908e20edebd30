"""What the API process checks of a request's strings before anything reads them (service/limits.py), and
error bodies that can always be encoded (service/errors.py)."""
from __future__ import annotations

import json

from nmt_serve.service.errors import error_body
from nmt_serve.service.limits import unpaired_surrogate


def test_unpaired_surrogates_are_found_anywhere_in_a_value():
    assert unpaired_surrogate("Ein Hund rennt.") is None
    assert unpaired_surrogate("Straße 😀 ½ \u202e \x00") is None  # a real pair, as JSON's "\ud83d\ude00" decodes
    assert unpaired_surrogate(json.loads('"\\ud83d\\ude00"')) is None
    assert unpaired_surrogate("Hund \ud83d.") == "is not valid Unicode: an unpaired surrogate (U+D83D) at character 5"
    assert "U+DC00" in unpaired_surrogate(["ok", "\udc00"])
    assert "U+DC00" in unpaired_surrogate({"source": "ok", "target": "x\udc00"})
    assert "U+DC00" in unpaired_surrogate({"\udc00": 1})
    assert unpaired_surrogate(3) is None and unpaired_surrogate(None) is None


def test_an_error_body_always_encodes():
    body = error_body("invalid_request", "no model for \ud83d->en", "so\udc00urce")
    encoded = json.dumps(body, ensure_ascii=False).encode("utf-8")  # what the response does; a surrogate would raise
    assert json.loads(encoded)["error"] == {"type": "invalid_request", "message": "no model for \\ud83d->en", "param": "so\\udc00urce"}
    assert error_body("x", "plain", None)["error"]["message"] == "plain"

