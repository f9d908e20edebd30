"""Lexical constraints on a sentence's translation: token sequences that must appear (a glossary's
target terms) and sequences that must not (`avoid`), enforced in beam search by dynamic beam
allocation (Post & Vilar 2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation").

Each hypothesis carries its progress: per positive constraint, how many of its tokens it has matched
(all of them: met). At every step a sentence's candidates are its best 2K continuations (as in
search.choose_beams), each beam's own best two, and for every beam the token that would advance
each of its unmet constraints, so that a term the model would never rank highly still gets tried,
and a beam that placed it can go on though its scores now rank below the free beams'. The candidates fall
into banks by the number of constraint tokens they have matched, and the K beams are taken round-robin
from the banks, most progress first, best score first within a bank: a beam slot goes to progress on
the terms even where its score is lower, and free hypotheses are not crowded out either.

A term counts as a whole word: right after it, pieces that continue its last word are banned, except
the next piece of another term it is nested in ("zebra", "zebras"), which goes on into that term and
breaks the shorter one as a word (its progress says whether the word is still open: Progress).

A hypothesis may end (eos) only when every positive constraint is met, nor end its sentence
(`sentence_ends`: a piece that is only a full stop, question or exclamation mark): a model that reaches
the end of its own sentence with a term unplaced writes the term after it, as a fragment ("A child
splashing in the water. one": with a glossary of function words the de-en model did that to 27 of 116
captions). At its length limit eos is forced and it ends unmet: the caller then translates the sentence
again without the positive constraints and says so (`unmet`): the best free translation and a flag,
never an error.
Negative constraints ban, at each step, the last token of an avoided sequence whose other tokens the
hypothesis has just produced (a one-token sequence: always).

The bookkeeping is a few numbers per beam, done on the host beside choose_beams (whose reasons hold
here too); what runs per row on the device is two index operations per step: the banned tokens' and
the constraint tokens' scores.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# per positive constraint: tokens of it matched so far; len(term): just written, its word still open (a
# piece that continues the word breaks it); len(term) + 1: written as a whole word (closed)
Progress = tuple[int, ...]
OWN_BEST = 2  # each beam's own best continuations among a constrained sentence's candidates (Post & Vilar 2018)


@dataclass(frozen=True)
class LexicalConstraints:
    """One sentence's constraints, as target token ids."""

    include: tuple[tuple[int, ...], ...] = ()  # each must appear in the translation
    avoid: tuple[tuple[int, ...], ...] = ()  # none may appear
    # (V,) bool: the target pieces that continue a word (no word-start marker); after a term they are
    # banned, so that a term is a whole word ("lass", not "lasso"). One tensor per tokenizer, shared.
    continuations: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # (V,) bool: the pieces that end a sentence, banned with eos while a term is unmet. None where the
    # source holds such a mark before its end (a number, an abbreviation, two sentences): the
    # translation may need one there too. One tensor per tokenizer, shared.
    sentence_ends: torch.Tensor | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if any(not seq for seq in (*self.include, *self.avoid)):
            raise ValueError("a constraint must have at least one token")

    def __bool__(self) -> bool:
        return bool(self.include or self.avoid)

    @property
    def tokens(self) -> int:
        """Constraint tokens in all: the most any hypothesis can match."""
        return sum(len(seq) for seq in self.include)

    def start(self) -> Progress:
        return (0,) * len(self.include)

    def advance(self, progress: Progress, token: int) -> Progress:
        """The progress after `token`. A partial match that the token breaks starts again (from 1 when
        the token begins the constraint anew); a term just written is closed by a piece that starts a
        word and broken by one that continues its last word (which only another term's next piece may
        be: mask_lexical bans the others); a closed one stays met."""
        out = []
        for seq, done in zip(self.include, progress):
            if done > len(seq):
                out.append(done)
            elif done == len(seq):
                if self.continuations is not None and bool(self.continuations[token]):
                    out.append(1 if seq[0] == token else 0)
                else:
                    out.append(done + 1)
            elif seq[done] == token:
                out.append(done + 1)
            else:
                out.append(1 if seq[0] == token else 0)
        return tuple(out)

    def met(self, progress: Progress) -> int:
        """Constraint tokens matched: the hypothesis's bank."""
        return sum(min(done, len(seq)) for seq, done in zip(self.include, progress))

    def all_met(self, progress: Progress) -> bool:
        """Every term written (eos closes the last word, so a term just written counts)."""
        return all(done >= len(seq) for seq, done in zip(self.include, progress))

    def wanted(self, progress: Progress) -> list[int]:
        """The tokens that advance an unmet constraint (its next token; its first, too, where a partial
        match could instead start over)."""
        found = []
        for seq, done in zip(self.include, progress):
            if done < len(seq):
                found.append(seq[done])
                if done:
                    found.append(seq[0])
        return list(dict.fromkeys(found))

    def holds(self, tokens: list[int]) -> bool:
        """Whether a translation already has every term, each as whole words (not followed by a piece that
        continues its last word): then the model wrote them itself and needs no constraint."""
        n = len(tokens)
        for seq in self.include:
            m = len(seq)
            if not any(tuple(tokens[i : i + m]) == seq and (i + m == n or self.continuations is None or not bool(self.continuations[tokens[i + m]]))
                       for i in range(n - m + 1)):
                return False
        return True

    def banned(self, tokens: list[int]) -> list[int]:
        """Tokens that would complete an avoided sequence after `tokens` (the hypothesis so far)."""
        found = []
        for seq in self.avoid:
            head = len(seq) - 1
            if head == 0 or (len(tokens) >= head and tuple(tokens[-head:]) == seq[:-1]):
                found.append(seq[-1])
        return found


