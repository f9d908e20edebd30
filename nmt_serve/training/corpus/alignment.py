"""Aligned units into aligned sentences.

A unit pair (a description's paragraph or list item, a catalog message or one of its lines) is cut
into sentences on both sides with the project's segmenter (nmt_serve/text/segmentation.py, sentencex);
when both sides have the same number of sentences they pair up in order. Otherwise the unit pair is
kept whole when both sides are short enough to be one training example, else dropped: a length-based
aligner would guess where translators merged or split sentences, and a wrong pairing teaches worse
than a missing one.
"""
from __future__ import annotations

from nmt_serve.text.segmentation import sentences_of

# the longest unit (characters, either side) kept whole when its sentences do not pair up; the
# corpus's longest kept segment is the same (filters.MAX_CHARS)
MAX_UNIT_CHARS = 400


def sentences(text: str, language: str) -> list[str]:
    return [s.strip() for s in sentences_of(text, language) if s.strip()]


def split_pair(a: str, b: str, a_lang: str, b_lang: str, max_unit_chars: int = MAX_UNIT_CHARS
               ) -> list[tuple[str, str, str]] | None:
    """[(a sentence, b sentence, "sentence"), ...], or [(a, b, "unit")] when the sentence counts differ
    and both are short enough, or None (the pair is dropped)."""
    sa, sb = sentences(a, a_lang), sentences(b, b_lang)
    if len(sa) == len(sb) and sa:
        return [(x, y, "sentence" if len(sa) > 1 else "unit") for x, y in zip(sa, sb)]
    if max(len(a), len(b)) <= max_unit_chars:
        return [(a, b, "unit")]
    return None


def message_units(a: str, b: str) -> list[tuple[str, str]]:
    """A catalog message pair as unit pairs: line by line when both have the same number of
    non-empty lines, else each side joined into one unit."""
    la = [line.strip() for line in a.split("\n") if line.strip()]
    lb = [line.strip() for line in b.split("\n") if line.strip()]
    if len(la) == len(lb):
        return list(zip(la, lb))
    return [(" ".join(la), " ".join(lb))]
