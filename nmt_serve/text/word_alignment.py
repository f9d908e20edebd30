"""Word alignment in characters, from the engine's token alignment: what HTML translation needs to put
an inline tag ("<b>Hund</b>") around the right target words.

The engine aligns each target token (a sentencepiece piece) to the source token it attends to most;
here pieces are located in their texts (the pieces of a text, markers removed, appear in it in order)
and grouped into words (a piece starting with "▁" starts one).
"""
from __future__ import annotations

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
