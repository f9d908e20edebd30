"""SubRip subtitles (.srt), read and written by the `srt` library: each cue's text is a unit, its number,
timings and order kept.

A cue's lines are one text (a line break in a subtitle is layout: "Ich habe den Hund" / "im Park gesehen."
is one clause), so they are joined for the model and the translation is broken into lines again: at
spaces, at most LINE characters a line where the words allow it (the common guideline for subtitles),
into as few lines as the text needs. The formatting SubRip takes (<i>, <b>, <u>, <font color=...>) goes
through as inline HTML, placed on the target words as in any document; anything else that looks like a tag
is text. Cues are translated one by one: a sentence that runs over two cues is translated in two pieces,
as it is shown.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

import srt

from nmt_serve.text.documents.document import Document, DocumentError

LINE = 42  # characters a subtitle line holds
_TAG = re.compile(r"</?(?:i|b|u|font)(?:\s[^<>]*)?>", re.IGNORECASE)


def _as_html(content: str) -> str:
    """The cue's text as HTML: SubRip's own tags kept, everything else escaped."""
    out, cur = [], 0
    for tag in _TAG.finditer(content):
        out += [html.escape(content[cur:tag.start()], quote=False), tag.group(0)]
        cur = tag.end()
    out.append(html.escape(content[cur:], quote=False))
    return "".join(out)


def _from_html(translated: str) -> str:
    """A translation's HTML as SubRip text: its tags kept, the rest unescaped."""
    out, cur = [], 0
    for tag in re.finditer(r"<[^<>]*>", translated):
        out += [html.unescape(translated[cur:tag.start()]), tag.group(0)]
        cur = tag.end()
    out.append(html.unescape(translated[cur:]))
    return "".join(out)


def _lines(text: str, width: int = LINE) -> str:
    """The text broken at spaces into lines of at most `width` visible characters (tags take none; a
    word longer than a line stands alone). A space inside a tag (<font color="...">) is no break."""
    kept = re.sub(r"<[^<>]*>", lambda tag: tag.group(0).replace(" ", "\0"), text)
    words = [word.replace("\0", " ") for word in kept.split()]
    lines: list[str] = []
    for word in words:
        if lines and len(_TAG.sub("", lines[-1])) + 1 + len(_TAG.sub("", word)) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


@dataclass
class Cue:
    subtitle: srt.Subtitle
    html: str
    text: str

    def write(self, translated_html: str) -> None:
        self.subtitle.content = _lines(_from_html(translated_html).strip())


def read_srt(data: bytes) -> Document:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        subtitles = list(srt.parse(text))
    except srt.SRTParseError as exc:
        raise DocumentError(f"it is not SubRip subtitles ({exc})") from None
    if not subtitles and text.strip():
        raise DocumentError("it is not SubRip subtitles (no cue in it)")
    units = []
    for subtitle in subtitles:
        content = " ".join(line.strip() for line in subtitle.content.splitlines() if line.strip())
        if content:
            units.append(Cue(subtitle, _as_html(content), html.unescape(_TAG.sub("", content))))
    eol = "\r\n" if "\r\n" in text else "\n"
    return Document(units, lambda: srt.compose(subtitles, reindex=False, strict=False, eol=eol).encode("utf-8"))
