"""Lexical constraints in the device search: dynamic beam allocation (lexical_constraints.py) in tensor
form, per group of K rows (one sentence's beams), so that constrained and free sentences share one
step program and it can be captured as a CUDA graph (no host reads, no Python per row).

Each group's constraints sit in fixed-shape buffers, written when its sentence joins: the terms'
tokens padded into (groups, MAX_TERMS, MAX_TERM_TOKENS) with their lengths, the avoided sequences
likewise, and per row its progress on each term (tokens of it matched). A step then
  - masks per row (`mask`): the last token of an avoided sequence whose other tokens the row has just
    written, word continuations right after a term, and eos and the sentence's end while a term is
    unmet (not at the length limit);
  - chooses per group (`choose`) among a fixed number M of candidates: its best 2K (as the free
    search), each beam's own best OWN_BEST, and for every beam and term the token that advances it
    (and the term's first, where a partial match could start over); the same list, in the same
    order, as the eager search's, duplicates dropped where they first repeat. The banks and their
    round-robin are counts over M x M comparisons: a candidate's rank in its bank (those with as
    many term tokens matched, better score first, earlier first among equal scores), its turn in
    the round-robin (rank, then more progress first), its place among the K taken (score, then
    turn); candidates with no score (-inf) fill what is left, in list order. With M = 4K + 2K * T
    (T: term slots, the running sentences' most terms rounded up to a power of two: one program per
    T; 48 candidates at K = 4 with 3 or 4 terms) this is a few small tensors per group beside a decoder step.
The result is the eager search's choice, candidate for candidate (tests/unit/test_device_constraints.py).

A free group (no constraints) goes through the same choice and gets what search.choose_beams gives
it: one bank, the best K that are not eos, in order. Sentences whose constraints exceed the buffers
(`fits`) run in the eager search.
"""
from __future__ import annotations

import math

import torch

from nmt_serve.inference.lexical_constraints import OWN_BEST, LexicalConstraints
from nmt_serve.inference.static_decoder import bucket_of, buckets

# the buffers' shape: terms per sentence and tokens per term, avoided sequences and their tokens
MAX_TERMS = 8
MAX_TERM_TOKENS = 32
MAX_AVOIDED = 32
MAX_AVOIDED_TOKENS = 8


def term_slots(constraints: list[LexicalConstraints | None]) -> int:
    """The term slots a step over these sentences needs: their most terms, rounded up to a power of two."""
    return bucket_of(max([len(c.include) for c in constraints if c] + [1]), buckets(MAX_TERMS))


def fits(constraints: LexicalConstraints | None) -> bool:
    """Whether a sentence's constraints fit the device buffers."""
    if not constraints:
        return True
    return (len(constraints.include) <= MAX_TERMS and all(len(t) <= MAX_TERM_TOKENS for t in constraints.include)
            and len(constraints.avoid) <= MAX_AVOIDED and all(len(a) <= MAX_AVOIDED_TOKENS for a in constraints.avoid))