def choose_constrained(constraints: LexicalConstraints, progress: list[Progress], scores: list[float], indices: list[int],
                       extra: list[tuple[int, int, float]], K: int, V: int, eos: int
                       ) -> tuple[list[tuple[int, float]], list[tuple[int, int, float, Progress]]]:
    """One constrained sentence's step: search.choose_beams with banks.

    progress: each beam's; scores, indices: its best 2K candidates (flat beam * V + token), best first;
    extra: (beam, token, score) candidates that advance a constraint. Returns the hypotheses that end
    (beam, score), an eos among the best K (the caller masked eos where constraints are unmet, so
    these meet them, or are at their limit), and the K that continue, (beam, token, score, progress)."""
    ended: list[tuple[int, float]] = []
    seen: set[tuple[int, int]] = set()
    banks: dict[int, list[tuple[float, int, int, Progress]]] = {}
    candidates = [(*divmod(index, V), score) for index, score in zip(indices, scores)] + extra
    spare: list[tuple[int, int, float, Progress]] = []  # impossible ones (-inf: a beam not yet live, a banned token)
    for c, (beam, token, score) in enumerate(candidates):
        if (beam, token) in seen:
            continue
        seen.add((beam, token))
        if token == eos:
            # among the sentence's best K, or a beam's own best that has met every term (a sentence with
            # avoided terms only has no terms to meet: it ends as a free one, or its search would stop early)
            if score > -math.inf and (c < K or constraints.include and constraints.all_met(progress[beam])):
                ended.append((beam, score))
            continue
        after = constraints.advance(progress[beam], token)
        if score == -math.inf:
            spare.append((beam, token, score, after))
        else:
            banks.setdefault(constraints.met(after), []).append((score, beam, token, after))
    for bank in banks.values():
        bank.sort(key=lambda c: -c[0])
    order = [banks[b] for b in sorted(banks, reverse=True)]
    continuing: list[tuple[int, int, float, Progress]] = []
    depth = 0
    while len(continuing) < K and any(depth < len(bank) for bank in order):
        for bank in order:
            if depth < len(bank) and len(continuing) < K:
                score, beam, token, after = bank[depth]
                continuing.append((beam, token, score, after))
        depth += 1
    continuing.sort(key=lambda c: -c[2])  # best first, as choose_beams returns them
    continuing += spare[: K - len(continuing)]  # K rows continue, as with choose_beams
    return ended, continuing

