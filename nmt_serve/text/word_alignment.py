"""Word alignment in characters, from the engine's token alignment: what HTML translation needs to put
an inline tag ("<b>Hund</b>") around the right target words.

The engine aligns each target token (a sentencepiece piece) to the source token it attends to most;
here pieces are located in their texts (the pieces of a text, markers removed, appear in it in order)
and grouped into words (a piece starting with "▁" starts one).
"""
from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter

WORD_START = "▁"
Span = tuple[int, int]


def piece_spans(text: str, pieces: list[str]) -> list[Span]:
    """Where each piece sits in text; a piece not found there (a special token, or text the tokenizer
    normalized) gets an empty span at the current position, so later pieces still line up."""
    spans, cursor = [], 0
    for piece in pieces:
        core = piece.replace(WORD_START, " ").strip()
        at = text.find(core, cursor) if core and not (piece.startswith("<") and piece.endswith(">")) else -1
        # a piece is never far ahead of the previous one: a match further on is a different occurrence
        if at < 0 or text[cursor:at].strip():
            spans.append((cursor, cursor))
            continue
        spans.append((at, at + len(core)))
        cursor = at + len(core)
    return spans


def word_of_piece(pieces: list[str]) -> list[int]:
    """The word index of each piece."""
    words, index = [], -1
    for i, piece in enumerate(pieces):
        if i == 0 or piece.startswith(WORD_START) or piece.startswith("<"):
            index += 1
        words.append(index)
    return words


def _word_spans(spans: list[Span], words: list[int]) -> dict[int, Span]:
    out: dict[int, Span] = {}
    for (start, end), w in zip(spans, words):
        if end == start:
            continue
        s, e = out.get(w, (start, end))
        out[w] = (min(s, start), max(e, end))
    return out


def word_alignment(source: str, target: str, source_pieces: list[str], target_pieces: list[str],
                   alignment: list[int]) -> list[tuple[Span, Span]]:
    """For each target word found in `target`: (its span there, the span in `source` of the source
    word its pieces attend to most)."""
    src_words, tgt_words = word_of_piece(source_pieces), word_of_piece(target_pieces)
    src_spans = _word_spans(piece_spans(source, source_pieces), src_words)
    tgt_spans = _word_spans(piece_spans(target, target_pieces), tgt_words)
    votes: dict[int, Counter] = {}
    for t, s in enumerate(alignment[: len(target_pieces)]):
        if 0 <= s < len(src_words) and src_words[s] in src_spans:
            votes.setdefault(tgt_words[t], Counter())[src_words[s]] += 1
    return [(tgt_spans[w], src_spans[votes[w].most_common(1)[0][0]]) for w in sorted(tgt_spans) if w in votes]


def _word_index(words: list[Span], span: Span) -> int | None:
    """The word (of `words`, in order) that holds the start of span, if any."""
    at = bisect_right(words, (span[0], float("inf"))) - 1
    return at if at >= 0 and span[0] < words[at][1] else None


def _key(word: str) -> str:
    """The word as compared across languages: case and the punctuation around it set aside."""
    start, end = 0, len(word)
    while start < end and not word[start].isalnum():
        start += 1
    while end > start and not word[end - 1].isalnum():
        end -= 1
    return word[start:end].casefold()


def complete_alignment(source: str, target: str, pairs: list[tuple[Span, Span]],
                       words: re.Pattern = re.compile(r"\S+")) -> list[tuple[Span, Span]]:
    """The alignment with the source words it left out paired where the translation shows where they
    went: attention gives each target word one source word, and often not the one it translates (an
    article attends to its noun, the first word to none), so a source word can be left with no target
    word although the translation has it. Three cases are safe to mend:

    - a source word written the same in the translation (a name, a number), the only one of its kind
      on each side, takes that target word;
    - between two aligned neighbours that keep their order, the target words no source word claimed
      go to the source words no target word claimed, in order (where there are more of them, each
      source word takes its share);
    - a single source word between two aligned neighbours, where the right one has several target
      words and the first of them stands right after the left one's, takes that first word (an article
      attends to its noun).

    A source word still unpaired after this has no word of its own in the translation (the model
    dropped it, or it lives inside a word aligned elsewhere). `words`: what a word is in both texts;
    a pair whose spans start outside every word is kept as it is and mends nothing."""
    sw = [m.span() for m in words.finditer(source)]
    tw = [m.span() for m in words.finditer(target)]
    links = [(_word_index(tw, t), _word_index(sw, s), (t, s)) for t, s in pairs]
    source_paired = {s for _, s, _ in links if s is not None}
    same: dict[str, list[int]] = {}
    for i, (a, b) in enumerate(sw):
        same.setdefault(_key(source[a:b]), []).append(i)
    target_same: dict[str, list[int]] = {}
    for k, (a, b) in enumerate(tw):
        target_same.setdefault(_key(target[a:b]), []).append(k)
    moved: dict[int, int] = {}  # target word -> source word, replacing its pairs
    for key, found in same.items():
        if key and len(found) == 1 and found[0] not in source_paired and len(target_same.get(key, ())) == 1:
            moved[target_same[key][0]] = found[0]
    links = [x for x in links if x[0] not in moved] + [(k, i, (tw[k], sw[i])) for k, i in moved.items()]
    by_source: dict[int, list[int]] = {}
    for k, i, _ in links:
        if k is not None and i is not None:
            by_source.setdefault(i, []).append(k)
    target_paired = {k for k, _, _ in links if k is not None}
    added, taken = [], set()
    i = 0
    while i < len(sw):
        if i in by_source:
            i += 1
            continue
        j = i
        while j < len(sw) and j not in by_source:
            j += 1
        low = max(by_source[i - 1]) if i > 0 else -1
        high = min(by_source[j]) if j < len(sw) else len(tw)
        free = [k for k in range(low + 1, high) if k not in target_paired]
        if not free and j - i == 1 and j < len(sw) and len(by_source[j]) > 1 and high == low + 1:
            # one word between its neighbours and none of the right one's words missing from there: the
            # first of them stands where this word goes ("auf einer Leiter": "on a ladder", "a" attending
            # to "Leiter"), so it is this word's
            free = [high]
            taken.add(high)
            by_source[j].remove(high)
        spread = len(free) > j - i  # more target words than source words: each source word takes a share
        added += [(tw[k], sw[i + (n * (j - i) // len(free) if spread else n)]) for n, k in enumerate(free)]
        i = j
    return [x[2] for x in links if x[0] not in taken] + added