class DeviceConstraints:
    """Fixed-address constraint state for `groups` groups of K rows over a vocabulary of V."""

    def __init__(self, groups: int, K: int, V: int, device: torch.device):
        C, Lc, A, La = MAX_TERMS, MAX_TERM_TOKENS, MAX_AVOIDED, MAX_AVOIDED_TOKENS
        R = groups * K
        self.K, self.V = K, V
        long = dict(dtype=torch.long, device=device)
        self.include = torch.full((groups, C, Lc), -1, **long)  # each term's tokens, -1 past its end
        self.include_len = torch.zeros(groups, C, **long)  # 0: no term
        self.avoid = torch.full((groups, A, La), -1, **long)
        self.avoid_len = torch.zeros(groups, A, **long)
        self.has_terms = torch.zeros(groups, dtype=torch.bool, device=device)
        self.whole_words = torch.zeros(groups, dtype=torch.bool, device=device)  # terms must end a word
        self.progress = torch.zeros(R, C, **long)  # per row and term: tokens matched
        self.continuations = torch.zeros(V, dtype=torch.bool, device=device)  # the tokenizer's (LexicalConstraints.continuations)
        self._continuations_from: torch.Tensor | None = None
        self.hold_ends = torch.zeros(groups, dtype=torch.bool, device=device)  # no sentence end before the terms
        self.sentence_ends = torch.zeros(V, dtype=torch.bool, device=device)  # the tokenizer's (LexicalConstraints.sentence_ends)
        self._sentence_ends_from: torch.Tensor | None = None
        # constants of the step
        self.group_of_row = torch.arange(R, device=device) // K
        self.row_offset = torch.arange(R, device=device) * V  # a row's first index in a flattened (rows, V)
        self.term_offset = (torch.arange(groups, device=device)[:, None] * C + torch.arange(C, device=device)) * Lc  # (groups, C)
        self.tail = torch.arange(max(Lc, La), device=device)
        M = 4 * K + 2 * K * C  # candidates per group at most: top 2K, K * OWN_BEST own, K * C * 2 wanted
        position = torch.arange(M, device=device)
        self.first_k = position < K
        self.earlier = position[None, :] < position[:, None]  # [i, j]: j comes before i in the list
        self.own_beam = torch.arange(K, device=device).repeat_interleave(OWN_BEST)
        self.wanted_beam = {T: torch.arange(K, device=device).repeat_interleave(2 * T) for T in buckets(C)}

    # ------------------------------------------------------------------ joining
    def load(self, groups: torch.Tensor, constraints: list[LexicalConstraints | None]) -> None:
        """Groups (on the device) take these sentences' constraints (None: free) and start their rows'
        progress at 0. Everything goes in one copy to the device."""
        n = len(constraints)
        C, Lc, A, La = MAX_TERMS, MAX_TERM_TOKENS, MAX_AVOIDED, MAX_AVOIDED_TOKENS
        include = torch.full((n, C, Lc), -1, dtype=torch.long)
        avoid = torch.full((n, A, La), -1, dtype=torch.long)
        flags = torch.zeros(n, 4, dtype=torch.long)
        for i, lex in enumerate(constraints):
            if not lex:
                continue
            if not fits(lex):
                raise ValueError("these constraints do not fit the device buffers (see fits())")
            for c, term in enumerate(lex.include):
                include[i, c, : len(term)] = torch.tensor(term)
            for a, seq in enumerate(lex.avoid):
                avoid[i, a, : len(seq)] = torch.tensor(seq)
            whole = lex.continuations is not None and bool(lex.include)
            hold = lex.sentence_ends is not None and bool(lex.include)
            flags[i] = torch.tensor([1, bool(lex.include), whole, hold])
            if whole and lex.continuations is not self._continuations_from:
                self.continuations.copy_(lex.continuations)  # one per tokenizer: copied once
                self._continuations_from = lex.continuations
            if hold and lex.sentence_ends is not self._sentence_ends_from:
                self.sentence_ends.copy_(lex.sentence_ends)
                self._sentence_ends_from = lex.sentence_ends
        host = torch.cat([include.view(n, -1), (include >= 0).sum(-1), avoid.view(n, -1), (avoid >= 0).sum(-1), flags], 1)
        packed = host.to(self.include.device)
        sizes = [C * Lc, C, A * La, A, 4]
        inc, inc_len, av, av_len, flag = packed.split(sizes, 1)
        self.include[groups] = inc.view(n, C, Lc)
        self.include_len[groups] = inc_len
        self.avoid[groups] = av.view(n, A, La)
        self.avoid_len[groups] = av_len
        _, self.has_terms[groups], self.whole_words[groups], self.hold_ends[groups] = flag.bool().unbind(1)
        rows = (groups[:, None] * self.K + torch.arange(self.K, device=groups.device)).view(-1)
        self.progress[rows] = 0

    def keep(self, groups: torch.Tensor, rows: torch.Tensor) -> None:
        """Groups [0, len(groups)) become the old `groups`, rows likewise (SearchSlots.keep)."""
        m = groups.numel()
        for buffer in (self.include, self.include_len, self.avoid, self.avoid_len, self.has_terms, self.whole_words, self.hold_ends):
            buffer[:m] = buffer[groups]
        self.progress[: rows.numel()] = self.progress[rows]

    # ------------------------------------------------------------------ the step
    def mask(self, lp: torch.Tensor, history: torch.Tensor, pos: torch.Tensor, max_len: torch.Tensor, eos: int, terms: int) -> None:
        """In place on lp (B, V), after the search's own constraints: lexical_constraints.mask_lexical.
        history (B, T): the rows' tokens so far, pos (B,) how many, max_len (B,) their limit; terms:
        the term slots in use (term_slots)."""
        B, V = lp.shape
        T = history.size(1)
        group = self.group_of_row[:B]
        # avoided sequences: the last token is banned where the row has just written the others
        avoid, avoid_len = self.avoid[group], self.avoid_len[group]  # (B, A, La), (B, A)
        A, La = avoid.shape[1:]
        head = avoid_len - 1  # tokens before the banned one
        j = self.tail[: La - 1]
        written = history.gather(1, (pos[:, None, None] - head[:, :, None] + j).clamp(0, T - 1).view(B, -1)).view(B, A, La - 1)
        after_head = ((written == avoid[:, :, :-1]) | (j >= head[:, :, None])).all(-1) & (pos[:, None] >= head) & (avoid_len > 0)
        last = avoid.gather(2, head.clamp(min=0)[:, :, None]).squeeze(2).clamp(min=0)  # (B, A)
        # adding -inf (or 0) rather than writing it: several sequences may name the same token
        lp.view(-1).index_add_(0, (self.row_offset[:B, None] + last).view(-1),
                               torch.where(after_head, -math.inf, 0.0).view(-1))
        # a term just written: the next piece must start a word
        length = self.include_len[group, :terms]  # (B, terms)
        terms = self.include[group, :terms]  # (B, terms, Lc)
        Lc = terms.size(2)
        j = self.tail[:Lc]
        written = history.gather(1, (pos[:, None, None] - length[:, :, None] + j).clamp(0, T - 1).view(B, -1)).view(B, -1, Lc)
        ends_term = ((written == terms) | (j >= length[:, :, None])).all(-1) & (pos[:, None] >= length) & (length > 0)
        ban = (ends_term.any(-1) & self.whole_words[group])[:, None] & self.continuations  # (B, V)
        # ... but the next piece of a term not yet written: a term nested in another ("zebra", "zebras") goes on into it
        progress = self.progress[:B, : length.size(1)]
        next_piece = terms.gather(2, progress.clamp(max=Lc - 1)[:, :, None]).squeeze(2)  # (B, terms)
        exempt = torch.zeros(B, V + 1, dtype=torch.bool, device=lp.device).scatter_(1, torch.where(progress < length, next_piece, V), True)
        lp.masked_fill_(ban & ~exempt[:, :V], -math.inf)
        # eos, and the sentence's end where its source has none before, only once every term is in, or at the length limit
        met = (progress >= length).all(-1)
        unmet = ~met & (pos + 1 < max_len)
        lp.masked_fill_((unmet & self.hold_ends[group])[:, None] & self.sentence_ends, -math.inf)
        lp[:, eos].masked_fill_(unmet, -math.inf)

    def choose(self, candidates: torch.Tensor, top_scores: torch.Tensor, top_index: torch.Tensor, alive: torch.Tensor,
               eos: int, terms: int) -> dict[str, torch.Tensor]:
        """One step's choice for G groups: lexical_constraints.choose_constrained on every group at once.

        candidates (G, K*V): beam-summed scores; top_scores, top_index (G, 2K) their best, best first;
        alive (G,): groups still searching; terms: the term slots in use (term_slots), C below.
        Returns, per candidate (G, M): `ended` (an eos that ends a
        hypothesis, at most one per beam, in list order), `unmet` (it ends with a term unmet), `beam`,
        `score`; and for the K that continue (G, K): `next_beam`, `next_token`, `next_score`, and
        `next_progress` (G, K, C)."""
        K, V = self.K, self.V
        G, C = candidates.size(0), terms
        M = 4 * K + 2 * K * C
        progress = self.progress[: G * K, :C].view(G, K, C)
        length = self.include_len[:G, :C]
        first_token = self.include[:G, None, :C, 0]  # (G, 1, C)
        own_score, own_token = candidates.view(G, K, V).topk(OWN_BEST, dim=-1)  # (G, K, OWN_BEST)
        # per beam and term: its next token, and its first where a partial match could start over
        unmet = progress < length[:, None, :]  # (G, K, C)
        wanted = torch.stack((self._term_token(progress, G), first_token.expand(G, K, C)), -1).view(G, -1)
        wanted_ok = torch.stack((unmet, unmet & (progress > 0)), -1).view(G, -1)
        wanted_beam = self.wanted_beam[C].expand(G, -1)
        wanted_score = candidates.gather(1, wanted_beam * V + wanted.clamp(min=0))

        beam = torch.cat([top_index // V, self.own_beam.expand(G, -1), wanted_beam], 1)  # (G, M)
        token = torch.cat([top_index % V, own_token.view(G, -1), wanted], 1)
        score = torch.cat([top_scores, own_score.view(G, -1), wanted_score], 1)
        valid = torch.cat([torch.ones_like(top_index, dtype=torch.bool), self.has_terms[:G, None].expand(G, K * OWN_BEST), wanted_ok], 1)
        key = beam * V + token
        earlier = self.earlier[:M, :M]
        valid &= ~(valid[:, None, :] & (key[:, :, None] == key[:, None, :]) & earlier).any(-1)  # first of each (beam, token)

        is_eos = token == eos
        live = score > -math.inf
        beam_met = (progress >= length[:, None, :]).all(-1)  # (G, K)
        met_all = beam_met.gather(1, beam)
        ended = valid & is_eos & live & (self.first_k[:M] | (self.has_terms[:G, None] & met_all)) & alive[:, None]

        # each candidate's progress after its token (LexicalConstraints.advance): a closed term stays met, a
        # term just written is closed by a word start and broken by a continuation, a match goes on, a
        # broken one starts over (at 1 where the token begins the term)
        before = progress.gather(1, beam[:, :, None].expand(-1, -1, C))  # (G, M, C)
        t = token[:, :, None]
        restart = (first_token == t).long()
        span = length[:, None, :]
        after = torch.where(before > span, before,
                            torch.where(before == span, torch.where(self.continuations[token][:, :, None] & self.whole_words[:G, None, None], restart, span + 1),
                                        torch.where(self._term_token(before, G) == t, before + 1, restart)))
        bank = torch.minimum(after, span).sum(-1)  # term tokens matched

        banked = valid & ~is_eos & live
        spare = valid & ~is_eos & ~live
        s_i, s_j = score[:, :, None], score[:, None, :]
        ahead = (s_j > s_i) | ((s_j == s_i) & earlier)  # [g, i, j]: j ranks before i on score
        b_i, b_j = bank[:, :, None], bank[:, None, :]
        rank = (banked[:, None, :] & (b_j == b_i) & ahead).sum(-1)  # place within its bank
        r_i, r_j = rank[:, :, None], rank[:, None, :]
        turn = (banked[:, None, :] & ((r_j < r_i) | ((r_j == r_i) & (b_j > b_i)))).sum(-1)  # round-robin, most progress first
        taken = banked & (turn < K)
        t_i, t_j = turn[:, :, None], turn[:, None, :]
        place = (taken[:, None, :] & ((s_j > s_i) | ((s_j == s_i) & (t_j < t_i)))).sum(-1)  # best score first
        spare_place = taken.sum(1, keepdim=True) + (spare[:, None, :] & earlier).sum(-1)
        dest = torch.where(taken, place, torch.where(spare & (spare_place < K), spare_place, K))  # K: not taken

        next_beam = beam.new_zeros(G, K + 1).scatter_(1, dest, beam)[:, :K]
        next_token = token.new_zeros(G, K + 1).scatter_(1, dest, token)[:, :K]
        next_score = score.new_full((G, K + 1), -math.inf).scatter_(1, dest, score)[:, :K]
        next_progress = after.new_zeros(G, K + 1, C).scatter_(1, dest[:, :, None].expand(-1, -1, C), after)[:, :K]
        return dict(ended=ended, unmet=self.has_terms[:G, None] & ~met_all, beam=beam, score=score,
                    next_beam=next_beam, next_token=next_token, next_score=next_score, next_progress=next_progress)

    def _term_token(self, done: torch.Tensor, G: int) -> torch.Tensor:
        """(G, N, C) tokens matched of each of the first C terms -> the term's next token (-1 past its end)."""
        Lc = self.include.size(2)
        return self.include.view(-1)[self.term_offset[:G, None, : done.size(2)] + done.clamp(max=Lc - 1)]

