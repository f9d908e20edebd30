"""SubRip subtitles (.srt), read and written by the `srt` library: each cue's text is a unit, its number,
timings and order kept.

A cue's lines are one text (a line break in a subtitle is layout: "Ich habe den Hund" / "im Park gesehen."
is one clause), so they are joined for the model and the translation is broken into lines again: at
spaces, at most LINE characters a line where the words allow it (the common guideline for subtitles),
into as few lines as the text needs. The formatting SubRip takes (<i>, <b>, <u>, <font color=...>) goes
through as inline HTML, placed on the target words as in any document; anything else that looks like a tag
is text.

A sentence that runs over several cues ("Ich habe gestern den Hund" / "im Park gesehen.") is translated
whole, as subtitle translators do: translated cue by cue its halves come out as two broken sentences, and
a verb-final source has no verb in the first. The cues it runs over (no sentence end between them, less
than MAX_GAP apart, no new speaker's dash, at most MAX_CUES) are one unit, and the translation is shared
out among them by their share of the source's characters, each cut at a word boundary, preferably after
a comma or other punctuation near it; SubRip's tags open across a cut are closed and opened again, and the
ellipses that mark a sentence's continuation ("going to..." / "...the park") are put back at the cuts.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import timedelta

import srt

from nmt_serve.text.documents.document import Document, DocumentError

LINE = 42  # characters a subtitle line holds
MAX_GAP = timedelta(seconds=2)  # cues further apart are not one sentence shown in pieces
MAX_CUES = 4  # the most cues one unit spans (a run-on list of fragments is not one sentence)
_TAG = re.compile(r"</?(?:i|b|u|font)(?:\s[^<>]*)?>", re.IGNORECASE)
# a sentence's end: its punctuation, then closing quotes or brackets; or a sound or music cue ("[Tür knallt]", "♪")
_END = re.compile(r"[.!?…][\"'»«“”„’)\]]*$|[\])♪]$")
_ELLIPSES = ("...", "…")
# an ellipsis at a text's start or end, the tags before or after it kept
_OPENING_ELLIPSIS = re.compile(r"^((?:<[^/<>][^<>]*>)*)(?:\.\.\.|…)\s*")
_CLOSING_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)((?:</[^<>]*>)*)$")
_SPEAKER = re.compile(r"^[-–—]")  # a dialogue line: a new speaker
_TURN = re.compile(r"\s+(?=(?:<[^<>]*>)*[-–—]\s*\w)")  # where a translated cue's next speaker starts
_CUT_AFTER = re.compile(r"[,;:.!?…)\]»“”\"]$")  # a word after which a cut reads well


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


def _visible(word: str) -> int:
    return len(_TAG.sub("", word))


def _cuts(words: list[str], shares: list[float]) -> list[int]:
    """Where to cut the words (indices, one per share but the last) so that the pieces' characters follow the
    cumulative shares: the nearest word boundary to each, or one within 12% of the text after a word ending
    in punctuation; every piece keeps a word where there are enough."""
    ends, total = [], 0
    for word in words:
        total += _visible(word) + 1
        ends.append(total)
    cuts, low, goal = [], 1, 0.0
    for k, share in enumerate(shares[:-1]):
        goal += share
        high = len(words) - (len(shares) - 1 - k)  # leave a word for each piece after this one
        if high < low:
            cuts.append(min(low, len(words)))
            continue

        def cost(i: int) -> float:
            return abs(ends[i - 1] / total - goal) - (0.12 if _CUT_AFTER.search(_TAG.sub("", words[i - 1])) else 0.0)

        cut = min(range(low, high + 1), key=cost)
        cuts.append(cut)
        low = cut + 1
    return cuts


def _balanced(pieces: list[list[str]]) -> list[str]:
    """The pieces as texts, each with SubRip's tags balanced: a tag open at a cut is closed at the end of
    its piece and opened again at the start of the next."""
    out, open_tags = [], []
    for words in pieces:
        text = "".join(open_tags) + " ".join(words)
        for tag in _TAG.finditer(" ".join(words)):
            if tag.group(0).startswith("</"):
                name = tag.group(0)[2:-1].strip().lower()
                for i in range(len(open_tags) - 1, -1, -1):
                    if re.match(rf"<{name}\b", open_tags[i], re.IGNORECASE):
                        del open_tags[i]
                        break
            else:
                open_tags.append(tag.group(0))
        closing = "".join("</" + re.match(r"<(\w+)", tag).group(1) + ">" for tag in reversed(open_tags))
        out.append(text + closing)
    return out


@dataclass
class Cue:
    subtitle: srt.Subtitle
    html: str
    text: str
    turns: int = 1  # a dialogue cue's lines, each a speaker's turn after a dash ("- Wer?" / "- Ich.")

    def write(self, translated_html: str) -> None:
        if translated_html == self.html:  # not translated (a partial job's result): the cue as it was
            return
        text = _from_html(translated_html).strip()
        turns = _TURN.split(text) if self.turns > 1 and _SPEAKER.match(_TAG.sub("", text)) else []
        # a turn a line, as the source had them, where the translation kept its dashes
        self.subtitle.content = "\n".join(map(_lines, turns)) if len(turns) == self.turns else _lines(text)


@dataclass
class Sentence:
    """Cues that show one sentence in pieces, translated as one text and shared out again."""
    cues: list[Cue]
    html: str
    text: str
    marks: list[tuple[bool, bool]]  # each cue's ellipses at the cuts: (one opening it, one closing it)

    @classmethod
    def of(cls, cues: list[Cue]) -> "Sentence":
        last = len(cues) - 1
        marks = [(k > 0 and cue.text.startswith(_ELLIPSES), k < last and cue.text.endswith(_ELLIPSES))
                 for k, cue in enumerate(cues)]
        htmls, texts = [], []
        for cue, (opens, closes) in zip(cues, marks):
            h, t = cue.html, cue.text
            if opens:
                h, t = _OPENING_ELLIPSIS.sub(r"\1", h), _OPENING_ELLIPSIS.sub(r"\1", t)
            if closes:
                h, t = _CLOSING_ELLIPSIS.sub(r"\1", h), _CLOSING_ELLIPSIS.sub(r"\1", t)
            htmls.append(h)
            texts.append(t)
        joined = htmls[0]
        for h in htmls[1:]:
            # <i>, <b>, <u> closed at one cue's end and opened again at the next's start: one run of them
            closing = re.search(r"(?:</[ibu]>)*$", joined, re.IGNORECASE).group(0)
            opening = re.match(r"(?:<[ibu]>)*", h, re.IGNORECASE).group(0)
            same = closing and closing.lower().replace("/", "") == "".join(reversed(re.findall("<.>", opening.lower())))
            joined = f"{joined[:-len(closing)]} {h[len(opening):]}" if same else f"{joined} {h}"
        return cls(cues, joined, " ".join(texts), marks)

    def write(self, translated_html: str) -> None:
        if translated_html == self.html:  # not translated (a partial job's result): the cues as they were
            return
        kept = re.sub(r"<[^<>]*>", lambda tag: tag.group(0).replace(" ", "\0"), _from_html(translated_html).strip())
        words = [word.replace("\0", " ") for word in kept.split()]
        sizes = [max(len(cue.text), 1) for cue in self.cues]
        bounds = [0, *_cuts(words, [size / sum(sizes) for size in sizes]), len(words)]
        pieces = _balanced([words[a:b] for a, b in zip(bounds, bounds[1:])])
        for cue, piece, (opens, closes) in zip(self.cues, pieces, self.marks):
            if piece and opens:
                piece = re.sub(r"^((?:<[^/<>][^<>]*>)*)", r"\1...", piece, count=1)
            if piece and closes:
                piece = re.sub(r"((?:</[^<>]*>)*)$", r"...\1", piece, count=1)
            cue.subtitle.content = _lines(piece)


def _runs_on(cue: Cue, after: Cue) -> bool:
    """Whether the sentence of one cue goes on in the next: no sentence end between them (an ellipsis is one
    unless the next cue takes it up: "...", or a lowercase start), close in time, and no new speaker."""
    if after.subtitle.start - cue.subtitle.end > MAX_GAP or _SPEAKER.match(after.text) or _SPEAKER.match(cue.text):
        return False
    if cue.text.endswith(_ELLIPSES):
        return after.text.startswith(_ELLIPSES) or after.text[:1].islower()
    return not _END.search(cue.text)


def _sentences(cues: list[Cue]) -> list[Cue | Sentence]:
    """The units: a cue alone, or the cues one sentence runs over."""
    units, run = [], []
    for cue in cues:
        if run and (len(run) == MAX_CUES or not _runs_on(run[-1], cue)):
            units.append(run[0] if len(run) == 1 else Sentence.of(run))
            run = []
        run.append(cue)
    if run:
        units.append(run[0] if len(run) == 1 else Sentence.of(run))
    return units


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
    cues = []
    for subtitle in subtitles:
        lines = [line.strip() for line in subtitle.content.splitlines() if line.strip()]
        if lines:
            content = " ".join(lines)
            turns = len(lines) if all(_SPEAKER.match(_TAG.sub("", line)) for line in lines) else 1
            cues.append(Cue(subtitle, _as_html(content), html.unescape(_TAG.sub("", content)), turns))
    eol = "\r\n" if "\r\n" in text else "\n"
    return Document(_sentences(cues), lambda: srt.compose(subtitles, reindex=False, strict=False, eol=eol).encode("utf-8"))
