"""Subtitle cues as units of translation, whatever the file format (subrip.py: .srt, web_vtt.py: .vtt).

A cue's lines are one text (a line break in a subtitle is layout: "Ich habe den Hund" / "im Park gesehen."
is one clause), so they are joined for the model and the translation is broken into lines again: at
spaces, at most LINE characters a line where the words allow it (the common guideline for subtitles),
into as few lines as the text needs. A dialogue cue, each line a speaker's turn after a dash, keeps a turn
a line.

A sentence that runs over several cues ("Ich habe gestern den Hund" / "im Park gesehen.") is translated
whole, as subtitle translators do: translated cue by cue its halves come out as two broken sentences, and
a verb-final source has no verb in the first. The cues it runs over (no sentence end between them, less
than MAX_GAP apart, the same speaker and no new speaker's dash, at most MAX_CUES) are one unit, and the
translation is shared out among them by their share of the source's characters, each cut at a word
boundary, preferably after a comma or other punctuation near it; inline tags open across a cut are closed
and opened again, and the ellipses that mark a sentence's continuation ("going to..." / "...the park") are
put back at the cuts. A translation of fewer words than its cues (two cues' "Ja, genau." as "Exactly.") leaves
no cue empty: a cue that would show nothing goes, and the cue before it (or after it, at the start) shows
its words for that cue's time too.
"""
from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

LINE = 42  # characters a subtitle line holds
MAX_GAP = timedelta(seconds=2)  # cues further apart are not one sentence shown in pieces
MAX_CUES = 4  # the most cues one unit spans (a run-on list of fragments is not one sentence)
_ANY_TAG = re.compile(r"<[^<>]*>")
# a sentence's end: its punctuation, then closing quotes or brackets; or a sound or music cue ("[Tür knallt]", "♪")
_END = re.compile(r"[.!?…][\"'»«“”„’)\]]*$|[\])♪]$")
_ELLIPSES = ("...", "…")
# an ellipsis at a text's start or end, the tags before or after it kept
_OPENING_ELLIPSIS = re.compile(r"^((?:<[^/<>][^<>]*>)*)(?:\.\.\.|…)\s*")
_CLOSING_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)((?:</[^<>]*>)*)$")
_SPEAKER = re.compile(r"^[-–—]")  # a dialogue line: a new speaker
_TURN = re.compile(r"\s+(?=(?:<[^<>]*>)*[-–—]\s*\w)")  # where a translated cue's next speaker starts
_CUT_AFTER = re.compile(r"[,;:.!?…)\]»“”\"]$")  # a word after which a cut reads well
_VOID = {"br", "wbr", "img"}


def _visible(text: str) -> int:
    """Characters shown: tags take none, a character reference one."""
    return len(html.unescape(_ANY_TAG.sub("", text)))


def _words(text: str) -> list[str]:
    """The text split at spaces; a space inside a tag (<font color="...">, <v Anna>) splits nothing."""
    kept = _ANY_TAG.sub(lambda tag: tag.group(0).replace(" ", "\0"), text)
    return [word.replace("\0", " ") for word in kept.split()]


def lines(text: str, width: int = LINE) -> str:
    """The text broken at spaces into lines of at most `width` visible characters (a word longer than a line
    stands alone)."""
    out: list[str] = []
    for word in _words(text):
        if out and _visible(out[-1]) + 1 + _visible(word) <= width:
            out[-1] += " " + word
        else:
            out.append(word)
    return "\n".join(out)


