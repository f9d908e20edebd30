"""Texts into sentences and back: the shipped models were trained on single sentences, so a paragraph
is translated sentence by sentence and put back together with its own whitespace and line breaks.

Sentence boundaries come from `sentencex` (chosen over pysbd by `python -m bench.segmenters`: as
accurate or more on the German and English gold sets, 20-400x faster). A sentence past the model's
comfortable length (the shipped models saw sentences of at most ~40 tokens in training, and past that
they stop early) is cut further at clause punctuation, else between words, so that nothing is
silently lost; the caller learns which sentences were cut this way.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import sentencex

# a cut after clause punctuation keeps each piece a phrase the model can translate on its own
_CLAUSE_END = re.compile(r"[,;:)\]–—](?=\s)|\s[–—](?=\s)")
_LEADING = re.compile(r"^\s*")
_TRAILING = re.compile(r"\s*$")


@dataclass(frozen=True)
class Segmented:
    """A text cut into parts that join back to it exactly; `sentences` are the parts to translate."""

    parts: tuple[str, ...]
    sentences: tuple[int, ...]  # indices into parts, in order
    pieces_of_long: tuple[int, ...] = ()  # per cut-up long sentence: how many of `sentences` it became
    long_sentences: tuple[int, ...] = ()  # positions in `sentences` that are pieces of a long sentence

    @property
    def texts(self) -> list[str]:
        return [self.parts[i] for i in self.sentences]

    def rebuild(self, translations: Sequence[str]) -> str:
        return self.rebuild_with_spans(translations)[0]

    def rebuild_with_spans(self, translations: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
        """The text with each sentence replaced by its translation, and where each translation landed."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)} sentences")
        out = list(self.parts)
        for i, t in zip(self.sentences, translations):
            out[i] = t
        return "".join(out), _spans(out, self.sentences)

    def source_spans(self) -> list[tuple[int, int]]:
        """Where each sentence sits in the original text."""
        return _spans(self.parts, self.sentences)


def _spans(parts: Sequence[str], chosen: Sequence[int]) -> list[tuple[int, int]]:
    starts, position = [], 0
    for part in parts:
        starts.append(position)
        position += len(part)
    return [(starts[i], starts[i] + len(parts[i])) for i in chosen]


def _strip(text: str) -> tuple[str, str, str]:
    lead = _LEADING.match(text).group()
    rest = text[len(lead):]
    trail = _TRAILING.search(rest).group()
    return lead, rest[: len(rest) - len(trail)], trail


# sentencex (German) never cuts before a number, for "am 3. Mai"-style ordinals; but after a word that is
# no abbreviation, ". 2 Mädchen ..." starts a sentence (captions often do): after a long word (six letters
# or more; "-str." is a street), or after a short lowercase one, as in "... bemalt ist. 3 Jungen", when a
# count and a word follow and it is not one of the lowercase abbreviations that stand before numbers.
_PERIOD_BEFORE_NUMBER = re.compile(r"(?<![^\W\d_])([^\W\d_]+)\.\s+(?=\d)")
_COUNT_AND_WORD = re.compile(r"\d+\s+[^\W\d_]")
_NUMBER_ABBREVIATIONS = frozenset(
    "ca cca bzw vgl ggf evtl inkl zzgl usw bspw bzgl max min std sek mio mrd tsd geb gem hrsg"
    " approx est vol fig env chap art obr str kap tzn atd".split())


def _starts_sentence(word: str, rest: str) -> bool:
    """Whether a number after "word." (rest: the text from the number on) starts a new sentence."""
    if len(word) >= 6:
        return not word.endswith("str")
    return len(word) >= 3 and word.islower() and word not in _NUMBER_ABBREVIATIONS and bool(_COUNT_AND_WORD.match(rest))


def sentences_of(line: str, language: str) -> list[str]:
    """sentencex's cut of one line: the pieces join back to the line exactly."""
    out = []
    for sentence in sentencex.segment(language, line):
        start = 0
        for m in _PERIOD_BEFORE_NUMBER.finditer(sentence):
            if _starts_sentence(m.group(1), sentence[m.end():]):
                out.append(sentence[start : m.end()])
                start = m.end()
        out.append(sentence[start:])
    return [s for s in out if s]


def split_long(sentence: str, count: Callable[[str], int], max_tokens: int) -> list[str]:
    """A sentence cut into pieces of at most max_tokens tokens where it can be: at clause punctuation
    first, else between words; the pieces (whitespace between them included) join back to it."""
    if count(sentence) <= max_tokens:
        return [sentence]
    cuts = [m.end() for m in _CLAUSE_END.finditer(sentence)]
    pieces = _greedy(sentence, cuts, count, max_tokens)
    out = []
    for piece in pieces:
        if count(piece) > max_tokens:
            words = [m.end() for m in re.finditer(r"\S(?=\s)", piece)]
            out += _greedy(piece, words, count, max_tokens)
        else:
            out.append(piece)
    return out


def _greedy(text: str, cuts: list[int], count: Callable[[str], int], max_tokens: int) -> list[str]:
    """Cut text at the fewest of the given positions so that pieces stay within max_tokens (a piece
    with no allowed cut inside stays whole, over the limit)."""
    pieces, start, best = [], 0, None
    for cut in cuts + [len(text)]:
        if count(text[start:cut]) <= max_tokens:
            best = cut
            continue
        end = best if best is not None else cut
        pieces.append(text[start:end])
        start, best = end, (cut if count(text[end:cut]) <= max_tokens else None)
        if best is None and cut != len(text):  # this clause alone is too long: cut right after it
            pieces.append(text[start:cut])
            start = cut
    if start < len(text):
        pieces.append(text[start:])
    return [p for p in pieces if p]


def segment(text: str, language: str, *, split_sentences: bool = True, count: Callable[[str], int] | None = None,
            max_tokens: int | None = None) -> Segmented:
    """Cut a text into the sentences to translate and the whitespace around them (kept as is).

    split_sentences=False keeps the text one unit (its outer whitespace still kept apart). With
    count and max_tokens, a sentence longer than max_tokens is cut further (split_long)."""
    parts: list[str] = []
    sentences: list[int] = []
    pieces_of_long: list[int] = []
    long_sentences: list[int] = []

    def add_sentence(sentence: str) -> None:
        lead, core, trail = _strip(sentence)
        if lead:
            parts.append(lead)
        if core:
            pieces = split_long(core, count, max_tokens) if split_sentences and count and max_tokens else [core]
            if len(pieces) > 1:
                pieces_of_long.append(len(pieces))
            for piece in pieces:
                lead_p, core_p, trail_p = _strip(piece)
                if lead_p:
                    parts.append(lead_p)
                if len(pieces) > 1:
                    long_sentences.append(len(sentences))
                sentences.append(len(parts))
                parts.append(core_p)
                if trail_p:
                    parts.append(trail_p)
        if trail:
            parts.append(trail)

    if not split_sentences:
        add_sentence(text)
    else:
        for line in re.split(r"(\n)", text):
            if line == "\n":
                parts.append(line)
            elif line.strip():
                for sentence in sentences_of(line, language):
                    add_sentence(sentence)
            elif line:
                parts.append(line)
    return Segmented(tuple(parts), tuple(sentences), tuple(pieces_of_long), tuple(long_sentences))
