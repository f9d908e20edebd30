"""Aligned segment pairs as they are collected from the sources, cleaned and cut into sentences on
the way in (the unit rules of filters.RULES apply here)."""
from __future__ import annotations

from dataclasses import dataclass, field

from nmt_serve.training.corpus.alignment import split_pair
from nmt_serve.training.corpus.filters import Counts, clean_unit

Pair = tuple[str, str]


@dataclass(frozen=True)
class Segment:
    split: str  # "train" | "eval" (heldout.split_of its packages)
    pair: Pair  # (language of a, language of b)
    kind: str  # "ddtp-short" | "ddtp-long" | "catalog" | "dictionary"
    origin: str  # the package it comes from (the first, when a description is shared)
    release: str
    a: str
    b: str


def where(split: str, pair: Pair) -> str:
    """How the manifest names a split's language pair: "train en-de"."""
    return f"{split} {pair[0]}-{pair[1]}"


@dataclass
class Collector:
    counts: Counts
    segments: list[Segment] = field(default_factory=list)

    def add(self, split: str, pair: Pair, kind: str, origin: str, release: str, units: list[tuple[str, str]], *,
            accelerators: bool = False, sentence_split: bool = True) -> None:
        """Unit pairs of one source item: cleaned, cut into sentence pairs where they align, collected."""
        for a, b in units:
            cleaned = clean_unit(a, b, accelerators)
            if isinstance(cleaned, str):
                self.counts.drop(cleaned, where(split, pair))
                continue
            a, b = cleaned
            pieces = split_pair(a, b, *pair) if sentence_split else [(a, b, "unit")]
            if pieces is None:
                self.counts.drop("unaligned_long_unit", where(split, pair))
                continue
            self.segments += [Segment(split, pair, kind, origin, release, x, y) for x, y, _ in pieces]