@dataclass
class Cue:
    """One cue: its text as HTML for the model, and how a translation goes back into the file."""
    start: timedelta
    end: timedelta
    html: str
    text: str  # the same without tags: what sentence ends and speakers are read from
    from_html: Callable[[str], str]  # a translation's HTML as the format's cue text
    put: Callable[[str], None]  # the cue's new text, laid out in lines
    turns: int = 1  # a dialogue cue's lines, each a speaker's turn after a dash ("- Wer?" / "- Ich.")
    speaker: str | None = None  # who speaks, where the format names it (WebVTT's <v Anna>)
    retime: Callable[[timedelta, timedelta], None] | None = None  # gives the cue a new start and end
    drop: Callable[[], None] | None = None  # takes the cue out of the file

    def write(self, translated_html: str) -> None:
        if translated_html == self.html:  # not translated (a partial job's result): the cue as it was
            return
        text = self.from_html(translated_html).strip()
        turns = _TURN.split(text) if self.turns > 1 and _SPEAKER.match(_ANY_TAG.sub("", text)) else []
        # a turn a line, as the source had them, where the translation kept its dashes
        self.put("\n".join(map(lines, turns)) if len(turns) == self.turns else lines(text))


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
        words = _words(translated_html.strip())
        sizes = [max(len(cue.text), 1) for cue in self.cues]
        bounds = [0, *_cuts(words, [size / sum(sizes) for size in sizes]), len(words)]
        pieces = _balanced([words[a:b] for a, b in zip(bounds, bounds[1:])])
        shown = [k for k, piece in enumerate(pieces) if html.unescape(_ANY_TAG.sub("", piece)).strip()]
        merged = bool(shown) and len(shown) < len(pieces) and all(c.retime and c.drop for c in self.cues)
        if merged:
            self._merge(shown)
        first, last = (shown[0], shown[-1]) if merged else (0, len(pieces) - 1)
        for k, (cue, piece, (opens, closes)) in enumerate(zip(self.cues, pieces, self.marks)):
            if merged and k not in shown:
                continue
            if piece and opens and k != first:
                piece = re.sub(r"^((?:<[^/<>][^<>]*>)*)", r"\1...", piece, count=1)
            if piece and closes and k != last:
                piece = re.sub(r"((?:</[^<>]*>)*)$", r"...\1", piece, count=1)
            cue.write(piece)

    def _merge(self, shown: list[int]) -> None:
        """Each cue left without words taken out, its time given to the shown cue before it (after it, for
        cues before the first shown one)."""
        spans = {k: (self.cues[k].start, self.cues[k].end) for k in shown}
        for k, cue in enumerate(self.cues):
            if k in spans:
                continue
            owner = max((j for j in shown if j < k), default=shown[0])
            start, end = spans[owner]
            spans[owner] = (min(start, cue.start), max(end, cue.end))
            cue.drop()
        for k, (start, end) in spans.items():
            if (start, end) != (self.cues[k].start, self.cues[k].end):
                self.cues[k].retime(start, end)


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
            after_punctuation = _CUT_AFTER.search(html.unescape(_ANY_TAG.sub("", words[i - 1])))
            return abs(ends[i - 1] / total - goal) - (0.12 if after_punctuation else 0.0)

        cut = min(range(low, high + 1), key=cost)
        cuts.append(cut)
        low = cut + 1
    return cuts


def _balanced(pieces: list[list[str]]) -> list[str]:
    """The pieces as HTML, each with its tags balanced: a tag open at a cut is closed at the end of its piece
    and opened again at the start of the next."""
    out, open_tags = [], []
    for words in pieces:
        text = " ".join(words)
        piece = "".join(open_tags) + text
        for tag in _ANY_TAG.finditer(text):
            name = re.match(r"</?\s*([\w.-]+)", tag.group(0))
            if not name or name.group(1).lower() in _VOID or tag.group(0).endswith("/>"):
                continue
            if tag.group(0).startswith("</"):
                for i in range(len(open_tags) - 1, -1, -1):
                    if re.match(rf"<{re.escape(name.group(1))}\b", open_tags[i], re.IGNORECASE):
                        del open_tags[i]
                        break
            else:
                open_tags.append(tag.group(0))
        out.append(piece + "".join(_closing(tag) for tag in reversed(open_tags)))
    return out


def _closing(opening: str) -> str:
    return "</" + re.match(r"<([\w.-]+)", opening).group(1) + ">"


def _runs_on(cue: Cue, after: Cue) -> bool:
    """Whether the sentence of one cue goes on in the next: no sentence end between them (an ellipsis is one
    unless the next cue takes it up: "...", or a lowercase start), close in time, the same speaker and no
    dialogue dash."""
    if (after.start - cue.end > MAX_GAP or after.speaker != cue.speaker
            or _SPEAKER.match(after.text) or _SPEAKER.match(cue.text)):
        return False
    if cue.text.endswith(_ELLIPSES):
        return after.text.startswith(_ELLIPSES) or after.text[:1].islower()
    return not _END.search(cue.text)


def units(cues: list[Cue]) -> list[Cue | Sentence]:
    """The units to translate: a cue alone, or the cues one sentence runs over."""
    out, run = [], []
    for cue in cues:
        if run and (len(run) == MAX_CUES or not _runs_on(run[-1], cue)):
            out.append(run[0] if len(run) == 1 else Sentence.of(run))
            run = []
        run.append(cue)
    if run:
        out.append(run[0] if len(run) == 1 else Sentence.of(run))
    return out


def dialogue_turns(cue_lines: list[str]) -> int:
    """A cue's turns: its lines where each starts with a dialogue dash, else 1."""
    plain = [_ANY_TAG.sub("", line) for line in cue_lines]
    return len(plain) if len(plain) > 1 and all(_SPEAKER.match(line) for line in plain) else 1
