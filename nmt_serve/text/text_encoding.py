"""Text files in the encoding they were saved in: UTF-8 (with its byte order mark or without), UTF-16 and
UTF-32 with one, and, where the bytes are not UTF-8, the legacy code page of the text's language. Subtitle
files above all still come that way: Windows-1250 from Czech sites, Windows-1252 from German and French ones,
ISO 8859-2 from older Linux tools.

A single-byte code page decodes almost any bytes, so which one a file is in is a guess, made in two steps.
The language: the one named, or (with several it may be in) the one the detector reads in the text, which
its ASCII words tell whatever the code page ("jede", "ulici", "si" are Czech in any of them); it chooses the
script's code pages. Then among those, the reading with the fewest characters no text has (C1 control
codes, where an ISO page reads a Windows page's letters; symbols as "¾" or "¤"), the detector's surest on a
tie, the more common page on a tie of both: Czech in ISO 8859-2 read as Windows-1250 is "Muľ jede" for
"Muž jede", which the detector finds less Czech.
"""
from __future__ import annotations

import codecs
import re
import unicodedata
from collections.abc import Callable, Iterable

# a script's legacy code pages, the most common first (Windows', then ISO 8859's)
CODE_PAGES = {
    "latin": ("cp1252", "iso8859_15"),
    "central": ("cp1250", "iso8859_2"),
    "cyrillic": ("cp1251", "koi8_r", "iso8859_5"),
    "greek": ("cp1253", "iso8859_7"),
    "turkish": ("cp1254", "iso8859_9"),
    "baltic": ("cp1257", "iso8859_13"),
}
_SCRIPT = {language: script for script, languages in {
    "central": "cs sk pl hu sl hr bs ro sq",
    "cyrillic": "ru uk be bg sr mk",
    "greek": "el",
    "turkish": "tr az",
    "baltic": "et lv lt",
}.items() for language in languages.split()}
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
SAMPLE_CHARS = 5000  # what the judge reads of each candidate's text
# where an HTML page names its encoding: a meta element's charset (its own attribute or http-equiv's
# content) and XHTML's XML declaration; browsers look only at the page's start
_DECLARED = re.compile(r"""(<meta\b[^>]*?charset\s*=\s*["']?\s*|<\?xml\b[^>]*?\bencoding\s*=\s*["'])([\w.:-]+)""", re.IGNORECASE)
DECLARATION_CHARS = 4096


class TextEncodingError(ValueError):
    """Bytes that are no text in UTF-8 nor in a code page of the languages they may be in."""


def _script(language: str) -> str:
    return _SCRIPT.get(language.split("_")[0].split("-")[0].lower(), "latin")


def code_pages(languages: Iterable[str]) -> list[str]:
    """The legacy code pages of the languages' scripts (ISO 639-1 codes), in the order the languages come."""
    return [page for script in dict.fromkeys(map(_script, languages)) for page in CODE_PAGES[script]]


def _oddities(text: str) -> int:
    """Characters a text has where it was read in the wrong code page: control codes (ten each) and symbols."""
    odd = 0
    for c in text:
        if ord(c) < 0x80:
            continue
        category = unicodedata.category(c)
        odd += 10 if category == "Cc" else category in ("So", "Sk", "Sm", "No", "Cn", "Co")
    return odd


def decode(data: bytes, languages: Iterable[str] = (),
           detect: Callable[[str], tuple[str | None, float]] | None = None) -> tuple[str, str]:
    """The bytes as text and the encoding they were read in. languages: those the text may be in (none: any
    script's code pages are tried); detect: the language a text reads as, and how surely (0-1)."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding), encoding
            except UnicodeDecodeError as exc:
                raise TextEncodingError(f"it starts as {encoding} text but is not ({exc.reason} at byte {exc.start})") from None
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    languages = list(languages)
    candidates = code_pages(languages) if languages else [page for pages in CODE_PAGES.values() for page in pages]
    readings: dict[str, str] = {}
    for page in candidates:
        try:
            readings[page] = data.decode(page)
        except UnicodeDecodeError:
            continue
    if not readings:
        raise TextEncodingError(f"it is neither UTF-8 nor text in {', '.join(candidates)}: save it as UTF-8")
    if detect is not None and len({_script(language) for language in languages}) != 1:
        # several scripts possible: the language the text reads as chooses its script's pages
        language, _ = detect(next(iter(readings.values()))[:SAMPLE_CHARS])
        if language is not None and (own := [p for p in code_pages([language]) if p in readings]):
            candidates = own
    chosen = [p for p in candidates if p in readings]
    sure = {p: detect(readings[p][:SAMPLE_CHARS])[1] if detect is not None and len(chosen) > 1 else 0.0 for p in chosen}
    page = min(chosen, key=lambda p: (_oddities(readings[p]), -sure[p], chosen.index(p)))
    controls = sum(unicodedata.category(c) == "Cc" and c not in "\t\n\r\f" for c in readings[page])
    if controls > len(readings[page]) / 100:  # what an ISO page makes of bytes that are no text at all
        raise TextEncodingError(f"it is not text: read in {page}, {controls} of its {len(readings[page])} characters are control codes")
    return readings[page], page


def decode_html(data: bytes, languages: Iterable[str] = (),
                detect: Callable[[str], tuple[str | None, float]] | None = None) -> tuple[str, str]:
    """An HTML page's bytes as text and the encoding they were read in: by its byte order mark; else UTF-8
    where the bytes read as UTF-8 (a page saved as UTF-8 under an older declaration: multi-byte sequences do
    not happen by chance in a code page's text); else the encoding its start declares, the label mapped as
    browsers map it (w3lib: "ISO-8859-1" is read as Windows-1252); else as decode() guesses a text file's.
    The text's declarations then name UTF-8, the encoding it is written back in."""
    from w3lib.encoding import html_body_declared_encoding, resolve_encoding

    if any(data.startswith(bom) for bom, _ in _BOMS):
        text, encoding = decode(data)
    else:
        try:
            text, encoding = data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            declared = html_body_declared_encoding(data)
            codec = resolve_encoding(declared) if declared else None
            if codec is None or codecs.lookup(codec).name == "utf-8":  # none, or one the bytes belie
                text, encoding = decode(data, languages, detect)
            else:
                try:
                    text, encoding = data.decode(codec), codec
                except UnicodeDecodeError as exc:
                    raise TextEncodingError(f"it declares {declared} but is not ({exc.reason} at byte {exc.start})") from None
    head = _DECLARED.sub(lambda m: m.group(1) + "utf-8", text[:DECLARATION_CHARS])
    return head + text[DECLARATION_CHARS:], encoding
