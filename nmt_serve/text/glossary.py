"""A request's glossary: which of its entries apply to a sentence, by where their source terms occur.

An entry applies to a sentence when its source term occurs in it, and then its target term must
appear in the sentence's translation (the engine enforces it: inference/lexical_constraints.py).
Matching is word by word, ignoring case (Unicode case folding), and tolerant of inflection: each
word of the term matches a word of the sentence that is it plus one of the served languages'
endings (ENDINGS: "Hund" matches "Hunde", "Hundes", "Hunden" but not "Hundert"; "chat" matches
"chats"; "pes" does not match Czech "psa": a stem that changes needs its forms listed as entries of
their own). Where terms overlap, the longest applies ("roter Hund" over "Hund"). A term
of several words matches the same number of consecutive words. The target term is placed as
written: its inflection is the user's to choose.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_ENTRIES = 64  # per request: each applied entry widens the search
MAX_TERM_CHARS = 200

WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class GlossaryEntry:
    source: str
    target: str


@dataclass(frozen=True)
class Terminology:
    """A request's terms: the glossary, and target terms no translation may contain."""

    glossary: tuple[GlossaryEntry, ...] = ()
    avoid: tuple[str, ...] = ()
    index: GlossaryIndex | None = field(default=None, compare=False, repr=False)  # the glossary's, made once

    def __post_init__(self) -> None:
        if self.index is None and self.glossary:
            object.__setattr__(self, "index", GlossaryIndex(self.glossary))

    def terms_for(self, sentences: list[str]) -> list[list[str]] | None:
        """Per sentence, the target terms its translation must contain (None: no glossary)."""
        return [self.index.applicable(s) for s in sentences] if self.glossary else None


class GlossaryIndex:
    """A glossary's entries by their source term's first word, so that a sentence is matched against the
    entries that may occur in it, not all of them (a stored glossary has thousands): `applicable` as the
    function, at a cost that grows with the sentence, not the glossary."""

    def __init__(self, entries: tuple[GlossaryEntry, ...] | list[GlossaryEntry]):
        self.entries = list(entries)
        self._by_first: dict[str, list[int]] = {}
        for k, e in enumerate(self.entries):
            if first := words(e.source)[:1]:
                self._by_first.setdefault(first[0], []).append(k)

    def applicable(self, sentence: str) -> list[str]:
        found = words(sentence)
        candidates: set[int] = set()
        for word in set(found):
            # a term's first word matches this word when it is the word, or the word less one of ENDINGS
            for stem in (word, *(word[:-len(e)] for e in ENDINGS if len(word) > len(e) and word.endswith(e))):
                candidates.update(self._by_first.get(stem, ()))
        return applicable(sentence, [self.entries[k] for k in sorted(candidates)])


def words(text: str) -> list[str]:
    return [w.casefold() for w in WORD.findall(text)]


# what an inflected form adds to its stem in the served languages (en, de, fr, cs): "Hund" matches
# "Hunde" and "Hunden", not "Hundert"
ENDINGS = frozenset("s es e en n er ern em ens x a u y i o ou ů ům ech ích ách ami ovi ové é ě í".split())


def _matches(word: str, term_word: str) -> bool:
    return word == term_word or word.startswith(term_word) and word[len(term_word):] in ENDINGS


def _spans(term: str, sentence_words: list[str]) -> list[range]:
    """Where the term's words occur, consecutively and inflection-tolerant, among the sentence's."""
    term_words = words(term)
    n = len(term_words)
    if not n:
        return []
    return [range(i, i + n) for i in range(len(sentence_words) - n + 1)
            if all(_matches(sentence_words[i + j], term_words[j]) for j in range(n))]


def occurs(term: str, sentence_words: list[str]) -> bool:
    """Whether the term's words occur, consecutively and inflection-tolerant, among the sentence's."""
    return bool(_spans(term, sentence_words))


def applicable(sentence: str, entries: list[GlossaryEntry]) -> list[str]:
    """The target terms of the entries whose source term occurs in the sentence, each once, in the
    glossary's order. Where terms overlap, the longest wins: "roter Hund" takes its words from "Hund"."""
    found = words(sentence)
    taken: set[int] = set()
    applies = set()
    for k, e in sorted(enumerate(entries), key=lambda ke: -len(words(ke[1].source))):
        free = [span for span in _spans(e.source, found) if not taken.intersection(span)]
        if free:
            applies.add(k)
            for span in free:
                taken.update(span)
    return list(dict.fromkeys(e.target for k, e in enumerate(entries) if k in applies))


def check(entries: list[GlossaryEntry], avoid: list[str], max_entries: int = MAX_ENTRIES) -> tuple[str, str] | None:
    """Why a glossary or avoid list cannot be used (one line) and which of the two it is ("glossary" or
    "avoid"), or None. max_entries: a request's; a stored glossary's is a setting of its own."""
    if len(entries) + len(avoid) > max_entries:
        return f"at most {max_entries} glossary entries and avoided terms in all, got {len(entries) + len(avoid)}", "glossary"
    targets: dict[tuple[str, ...], str] = {}
    for e in entries:
        if not words(e.source) or not e.target.strip():
            return "a glossary entry needs a source term with a word in it and a non-empty target term", "glossary"
        if len(e.source) > MAX_TERM_CHARS or len(e.target) > MAX_TERM_CHARS:
            return f"glossary terms are at most {MAX_TERM_CHARS} characters", "glossary"
        # one source term, two targets: both would be forced into every sentence that has it
        if targets.setdefault(tuple(words(e.source)), e.target) != e.target:
            return (f"the source term {e.source!r} has two target terms ({targets[tuple(words(e.source))]!r} and {e.target!r}): "
                    "give one"), "glossary"
    for term in avoid:
        if not term.strip() or len(term) > MAX_TERM_CHARS:
            return f"an avoided term must be non-empty and at most {MAX_TERM_CHARS} characters", "avoid"
    return None
