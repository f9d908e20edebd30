"""Text files in the legacy code page of their language (nmt_serve/text/text_encoding.py), told apart with the
served languages' detector."""
from __future__ import annotations

import codecs

import pytest

from nmt_serve.text.language_detection import detector_for
from nmt_serve.text.text_encoding import TextEncodingError, decode

SERVED = ["en", "de", "fr", "cs"]
CZECH = ("1\n00:00:01,000 --> 00:00:02,000\nMuž jede přes ulici.\n\n2\n00:00:03,000 --> 00:00:04,000\n"
         "Dvě děti si hrají ve sněhu.\n")
CZECH_2 = ("1\n00:00:01,000 --> 00:00:02,000\nŽluťoučký kůň úpěl ďábelské ódy.\n\n2\n00:00:03,000 --> 00:00:04,000\n"
           "Šťastný Žďár a škola.\n")
GERMAN = ("1\n00:00:01,000 --> 00:00:02,000\nEin Mann fährt über die Straße – schön.\n\n2\n00:00:03,000 --> 00:00:04,000\n"
          "„Zwei Kinder“ spielen im Schnee…\n")
FRENCH = "Un homme traverse la rue. Les enfants jouent à la neige, c'était très amusant. Où êtes-vous? Œuvre «déjà»\n"


def detect(text: str) -> tuple[str | None, float]:
    found = detector_for(frozenset(SERVED)).detect(text)
    return (found[0].language, found[0].confidence) if found else (None, 0.0)


@pytest.mark.parametrize("text, language, encoding", [
    (CZECH, "cs", "cp1250"), (CZECH, "cs", "iso8859_2"), (CZECH_2, "cs", "cp1250"), (CZECH_2, "cs", "iso8859_2"),
    (GERMAN, "de", "cp1252"), (FRENCH, "fr", "cp1252"), (FRENCH, "fr", "iso8859_15")])
@pytest.mark.parametrize("named", [True, False])
def test_a_file_in_its_languages_code_page_is_read_as_written(text, language, encoding, named):
    # named: the request names its language; else "auto", any served one (and its script's pages)
    got, page = decode(text.encode(encoding), [language] if named else SERVED, detect)
    assert got == text and page == encoding


def test_utf8_and_byte_order_marks_come_first():
    assert decode("Grüße".encode()) == ("Grüße", "utf-8")
    assert decode(codecs.BOM_UTF8 + "Grüße".encode()) == ("Grüße", "utf-8-sig")
    assert decode("Grüße".encode("utf-16")) == ("Grüße", "utf-16")


def test_bytes_that_are_no_text_are_refused():
    with pytest.raises(TextEncodingError, match="not text"):
        decode(bytes(range(256)) * 4, SERVED, detect)


def test_an_html_page_is_read_in_the_encoding_it_declares_and_then_declares_utf8():
    from nmt_serve.text.text_encoding import decode_html

    body = "<p>Ein Mädchen läuft über die Straße.</p></body></html>"
    for head, encoding in [('<meta charset="windows-1252">', "cp1252"),
                           ('<META HTTP-EQUIV="Content-Type" CONTENT="text/html; charset=ISO-8859-1">', "cp1252"),  # as browsers read it
                           ("<meta charset='iso-8859-2'>", "iso8859-2")]:
        page = f"<!DOCTYPE html><html><head>{head}<title>Straße</title></head><body>{body}"
        text, read_in = decode_html(page.encode(encoding))
        assert codecs.lookup(read_in).name == codecs.lookup(encoding).name and "Mädchen" in text and "Straße" in text
        assert "utf-8" in text[:200] and "1252" not in text and "8859" not in text, text[:200]  # written back in UTF-8
    # Czech under an XML declaration
    xhtml = '<?xml version="1.0" encoding="windows-1250"?><html><body><p>Muž jede na kole.</p></body></html>'
    text, read_in = decode_html(xhtml.encode("cp1250"))
    assert read_in == "cp1250" and "Muž" in text and text.startswith('<?xml version="1.0" encoding="utf-8"?>')
    # saved as UTF-8 under the old declaration: UTF-8, the declaration mended
    text, read_in = decode_html(f'<meta charset="windows-1252"><p>{body}'.encode())
    assert read_in == "utf-8" and "Mädchen" in text and '<meta charset="utf-8">' in text
    # nothing declared: guessed as a text file is
    text, read_in = decode_html(f"<p>{body}".encode("cp1252"), ["de"])
    assert read_in == "cp1252" and "Mädchen" in text
    # a declaration the bytes belie is refused, not misread
    with pytest.raises(TextEncodingError):
        decode_html(b'<meta charset="windows-1252"><p>x\x81\x8d</p>')  # bytes Windows-1252 has no character for
