"""SubRip subtitles (.srt), read and written by the `srt` library: each cue's number, timings and order kept,
its text translated as subtitles.py lays out (a sentence over several cues as one unit).

The formatting SubRip takes (<i>, <b>, <u>, <font color=...>) goes through as inline HTML, placed on the
target words as in any document; anything else that looks like a tag is text.
"""
from __future__ import annotations

import html
import re

import srt

from nmt_serve.text.documents.document import Document, DocumentError
from nmt_serve.text.documents.subtitles import Cue, dialogue_turns, units

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
    cues, dropped = [], set()
    for subtitle in subtitles:
        lines = [line.strip() for line in subtitle.content.splitlines() if line.strip()]
        if lines and _TAG.sub("", " ".join(lines)).strip():  # (markup alone, <i></i>: nothing to translate)
            content = " ".join(lines)
            cues.append(Cue(subtitle.start, subtitle.end, _as_html(content), html.unescape(_TAG.sub("", content)),
                            _from_html, lambda text, s=subtitle: setattr(s, "content", text), dialogue_turns(lines),
                            retime=lambda start, end, s=subtitle: setattr(s, "start", start) or setattr(s, "end", end),
                            drop=lambda s=subtitle: dropped.add(id(s))))
    eol = "\r\n" if "\r\n" in text else "\n"

    def save() -> bytes:
        # a cue merged into its neighbour goes; the others keep their numbers
        kept = [s for s in subtitles if id(s) not in dropped]
        return srt.compose(kept, reindex=False, strict=False, eol=eol).encode("utf-8")

    return Document(units(cues), save)
