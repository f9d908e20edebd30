"""The filtered, deduplicated corpus: collected segments sorted into output sets and written as
line-aligned plain-text files (see the package docstring for the layout)."""
from __future__ import annotations

import hashlib
import logging
from collections import Counter
from pathlib import Path

from nmt_serve.training.corpus.filters import Counts, Deduplicator, LanguageCheck, normalise, pair_rule
from nmt_serve.training.corpus.segments import Pair, Segment, where

log = logging.getLogger("nmt_serve.training.corpus")

# output sets, in the order they are filtered: the held-out sets first, since training pairs that
# repeat a held-out description segment, dictionary sentence or help sentence are dropped (rule in_eval)
SETS = ("eval-short", "eval-dictionary", "eval-help", "eval", "train")
# the held-out subsets of eval by kind: short descriptions, everyday sentences, help pages' prose
SUBSETS = {"eval-short": "ddtp-short", "eval-dictionary": "dictionary", "eval-help": "help"}
# kinds whose held-out segments no training pair may repeat (catalog messages such as "Open" are too
# common to hold out by text)
HELD_OUT_TEXT_KINDS = ("ddtp-short", "ddtp-long", "dictionary", "help")


def members(name: str, segment: Segment) -> bool:
    if name in SUBSETS:
        return segment.split == "eval" and segment.kind == SUBSETS[name]
    return segment.split == name


def select(segments: list[Segment], pairs: list[Pair], counts: Counts,
           language_check: LanguageCheck | None) -> dict[tuple[str, Pair], list[Segment]]:
    """{(set, pair): the segments that pass every rule}, in collection order (first of duplicates kept)."""
    by_set: dict[tuple[str, Pair], list[Segment]] = {(name, pair): [] for name in SETS for pair in pairs}
    for segment in segments:
        for name in SETS:
            if members(name, segment):
                by_set[(name, segment.pair)].append(segment)
    held_out: dict[str, set[str]] = {}  # language -> normalised held-out description segments
    out = {}
    for name in SETS:
        for pair in pairs:
            label = where(name, pair)
            kept, dedup = [], Deduplicator()
            for s in by_set[(name, pair)]:
                rule = pair_rule(s.a, s.b) or dedup.rule(s.a, s.b)
                if rule:
                    counts.drop(rule, label)
                else:
                    kept.append(s)
            if language_check is not None and kept:
                wrong = language_check.wrong(pair, [s.a for s in kept], [s.b for s in kept])
                counts.drop("wrong_language", label, sum(wrong))
                kept = [s for s, w in zip(kept, wrong) if not w]
            if name == "eval":
                for s in kept:
                    if s.kind in HELD_OUT_TEXT_KINDS:
                        held_out.setdefault(pair[0], set()).add(normalise(s.a))
                        held_out.setdefault(pair[1], set()).add(normalise(s.b))
            elif name == "train":
                before = len(kept)
                kept = [s for s in kept if normalise(s.a) not in held_out.get(pair[0], ())
                        and normalise(s.b) not in held_out.get(pair[1], ())]
                counts.drop("in_eval", label, before - len(kept))
            out[(name, pair)] = kept
            log.info("%s: %d pairs", label, len(kept))
    return out


def file_names(name: str, pair: Pair) -> dict[str, str]:
    stem = f"{name}.{pair[0]}-{pair[1]}"
    return {pair[0]: f"{stem}.{pair[0]}", pair[1]: f"{stem}.{pair[1]}", "origin": f"{stem}.origin"}


def write(output: Path, selected: dict[tuple[str, Pair], list[Segment]]) -> dict[str, dict]:
    """Write every set's files; returns {file name: {"lines", "sha256"}}. Files of an earlier build
    that this one does not write are removed, so the directory holds exactly this corpus."""
    output.mkdir(parents=True, exist_ok=True)
    written = {}
    for (name, pair), segments in sorted(selected.items()):
        if not segments:
            continue
        names = file_names(name, pair)
        columns = {pair[0]: [s.a for s in segments], pair[1]: [s.b for s in segments],
                   "origin": [f"{s.kind}\t{s.origin}\t{s.release}" for s in segments]}
        for column, file_name in names.items():
            data = "".join(line.replace("\n", " ") + "\n" for line in columns[column]).encode()
            (output / file_name).write_bytes(data)
            written[file_name] = {"lines": len(segments), "sha256": hashlib.sha256(data).hexdigest()}
    for path in output.iterdir():
        if path.name.startswith(SETS) and path.name not in written:
            path.unlink()
    return dict(sorted(written.items()))


def counts_of(selected: dict[tuple[str, Pair], list[Segment]]) -> dict[str, dict]:
    """{set: {pair: {"pairs": n, by kind...}}} for the manifest."""
    out: dict[str, dict] = {}
    for (name, pair), segments in sorted(selected.items()):
        kinds = Counter(s.kind for s in segments)
        out.setdefault(name, {})[f"{pair[0]}-{pair[1]}"] = {"pairs": len(segments), **dict(sorted(kinds.items()))}
    return out
