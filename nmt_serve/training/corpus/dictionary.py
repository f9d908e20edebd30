"""Example sentences of bilingual dictionaries in Debian: everyday language, which neither package
descriptions nor software messages hold ("Wie geht es Ihnen?" :: "How are you?").

Ding's German-English list (package trans-de-en, /usr/share/trans/de-en, GPL-2+; about 206,000
entries) is one entry a line, German `::` English. Each side lists its sub-entries with ` | ` in the
same order (the headword, its forms, phrases, example sentences); a sub-entry's alternatives are
separated by `; `, and annotations mark grammar `{f}`, usage `[Br.]`, other forms `<purer>` and
abbreviations `/HRU/`. Most sub-entries are words and terms: only the example sentences are taken,
sub-entries that are sentences on both sides (a capital first, end punctuation last) once the
annotations, and a note in parentheses after the sentence, are removed. An alternative on one side
pairs with each of the other side's when that side has only one; where both have several, the first
of each pair up (their order need not agree). Optional words in parentheses are kept as words ("(Mir
geht's) gut, und dir?" -> "Mir geht's gut, und dir?"). A sentence that still carries an editorial mark is
dropped (rule dictionary_mark): a placeholder (etw., jdm., sth., sb.), an ellipsis, or a slash between
alternatives, which may be phrases even without spaces ("To see her/the sight of her"): taking the first
word garbled about one in ten of them; so is an alternative that is no sentence alone.

Held out: every entry whose text's SHA-1 ends in 0 (heldout.entry_split, about one in sixteen) goes to
the eval split and the `eval-dictionary` set, so that everyday sentences can be scored; a training
entry that repeats one of their sentences is dropped there (rule in_eval).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from nmt_serve.training.corpus import deb_files
from nmt_serve.training.corpus.apt import DebFile
from nmt_serve.training.corpus.heldout import entry_split
from nmt_serve.training.corpus.segments import Collector, Pair, where


@dataclass(frozen=True)
class Dictionary:
    path: str  # the list's path in its package
    languages: Pair  # the languages of its two sides, in the file's order


DICTIONARIES = {"trans-de-en": Dictionary("usr/share/trans/de-en", ("de", "en"))}

# {grammar}, [usage], <other forms>, /abbreviation/ (slashes not inside a word)
_ANNOTATION = re.compile(r"\s*(?:\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|(?<!\w)/[^/\s]+/(?!\w))")
# a note after a sentence: "How are you? (chat jargon)"
_TRAILING_NOTE = re.compile(r"(?<=[.!?])\s*\([^()]*\)$")
_SENTENCE_END = re.compile(r"[.!?][\"'“”‘’»«]*$")
_MARK = re.compile(r"(?<!\w)(?:etw|jd[mnrs]?|sth|sb)\.|…|\.\.\.|[()/~]")
_OPTIONAL = re.compile(r"\(([^()]*)\)")


def resolve_marks(text: str) -> str:
    """A sentence with its optional words kept as words."""
    return " ".join(_OPTIONAL.sub(r"\1", text).split())


def sentence(text: str) -> str | None:
    """A sub-entry without its annotations, its optional words kept as words, when it is a sentence; else None."""
    text = resolve_marks(_TRAILING_NOTE.sub("", " ".join(_ANNOTATION.sub("", text).split())))
    return text if text[:1].isupper() and _SENTENCE_END.search(text) else None


def alternatives(a: str, b: str) -> list[tuple[str, str]]:
    """The pairs of two aligned sentence sub-entries' alternatives."""
    xs, ys = [x.strip() for x in a.split("; ") if x.strip()], [y.strip() for y in b.split("; ") if y.strip()]
    if len(xs) == 1:
        return [(xs[0], y) for y in ys]
    if len(ys) == 1:
        return [(x, ys[0]) for x in xs]
    return [(xs[0], ys[0])]


def example_pairs(line: str) -> tuple[list[tuple[str, str]], Counter]:
    """The example sentence pairs of one entry (in the file's language order), and what was dropped
    (rule name -> count)."""
    dropped: Counter = Counter()
    sides = line.split(" :: ")
    if len(sides) != 2:
        return [], dropped
    left, right = sides[0].split(" | "), sides[1].split(" | ")
    if len(left) != len(right):
        dropped["unaligned_entry"] += 1
        return [], dropped
    out = []
    for a, b in zip(left, right):
        a, b = sentence(a), sentence(b)
        if a is None or b is None:
            continue  # a word or a term: not what this source is read for
        for x, y in alternatives(a, b):
            if _MARK.search(x) or _MARK.search(y) or sentence(x) is None or sentence(y) is None:
                dropped["dictionary_mark"] += 1
            else:
                out.append((x, y))
    return out, dropped


def dictionary_segments(deb: DebFile, pairs: list[Pair], release: str, cache_dir: Path, collector: Collector) -> dict:
    """Collect a dictionary package's example sentences for the pairs of its two languages; returns
    its manifest entry."""
    dictionary = DICTIONARIES[deb.package]
    root = deb_files.extract(deb, cache_dir, lambda name: "list" if name == dictionary.path else None,
                             selection=dictionary.path)
    entry = {"package": deb.package, "version": deb.version, "sha256": deb.sha256, "file": dictionary.path,
             "licenses": list(deb_files.licenses_in(root))}
    x, y = dictionary.languages
    pair = next((p for p in pairs if set(p) == {x, y}), None)
    if pair is None or not (root / "list").is_file():
        return {**entry, "entries": 0, "example_pairs": {}}
    flip = pair != (x, y)
    entries, found = 0, Counter()
    for line in (root / "list").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        entries += 1
        split = entry_split(deb.package, line)
        examples, dropped = example_pairs(line)
        for rule, n in dropped.items():
            collector.counts.drop(rule, where(split, pair), n)
        units = [(b, a) if flip else (a, b) for a, b in examples]
        if units:
            found[split] += len(units)
            collector.add(split, pair, "dictionary", deb.package, release, units)
    return {**entry, "entries": entries, "example_pairs": dict(sorted(found.items()))}
