"""Package descriptions and their translations (Debian's DDTP): the `Translation-{lang}` lists of a
release, one stanza per package with `Package`, `Description-md5` and `Description-{lang}`.

Every translation names the MD5 of the English description it translates, so English and German (or
French, Czech) descriptions pair up by that digest; the same digest in two languages other than English
pairs those too. Several packages may share one description (one digest): it belongs to all of them.

A description is a short description (its first line) and a long one, in paragraphs separated by
` .` lines; within a paragraph, a line starting with a list marker (`*`, `-`, `+`, `–`, `—`, `•`) starts a new
item. Paragraphs and items are the units aligned across languages (ddtp translators keep this
structure); wrapped lines within a unit are joined.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt_serve.training.corpus.heldout import split_of
from nmt_serve.training.corpus.segments import Collector, where

# the Translation files carry no license field: what is known is where the text comes from
DDTP_LICENSE = ("no license field in the i18n/Translation-* files; the English text is each package's own "
                "description (Debian main, DFSG-free), the translations are contributed by Debian's translators "
                "through DDTP/DDTSS (https://www.debian.org/international/l10n/ddtp)")

_ITEM = re.compile(r"^[*+\-–—•]\s+")  # French translators write "–\xa0item"


@dataclass(frozen=True)
class Description:
    md5: str
    packages: tuple[str, ...]
    short: str
    paragraphs: tuple[tuple[str, ...], ...]  # the long description: paragraphs of units (items)

    @property
    def shape(self) -> tuple[int, ...]:
        """Units per paragraph: two descriptions align unit by unit only when their shapes agree."""
        return tuple(len(p) for p in self.paragraphs)

    @property
    def units(self) -> list[str]:
        return [u for p in self.paragraphs for u in p]


def parse_description(md5: str, packages, text: str) -> Description:
    lines = text.split("\n")
    short = lines[0].strip()
    paragraphs: list[tuple[str, ...]] = []
    units: list[list[str]] = []
    for raw in lines[1:]:
        content = raw.strip()
        if content == ".":
            if units:
                paragraphs.append(tuple(" ".join(u) for u in units))
            units = []
            continue
        if not content:
            continue
        item = _ITEM.match(content)
        if item or not units:
            units.append([content[item.end():] if item else content])
        else:
            units[-1].append(content)
    if units:
        paragraphs.append(tuple(" ".join(u) for u in units))
    return Description(md5, tuple(sorted(set(packages))), short, tuple(paragraphs))


def stanzas(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """The stanzas of a deb822 file: {field: value}, a multi-line value's lines joined with "\n", their
    leading space kept (as in the file). Written here rather than taken from python-debian, whose
    parser refuses a whole file over one description that holds a Unicode line separator (trixie's do)."""
    stanza: dict[str, str] = {}
    key = None
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip(" \t\r"):  # only ASCII whitespace ends a stanza: a no-break space is text
            if stanza:
                yield stanza
            stanza, key = {}, None
        elif line[0] in " \t":
            if key is not None:
                stanza[key] += "\n" + line
        else:
            key, _, value = line.partition(":")
            key = key.strip()
            stanza[key] = value.strip()
    if stanza:
        yield stanza


def read_translation(path: str | Path, language: str) -> dict[str, Description]:
    """{Description-md5: description} of a Translation-{language} file, packages sharing a digest merged."""
    field = f"Description-{language}"
    texts: dict[str, str] = {}
    packages: dict[str, set[str]] = {}
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        for stanza in stanzas(f):
            md5, text, package = stanza.get("Description-md5"), stanza.get(field), stanza.get("Package")
            if not md5 or text is None or not package:
                continue
            texts.setdefault(md5, text)
            packages.setdefault(md5, set()).add(package)
    return {md5: parse_description(md5, packages[md5], texts[md5]) for md5 in sorted(texts)}


def description_segments(descriptions: dict[str, dict[str, Description]], releases: dict[str, dict[str, str]],
                         pairs: list[tuple[str, str]], collector: Collector) -> dict[str, dict[str, int]]:
    """Collect the aligned segments of every description translated into both languages of a pair
    (English or another language with the same Description-md5), into the split of its packages.

    descriptions: {language: {md5: description}}; releases: {language: {md5: the release it came from}}.
    Returns, per language pair, how many descriptions were paired, per split."""
    paired: dict[str, Counter] = {}
    english = descriptions.get("en", {})
    for md5 in sorted(english):
        for x, y in pairs:
            dx = english[md5] if x == "en" else descriptions.get(x, {}).get(md5)
            dy = descriptions.get(y, {}).get(md5)
            if dx is None or dy is None:
                continue
            packages = sorted(set(english[md5].packages) | set(dx.packages) | set(dy.packages))
            split = split_of(packages)
            paired.setdefault(f"{x}-{y}", Counter())[split] += 1
            release = releases[y][md5]
            collector.add(split, (x, y), "ddtp-short", packages[0], release, [(dx.short, dy.short)], sentence_split=False)
            if dx.shape != dy.shape:
                collector.counts.drop("structure_mismatch", where(split, (x, y)))
                continue
            collector.add(split, (x, y), "ddtp-long", packages[0], release, list(zip(dx.units, dy.units)))
    return {pair: dict(sorted(c.items())) for pair, c in sorted(paired.items())}
