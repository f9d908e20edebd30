"""WebVTT captions (.vtt, HTML5 video's format), read and written by webvtt-py: each cue's identifier, timings
and settings kept, and so are the header, STYLE, REGION and NOTE blocks; its text translated as
subtitles.py lays out (a sentence over several cues as one unit).

A cue's markup goes through as inline HTML, placed on the target words as in any document: <i>, <b>, <u>
as themselves, every other tag (<c.yellow>, <lang en>, <ruby>, <b.loud>) as a `<span data-vtt>` that is
written back as the tag it stood for. A voice tag that starts the cue (<v Anna>) names its speaker: it is
kept out of what the model reads and put back in front of the translation, and cues of different speakers
are never one sentence. Karaoke timestamps inside a cue (<00:00:01.500>) are dropped: they timed the
source's words.
"""
from __future__ import annotations

import html
import re
from datetime import timedelta

import webvtt
from webvtt.errors import MalformedCaptionError, MalformedFileError

from nmt_serve.text.documents.document import Document, DocumentError
from nmt_serve.text.documents.subtitles import Cue, dialogue_turns, units

_TAG = re.compile(r"<[^<>]*>")
_PLAIN = {"<i>", "<b>", "<u>"}  # the tags HTML has as they are
_VOICE = re.compile(r"<v(?:\.[^\s<>]+)*(?:\s+([^<>]*))?>")
_SPAN = re.compile(r'<span data-vtt="(\d+)">')


def _name(tag: str) -> str:
    return re.match(r"</?\s*([a-z]*)", tag, re.IGNORECASE).group(1).lower()


def _text(segment: str) -> str:
    """Text between tags, escaped as both HTML and WebVTT want it (&amp;, &lt;, &gt;)."""
    return html.escape(html.unescape(segment), quote=False)


def _as_html(content: str, tags: list[str]) -> str:
    """A cue's text as HTML: its tags as inline tags (each tag but <i>, <b>, <u> appended to `tags`, its
    span naming its index there), timestamps dropped, unclosed tags closed at the end."""
    out, open_kinds, cur = [], [], 0
    for match in _TAG.finditer(content):
        out.append(_text(content[cur:match.start()]))
        cur = match.end()
        tag = match.group(0)
        if tag[1:2].isdigit():  # a timestamp
            continue
        if tag.startswith("</"):
            if open_kinds:
                out.append(open_kinds.pop())
            continue
        if tag.lower() in _PLAIN:
            out.append(tag.lower())
            open_kinds.append(f"</{tag[1].lower()}>")
        else:
            tags.append(tag)
            out.append(f'<span data-vtt="{len(tags) - 1}">')
            open_kinds.append("</span>")
    out.append(_text(content[cur:]))
    return "".join(out) + "".join(reversed(open_kinds))


def _from_html(translated: str, tags: list[str]) -> str:
    """A translation's HTML as WebVTT cue text: each span the tag it stood for, <i>, <b>, <u> as they are,
    any other tag (none is expected) dropped."""
    out, closing, cur = [], [], 0
    for match in _TAG.finditer(translated):
        out.append(_text(translated[cur:match.start()]))
        cur = match.end()
        tag = match.group(0)
        if span := _SPAN.fullmatch(tag):
            index = int(span.group(1))
            if index < len(tags):
                out.append(tags[index])
                closing.append(f"</{_name(tags[index])}>")
            else:
                closing.append("")
        elif tag.lower() in _PLAIN:
            out.append(tag.lower())
            closing.append(f"</{tag[1].lower()}>")
        elif tag.startswith("</") and closing:
            out.append(closing.pop())
    out.append(_text(translated[cur:]))
    return "".join(out)


def _time(stamp: str) -> timedelta:
    """A cue time as webvtt-py writes it (HH:MM:SS.mmm)."""
    hours, minutes, seconds = stamp.split(":")
    return timedelta(hours=int(hours), minutes=int(minutes), seconds=float(seconds))


def _stamp(time: timedelta) -> str:
    milliseconds = round(time.total_seconds() * 1000)
    return f"{milliseconds // 3_600_000:02d}:{milliseconds // 60_000 % 60:02d}:{milliseconds // 1000 % 60:02d}.{milliseconds % 1000:03d}"


def _retime(caption, start: timedelta, end: timedelta) -> None:
    caption.start, caption.end = _stamp(start), _stamp(end)


def read_vtt(data: bytes) -> Document:
    try:
        text = data.decode("utf-8-sig")  # WebVTT is UTF-8, always
    except UnicodeDecodeError as exc:
        raise DocumentError(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        captions = webvtt.from_string(text)
    except (MalformedFileError, MalformedCaptionError) as exc:
        raise DocumentError(f"it is not WebVTT captions ({exc})") from None
    tags: list[str] = []
    cues, dropped = [], set()
    for caption in captions:
        lines = [line.strip() for line in caption.lines if line.strip()]
        if not lines:
            continue
        content = " ".join(lines)
        speaker, prefix, suffix = None, "", ""
        if voice := _VOICE.match(content):
            speaker, prefix, content = (voice.group(1) or "").strip(), voice.group(0), content[voice.end():]
            if content.rstrip().endswith("</v>") and "<v" not in content:
                content, suffix = content.rstrip()[:-len("</v>")], "</v>"
        marked = _as_html(content.strip(), tags)
        if not html.unescape(_TAG.sub("", marked)).strip():  # markup alone (<v Anna></v>): nothing to translate
            continue
        cues.append(Cue(
            _time(caption.start), _time(caption.end),
            marked, html.unescape(_TAG.sub("", marked)),
            lambda translated, p=prefix, s=suffix: p + _from_html(translated, tags) + s,
            lambda new_text, c=caption: setattr(c, "text", new_text),
            dialogue_turns(lines), speaker,
            retime=lambda start, end, c=caption: _retime(c, start, end), drop=lambda c=caption: dropped.add(id(c)),
        ))

    def save() -> bytes:
        captions.captions[:] = [c for c in captions.captions if id(c) not in dropped]  # merged into a neighbour
        return captions.content.encode("utf-8")

    return Document(units(cues), save)