def mask_lexical(lp: torch.Tensor, lexical: list[LexicalConstraints | None], progress: list[list[Progress]],
                 history: Callable[[int], list[int]], K: int, at_max: list[bool], eos: int) -> None:
    """lp (N*K, V) in place: avoided sequences' last tokens banned, word continuations right after a
    term (but those that go on into another term), and eos and the sentence's end while positive
    constraints are unmet (except at the length limit, where eos is the one choice). lexical, progress, at_max: per group of K rows (None: a free sentence, or an empty
    group); history(row): the row's tokens so far."""
    rows: list[int] = []
    tokens: list[int] = []
    whole_words: list[int] = []  # rows that have just written a term's last piece
    open_rows: list[int] = []  # rows that may not end their sentence yet
    for b, lex in enumerate(lexical):
        if not lex:
            continue
        for k in range(K):
            row = b * K + k
            if lex.avoid:
                for token in lex.banned(history(row)):
                    rows.append(row)
                    tokens.append(token)
            if lex.continuations is not None and lex.include:
                tail = history(row)
                if any(len(tail) >= len(seq) and tuple(tail[-len(seq):]) == seq for seq in lex.include):
                    # a term nested in another ("zebra", "zebras") may go on into it
                    whole_words.append((row, [seq[done] for seq, done in zip(lex.include, progress[b][k]) if done < len(seq)]))
            if not at_max[b] and not lex.all_met(progress[b][k]):
                rows.append(row)
                tokens.append(eos)
                if lex.sentence_ends is not None:
                    open_rows.append(row)
    if open_rows:
        ends = next(lex.sentence_ends for lex in lexical if lex and lex.sentence_ends is not None)
        held = torch.tensor(open_rows, device=lp.device)
        lp[held] = lp[held].masked_fill(ends, -math.inf)
    if rows:
        lp[torch.tensor(rows, device=lp.device), torch.tensor(tokens, device=lp.device)] = -math.inf
    if whole_words:
        continuations = next(lex.continuations for lex in lexical if lex and lex.continuations is not None)
        for row, exempt in whole_words:
            kept = lp[row, exempt].clone() if exempt else None
            lp[row].masked_fill_(continuations, -math.inf)
            if exempt:
                lp[row, exempt] = kept


def constraint_candidates(candidates: torch.Tensor, lexical: list[LexicalConstraints | None], progress: list[list[Progress]],
                          V: int) -> list[list[tuple[int, int, float]]]:
    """Per running sentence, (beam, token, score): each of its beams' own OWN_BEST best tokens (a beam
    that has placed a term further than the others must be able to go on, though its continuations
    rank below theirs), and every token that advances one of a beam's unmet constraints.
    candidates (N, K*V) are the beam-summed scores."""
    N = candidates.size(0)
    K = candidates.size(1) // V
    constrained = [b for b, lex in enumerate(lexical) if lex and lex.include]
    out: list[list[tuple[int, int, float]]] = [[] for _ in lexical]
    if not constrained:
        return out
    index = torch.tensor(constrained, device=candidates.device)
    own_scores, own_tokens = candidates.view(N, K, V).index_select(0, index).topk(OWN_BEST, dim=-1)  # (n, K, OWN_BEST)
    for b, row_scores, row_tokens in zip(constrained, own_scores.tolist(), own_tokens.tolist()):
        for k in range(K):
            out[b] += [(k, t, sc) for t, sc in zip(row_tokens[k], row_scores[k])]
    wanted = [(b, k, t) for b in constrained for k, p in enumerate(progress[b]) for t in lexical[b].wanted(p)]
    if wanted:
        rows = torch.tensor([b for b, _, _ in wanted], device=candidates.device)
        cols = torch.tensor([k * V + t for _, k, t in wanted], device=candidates.device)
        for (b, k, t), sc in zip(wanted, candidates[rows, cols].tolist()):
            out[b].append((k, t, sc))
    return out
