"""A paragraph of formatted runs translated as one unit: its runs become inline HTML, the HTML path
translates it sentence by sentence and places the inline tags on the target words by the word
alignment (html_markup.py), and the translated HTML is read back into the same runs.

A paragraph is a list of `TextSlot`s: each place its text sits in the document's XML (a `w:t`, an
`a:t`, an ODF text node), with a key for its formatting (equal keys: the same formatting). Adjacent
slots with the same key form one group; a *separator* between two slots (a tab, a line break, a
footnote mark, a field: anything that is not text) always starts a new group, and stays where it is
in the XML while the text moves around it.

The formatting that covers most characters is the paragraph's *base*: its groups are written as
plain text, every other group as `<span data-run="i">`. Base groups are kept one per gap between
spans (a second one in the same gap is wrapped too), so that the text the translation puts in the
gap between span i-1 and span i has exactly one owner. The HTML path writes inline tags in source
order, so the spans come back in order and the text between them maps back by position. A group
the alignment left without a word is refilled with the nearest word beside it: a formatted run
never vanishes from the document.
"""
from __future__ import annotations

import html
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from html.parser import HTMLParser

ATTRIBUTE = "data-run"
# a word from its first letter or digit to its last: punctuation is no word, and stays where it is
_WORD = re.compile(r"\w(?:\S*\w)?")


@dataclass
class TextSlot:
    text: str
    key: Hashable  # what formats it: slots with equal keys look the same
    write: Callable[[str], None]  # puts the translated text in the document
    separated: bool = False  # something that is not text stands before it (never merged with the slot before)


@dataclass
class _Group:
    slots: list[TextSlot]
    wrapped: bool = False

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.slots)


class InlineParagraph:
    """One translatable unit: `html` to translate, `write(translated_html)` to put it back."""

    def __init__(self, slots: list[TextSlot]):
        groups: list[_Group] = []
        for slot in slots:
            if groups and not slot.separated and groups[-1].slots[-1].key == slot.key:
                groups[-1].slots.append(slot)
            else:
                groups.append(_Group([slot]))
        self._groups = [g for g in groups if g.text]
        self._untouched = [g for g in groups if not g.text]
        chars: dict[Hashable, int] = {}
        for g in self._groups:
            key = g.slots[0].key
            chars[key] = chars.get(key, 0) + len(g.text.strip())
        base = max(chars, key=chars.get) if chars else None
        previous_wrapped = True
        for g in self._groups:
            g.wrapped = g.slots[0].key != base or not previous_wrapped
            previous_wrapped = g.wrapped
        self._spans = [i for i, g in enumerate(self._groups) if g.wrapped]
        # the gap before span k (k = len(spans): after the last) -> the base group in it, if any
        self._gap_owner: dict[int, int] = {}
        for i, g in enumerate(self._groups):
            if not g.wrapped:
                self._gap_owner[sum(1 for s in self._spans if s < i)] = i
        # a separator (a tab, a line break) parts words: where no space stands beside it, the unit
        # gets one there; written back, the text beside a separator has the spaces the source had
        self._spaced = [i > 0 and g.slots[0].separated and not g.text[:1].isspace() and not self._groups[i - 1].text[-1:].isspace()
                        for i, g in enumerate(self._groups)]
        parts = []
        for k, g in enumerate(self._groups):
            text = html.escape(g.text, quote=False)
            parts.append((" " if self._spaced[k] else "")
                         + (f'<span {ATTRIBUTE}="{self._spans.index(k)}">{text}</span>' if g.wrapped else text))
        self.html = "".join(parts)

    @property
    def text(self) -> str:
        return "".join(g.text for g in self._groups)

    def write(self, translated_html: str) -> None:
        texts = self._distribute(translated_html)
        # refilled first: a word moved across a separator takes the translation's space along
        _refill_empty(texts, [bool(_WORD.search(g.text)) for g in self._groups])
        for i, g in enumerate(self._groups):
            if i and g.slots[0].separated:  # beside a separator, the spaces the source had there
                before, after = self._groups[i - 1].text, g.text
                texts[i - 1] = texts[i - 1].rstrip() + before[len(before.rstrip()):]
                texts[i] = after[:len(after) - len(after.lstrip())] + texts[i].lstrip()
        for g, text in zip(self._groups, texts):
            g.slots[0].write(text)
            for slot in g.slots[1:]:
                slot.write("")

    def _distribute(self, translated_html: str) -> list[str]:
        """Each group's share of the translation, in order (gap 0, span 0, gap 1, ...): a span's
        content is its own; the text in a gap is its base group's or, in a gap without one, the span
        before it's (the first gap's: the first span's)."""
        reader = _SpanReader(len(self._spans))
        reader.feed(translated_html)
        reader.close()
        out = [""] * len(self._groups)
        for gap, text in enumerate(reader.gaps):
            owner = self._gap_owner.get(gap)
            if owner is None and self._spans:
                owner = self._spans[max(0, gap - 1)]
            if owner is not None:
                out[owner] += text
            if gap < len(self._spans):
                out[self._spans[gap]] += reader.spans[gap]
        return out


def _refill_empty(texts: list[str], had_words: list[bool]) -> None:
    """A group that had words and got none takes the nearest word beside it. The word comes from the
    nearest group that can spare one (it keeps a word of its own, or had none to keep), and every group
    in between passes one word along to the next: a group of a single word ("Hund") keeps one, so no
    group is emptied to fill another. Only the cuts between groups move: no text is lost, copied or
    reordered. Where no group can spare a word, the group stays empty."""
    def count(k: int) -> int:
        return len(_WORD.findall(texts[k]))

    def spare(k: int) -> bool:
        return count(k) > 1 or count(k) == 1 and not had_words[k]

    for i in range(len(texts)):
        if not had_words[i] or count(i):
            continue
        left = next((j for j in range(i - 1, -1, -1) if spare(j)), None)
        right = next((j for j in range(i + 1, len(texts)) if spare(j)), None)
        if left is not None and (right is None or i - left <= right - i):
            for k in range(left, i):  # each group hands its last word to the next
                cut = list(_WORD.finditer(texts[k]))[-1].start()
                texts[k], texts[k + 1] = texts[k][:cut], texts[k][cut:] + texts[k + 1]
        elif right is not None:
            for k in range(right, i, -1):  # each group hands its first word to the one before
                cut = next(_WORD.finditer(texts[k])).end()
                texts[k - 1], texts[k] = texts[k - 1] + texts[k][:cut], texts[k][cut:]


class _SpanReader(HTMLParser):
    """The translated unit: the text of each span and of each gap between them, in order."""

    def __init__(self, spans: int):
        super().__init__(convert_charrefs=True)
        self.spans, self.gaps = [""] * spans, [""] * (spans + 1)
        self._open: int | None = None
        self._depth = 0  # inline tags the translation kept inside a span (none are added)
        self._gap = 0

    def handle_starttag(self, tag, attrs):
        index = dict(attrs).get(ATTRIBUTE)
        if self._open is None and tag == "span" and index is not None and index.isdigit() and int(index) < len(self.spans):
            self._open, self._depth = int(index), 0
        elif self._open is not None:
            self._depth += 1

    def handle_endtag(self, tag):
        if self._open is None:
            return
        if self._depth:
            self._depth -= 1
        elif tag == "span":
            self._gap = self._open + 1
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self.spans[self._open] += data
        else:
            self.gaps[min(self._gap, len(self.gaps) - 1)] += data

