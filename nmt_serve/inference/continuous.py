"""Continuous (iteration-level) batching: a running search that sentences join and leave step by step.

The batched searches of search.py take a fixed batch and run it to the end. A server fed one sentence
per request would then either wait to gather a batch or leave the engine idle while the last long
sentence of a batch finishes, and a short request arriving meanwhile would wait behind it. Here
(as in Orca and vLLM) the batch is a running set of rows:

    search = ContinuousSearch(runner, beam_size=4)
    search.add([Sentence(key, src_ids, max_length=...)])   # encodes them, their cache rows join
    finished = search.step()                               # one token for every row; [(key, n-best)]

`add` runs the encoder of the new sentences only and appends their rows to the KV cache at the
current step (see KVCache.join: their history starts there). `step` decodes one token for every
row; a sentence that is done leaves at once, with its rows. The search of each sentence is the one
of search.py (the same constraints, the same choice among the 2K best candidates, the same
finished-hypothesis rule), run at the sentence's own step count, so its result is the one it gets
when translated alone (the tests hold it to that).

On the CPU a greedy step's choice is one call of greedy_pick's kernel, and a beam step of a few groups finds its
candidates in one call of beam_pick's, where only the bans and the max lengths apply (no forced token, lexical
constraint or early eos among the running sentences).

All sentences of one search share the beam size and min_length (they shape the rows and the eos
rule); max_length, length_penalty and the n-best size are per sentence. Options that need the
eager reference (n-gram blocking, no cache) are not supported here.

A sentence with an `attention_span` also gets, per hypothesis, what a forced decoding of it would
read from the cross-attention (averaged over layers and heads): each target token's entropy over the
source's own pieces and the source position it attends most, kept step by step along its beam. The
service's `detached` check and inline HTML tags read them instead of decoding the translation again.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Hashable

import torch

from nmt_serve.inference import beam_pick, greedy_pick
from nmt_serve.inference.attention import attention_backends
from nmt_serve.inference.cache import KVCache
from nmt_serve.inference.lexical_constraints import (
    LexicalConstraints,
    Progress,
    choose_constrained,
    constraint_candidates,
    mask_lexical,
)
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import (
    AT_MAX_EOS,
    GROUPED_BEAM_MIN_ROWS,
    SearchHypothesis,
    banned_tokens,
    choose_beams,
    normalize,
    ranking,
)
from nmt_serve.inference.top_k import top_k
from nmt_serve.network.masks import pad_batch

INITIAL_CAPACITY = 64  # decoder positions preallocated; the cache doubles it when needed


@dataclass
class Sentence:
    """One sentence to translate: its caller's key, its source ids (eos included) and its options."""

    key: Hashable
    src: list[int]
    max_length: int  # tokens it may generate, eos included (see search.max_lengths_for)
    length_penalty: float = 1.0
    num_hypotheses: int = 1
    prefix: tuple[int, ...] = ()  # tokens its translation is forced to start with (SearchOptions.target_prefix)
    constraints: LexicalConstraints | None = None  # terms it must contain / avoid (lexical_constraints.py)
    # source positions [first, last) of its own pieces (its language tag and eos left out): its hypotheses
    # then carry, per target token, the entropy of the cross-attention over them and the source position
    # it attends most
    attention_span: tuple[int, int] | None = None


@dataclass
class _Running:
    sentence: Sentence
    beams: list[list[int]]  # generated tokens of each live beam (K of them once it has started)
    step: int = 0  # tokens generated so far
    finished: list[SearchHypothesis] = field(default_factory=list)
    cancelled: bool = False
    progress: list[Progress] = field(default_factory=list)  # each beam's, on its positive constraints
    entropies: list[list[float]] = field(default_factory=list)  # each beam's, per token (attention_span)
    looks: list[list[int]] = field(default_factory=list)  # each beam's, per token: the source position attended most


# Positions before every running row's start are dropped once this many have piled up (a copy of the
# cache, so not every step).
DROP_POSITIONS_AT = 16
# The source side narrows to the longest running source once that is at most this share of its width: a
# smaller cut saves little and is soon undone by a join of a longer source (a copy of the source side).
NARROW_SOURCE_AT = 0.75
# up to this many cross-attention weights a step (rows x source positions), the kept entropies are reckoned
# in Python from one read of them: a dozen tensor ops on a few rows cost ~100 us, the arithmetic a few
ATTENTION_ROWS_ON_HOST = 512


class ContinuousSearch:
    """Rows come in groups of K (the beams of one sentence): group g holds rows g*K .. g*K+K-1. A
    sentence that finishes leaves its group empty rather than copying the cache to close the gap; the
    next sentence to join takes it. Empty groups still run through the step (their output is
    ignored) until they are refilled, trimmed off the end, or, once they are more than half of all
    groups, compacted away."""

    def __init__(self, runner: ModelRunner, *, beam_size: int = 1, min_length: int = 0):
        cfg = runner.config
        self.runner, self.config = runner, cfg
        self.K = beam_size
        self.min_length = min_length
        self.cache: KVCache | None = None
        self.slots: list[_Running | None] = []  # the sentence in each group, None where one left
        self.beam_scores = torch.zeros(0, self.K)  # (G, K) on the device, set in add()
        self.last_tokens = torch.zeros(0, dtype=torch.long)  # (G*K,) newest token of each row
        banned = banned_tokens(cfg)
        self.banned = torch.tensor(banned, dtype=torch.long, device=runner.device) if banned else None
        self.steps = 0  # decoder steps run so far (for metrics)
        self._forcing = False  # some running sentence has a target prefix: the steps look for forced tokens
        # the rows' own source pieces: per row (first, last) and as an (N, S) mask (made when first used), with
        # the slots (held, so that their ids stay theirs) and the source width they are for
        self._own: tuple[tuple, tuple, list[tuple[int, int]], torch.Tensor | None] | None = None
        self._left = False  # sentences left since the source side's width was last checked

    def __len__(self) -> int:
        return sum(r is not None for r in self.slots)

    @property
    def running(self) -> int:
        """Sentences still searching (all of len() here: a finished one leaves with its result at once)."""
        return len(self)

    @property
    def rows(self) -> int:
        """Rows a step computes, empty groups included."""
        return len(self.slots) * self.K

    def keys(self) -> list[Hashable]:
        return [r.sentence.key for r in self.slots if r is not None]

    def room(self) -> int:
        """Sentences that may still join: the cache grows as they do, so no bound of its own."""
        return sys.maxsize

    def joinable(self) -> bool:
        """Sentences may join at every step (see ContinuousDeviceSearch.joinable for why not always)."""
        return True

    # ------------------------------------------------------------------ joining
    @torch.inference_mode()
    def add(self, sentences: list[Sentence]) -> None:
        """Encode the new sentences and add their rows to the running batch (a step boundary)."""
        if not sentences:
            return
        cfg, device, K = self.config, self.runner.device, self.K
        self._forcing = self._forcing or any(s.prefix for s in sentences)
        src = pad_batch([s.src for s in sentences], cfg.pad_id)
        with attention_backends(device):
            states, src_mask = self.runner.encode(src.to(device))  # (n, S, C), (n, 1, 1, S)
        kv = self.runner.source_kv(states, src_mask)  # (n_layers, 2, n, H, S, D)
        # a grouped cache holds the source once per sentence; otherwise every sentence K times, beams adjacent
        grouped = self.cache.grouped if self.cache is not None else K > 1 and len(sentences) * K >= GROUPED_BEAM_MIN_ROWS
        per = 1 if grouped else K
        if per > 1:
            kv, src_mask = kv.repeat_interleave(K, dim=2), src_mask.repeat_interleave(K, dim=0)
        if self.cache is None:
            mask = None if bool(src_mask.all()) else src_mask
            self.cache = KVCache(kv, mask, INITIAL_CAPACITY, group_size=K if grouped else 1)
            groups = list(range(len(sentences)))
            self.slots = [None] * len(sentences)
            self.beam_scores = torch.zeros(len(sentences), K, device=device)
            self.last_tokens = torch.zeros(len(sentences) * K, dtype=torch.long, device=device)
        else:
            free = [g for g, r in enumerate(self.slots) if r is None][: len(sentences)]
            reused = len(free) * per  # entries of kv
            if free:
                rows = (torch.tensor(free, device=device)[:, None] * K + torch.arange(K, device=device)).view(-1)
                self.cache.join(kv[:, :, :reused], src_mask[:reused], rows)
            if reused < kv.size(2):
                self.cache.join(kv[:, :, reused:], src_mask[reused:])
            added = len(sentences) - len(free)
            groups = free + list(range(len(self.slots), len(self.slots) + added))
            self.slots += [None] * added
            self.beam_scores = torch.cat([self.beam_scores, self.beam_scores.new_zeros(added, K)])
            self.last_tokens = torch.cat([self.last_tokens, self.last_tokens.new_zeros(added * K)])
            if K > 1 and not self.cache.grouped and self.cache.batch_size >= GROUPED_BEAM_MIN_ROWS:
                self.cache.group(K)
        index = torch.tensor(groups, device=device)
        # only beam 0 is live at the start, so the first step does not pick K copies of one token
        fresh = torch.full((len(sentences), K), -math.inf, device=device)
        fresh[:, 0] = 0.0
        self.beam_scores.index_copy_(0, index, fresh)
        self.last_tokens.view(-1, K).index_fill_(0, index, cfg.decoder_start_id)
        for g, s in zip(groups, sentences):
            self.slots[g] = _Running(s, [[] for _ in range(K)], progress=[s.constraints.start()] * K if s.constraints else [],
                                     entropies=[[] for _ in range(K)] if s.attention_span else [],
                                     looks=[[] for _ in range(K)] if s.attention_span else [])

    def cancel(self, keys: set[Hashable]) -> None:
        """The sentences with these keys leave at the next step, without a result."""
        for r in self.slots:
            if r is not None and r.sentence.key in keys:
                r.cancelled = True

    # ------------------------------------------------------------------ housekeeping between steps
    def _tidy(self) -> None:
        """Narrow the source side to the longest running source once the longest left, trim empty groups
        off the end, compact when most groups are empty, and drop positions that no running row reads any
        more."""
        K, cache = self.K, self.cache
        if self._left:
            self._left = False
            widest = max(len(r.sentence.src) for r in self.slots if r is not None)
            if widest <= NARROW_SOURCE_AT * cache.source_width:
                cache.narrow_source(widest)
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        if len(self.slots) * K < cache.batch_size:
            cache.truncate(len(self.slots) * K)
            self.beam_scores = self.beam_scores[: len(self.slots)]
            self.last_tokens = self.last_tokens[: len(self.slots) * K]
        live = [g for g, r in enumerate(self.slots) if r is not None]
        if 2 * len(live) < len(self.slots):
            groups = torch.tensor(live, device=self.last_tokens.device)
            rows = (groups[:, None] * K + torch.arange(K, device=groups.device)).view(-1)
            cache.reorder(rows, cross=True)
            self.slots = [self.slots[g] for g in live]
            self.beam_scores = self.beam_scores.index_select(0, groups)
            self.last_tokens = self.last_tokens.index_select(0, rows)
        elif cache.start is not None and cache.length >= 2 * DROP_POSITIONS_AT:
            starts = cache.start.view(-1, K)[:, 0].tolist()
            shift = min(starts[g] for g in live)
            if shift >= DROP_POSITIONS_AT:
                cache.drop_positions(shift)

    # ------------------------------------------------------------------ one step
    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[SearchHypothesis]]]:
        """Decode one token for every row; return the sentences that finished, with their n-best
        hypotheses (best first). Cancelled sentences leave without appearing here."""
        for g, r in enumerate(self.slots):  # cancelled sentences leave before the step
            if r is not None and r.cancelled:
                self.slots[g] = None
                self._left = True
        if not len(self):
            self._reset()
            return []
        self._tidy()
        K, eos = self.K, self.config.eos_id
        device = self.runner.device
        cross = [] if any(r is not None and r.sentence.attention_span for r in self.slots) else None
        with attention_backends(device):
            logits = self.runner.step(self.last_tokens, self.cache, cross)  # (G*K, V)
        entropies, looks = self._attention_rows(cross[0]) if cross is not None else (None, None)
        lp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        G, V = len(self.slots), lp.size(-1)
        self.steps += 1
        steps = [r.step if r is not None else self.min_length for r in self.slots]
        early_rows = self.min_length and min(steps) < self.min_length
        forced = [(g, r.sentence.prefix[r.step]) for g, r in enumerate(self.slots)
                  if r is not None and r.step < len(r.sentence.prefix)] if self._forcing else []
        at_max = [r is not None and r.step + 1 >= r.sentence.max_length for r in self.slots]
        lexical = self._lexical()
        # the kernels choose (greedy) or find the candidates (beams of a few groups) where only the bans and the max
        # lengths apply
        plain = not early_rows and not forced and not lexical
        if K == 1 and plain and greedy_pick.available(device):
            return self._pick(lp, at_max, entropies, looks)
        top = None
        if K > 1 and plain and G < beam_pick.MAX_SENTENCES and beam_pick.available(device):
            top = beam_pick.candidates(lp, self.beam_scores, self.banned, eos, False,
                                       torch.tensor(at_max) if any(at_max) else None, AT_MAX_EOS, 2 * K)
        progress = [r.progress if r is not None else [] for r in self.slots] if lexical else None
        if top is None:
            top = self._candidates(lp, steps, forced, at_max, lexical, progress)
        top_scores, top_index = top
        extra = constraint_candidates(lp.view(G, K * V), lexical, progress, V) if lexical else None

        # the choice among the 2K candidates, per sentence (search.choose_beams); an empty group keeps
        # its rows as they are
        parents: list[int] = []
        next_tokens: list[int] = []
        next_scores: list[float] = []
        last = self.last_tokens.tolist()
        done: list[tuple[Hashable, list[SearchHypothesis]]] = []
        for g, (running, row_scores, row_index) in enumerate(zip(self.slots, top_scores.tolist(), top_index.tolist())):
            if running is not None:
                running.step += 1
                s = running.sentence
                lex = s.constraints
                if lex:
                    ended, picked = choose_constrained(lex, running.progress, row_scores, row_index, extra[g], K, V, eos)
                    continuing = [(beam, token, score) for beam, token, score, _ in picked]
                else:
                    ended, continuing = choose_beams(row_scores, row_index, K, V, eos)
                tracked = bool(running.entropies)
                for beam, score in ended:
                    unmet = bool(lex) and not lex.all_met(running.progress[beam])
                    row = g * K + beam  # eos's row counts too
                    running.finished.append(SearchHypothesis(
                        list(running.beams[beam]), score, normalize(score, running.step, s.length_penalty), True, unmet,
                        running.entropies[beam] + [entropies[row]] if tracked else None,
                        running.looks[beam] + [looks[row]] if tracked else None))
                if lex:
                    running.progress = [after for *_, after in picked]
                beams: list[list[int]] = []
                followed: list[list[float]] = []
                looked: list[list[int]] = []
                for beam, token, score in continuing:
                    parents.append(g * K + beam)
                    beams.append(running.beams[beam] + [token])
                    if tracked:
                        followed.append(running.entropies[beam] + [entropies[g * K + beam]])
                        looked.append(running.looks[beam] + [looks[g * K + beam]])
                    next_tokens.append(token)
                    next_scores.append(score)
                chosen = len(continuing)
                if len(running.finished) < K and running.step < s.max_length:
                    running.beams = beams
                    running.entropies, running.looks = followed, looked
                    continue
                if chosen:  # its rows stay as they are until another sentence takes them
                    del parents[-chosen:], next_tokens[-chosen:], next_scores[-chosen:]
                hyps = sorted(running.finished, key=ranking, reverse=True)
                done.append((s.key, hyps[: s.num_hypotheses]))
                self.slots[g] = None
                self._left = True
            rows = range(g * K, g * K + K)
            parents += rows
            next_tokens += [last[r] for r in rows]
            next_scores += [0.0] * K
        self.last_tokens = torch.tensor(next_tokens, device=device)
        self.beam_scores = torch.tensor(next_scores, device=device).view(-1, K)
        if K > 1:  # beams follow their parents, within their group
            self.cache.reorder(torch.tensor(parents, device=device), cross=False)
        if not len(self):
            self._reset()
        return done

    def _candidates(self, lp: torch.Tensor, steps: list[int], forced: list[tuple[int, int]], at_max: list[bool],
                    lexical: list[LexicalConstraints | None] | None, progress: list[list[Progress]] | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The 2K best candidates of each group through tensor calls: lp (G*K, V) masked (the bans, eos before
        min_length, forced tokens, the max lengths, lexical constraints) and the beams' scores added, in place ->
        values and flat indices (G, 2K), best first."""
        K, eos, device = self.K, self.config.eos_id, lp.device
        G, V = len(self.slots), lp.size(-1)
        if self.banned is not None:
            lp.index_fill_(1, self.banned, -math.inf)
        if self.min_length and min(steps) < self.min_length:  # eos not allowed yet
            early = torch.tensor([s < self.min_length for s in steps], device=device).repeat_interleave(K)
            lp[early, eos] = -math.inf
        if forced:  # a forced token is the one choice, at no cost (as search.Constraints)
            rows = torch.tensor([g * K + k for g, _ in forced for k in range(K)], device=device)
            tokens = torch.tensor([t for _, t in forced for _ in range(K)], device=device)
            lp[rows] = -math.inf
            lp[rows, tokens] = 0.0
            at_max = [m and not any(g == f for f, _ in forced) for g, m in enumerate(at_max)]
        if any(at_max):  # these must end now: eos is their only choice, at no cost (search.AT_MAX_EOS)
            rows = torch.tensor(at_max, device=device).repeat_interleave(K)
            lp[rows] = -math.inf
            lp[rows, eos] = AT_MAX_EOS
        if lexical:
            mask_lexical(lp, lexical, progress, lambda row: self.slots[row // K].beams[row % K], K, at_max, eos)
        candidates = lp.view(G, K, V).add_(self.beam_scores[:, :, None]).view(G, K * V)
        return top_k(candidates, 2 * K)  # (G, 2K), best first

    def _lexical(self) -> list[LexicalConstraints | None] | None:
        """Each group's lexical constraints, or None where no running sentence has any."""
        lexical = [r.sentence.constraints if r is not None else None for r in self.slots]
        return lexical if any(lexical) else None

    def _pick(self, lp: torch.Tensor, at_max: list[bool], entropies: list[float] | None, looks: list[int] | None
              ) -> list[tuple[Hashable, list[SearchHypothesis]]]:
        """A greedy step's choice in one kernel call (greedy_pick: the bans, the forced eos, each row's best token and
        its score), where no row has a forced token, a lexical constraint or eos not allowed yet: what choose_beams
        makes of a row's two best candidates, one beam a sentence, without the tensor calls around it. An empty
        group's row takes a token too; its output is ignored as before, and a joining sentence resets it."""
        eos = self.config.eos_id
        G = len(self.slots)
        tokens = torch.empty(G, dtype=torch.long)
        scores = self.beam_scores.view(G)  # added to in place
        force = torch.tensor(at_max) if any(at_max) else None
        ended = greedy_pick.pick(lp, self.banned, eos, False, force, AT_MAX_EOS, scores, tokens, tokens.view(G, 1), 0)
        chosen = tokens.tolist()
        final = scores.tolist() if ended else None
        done: list[tuple[Hashable, list[SearchHypothesis]]] = []
        for g, running in enumerate(self.slots):
            if running is None:
                continue
            running.step += 1
            token, tracked = chosen[g], bool(running.entropies)
            if tracked:  # one beam: its lists are its own, extended in place
                running.entropies[0].append(entropies[g])
                running.looks[0].append(looks[g])
            if token != eos:
                running.beams[0].append(token)
                continue
            s = running.sentence
            score = final[g]
            hypothesis = SearchHypothesis(list(running.beams[0]), score, normalize(score, running.step, s.length_penalty),
                                          True, False, running.entropies[0] if tracked else None,
                                          running.looks[0] if tracked else None)
            done.append((s.key, [hypothesis]))
            self.slots[g] = None
            self._left = True
        self.last_tokens = tokens
        if not len(self):
            self._reset()
        return done

    def _attention_rows(self, cross: torch.Tensor) -> tuple[list[float], list[int]]:
        """Per row, from its cross-attention over the source (N, S), layers and heads averaged: the
        entropy over its sentence's own pieces (attention_span, renormalised; attention_maps.source_entropy
        one token at a time), and the source position it attends most (the maps' alignment)."""
        N, S = cross.shape
        if N * S <= ATTENTION_ROWS_ON_HOST:
            entropies, looks = [], []
            for row, (first, last) in zip(cross.tolist(), self._own_spans(S)):  # one read of the device
                own = row[first:last]
                total = max(sum(own), 1e-9)
                entropies.append(-sum(w / total * math.log(w / total) for w in own if w > 0))
                looks.append(max(range(S), key=row.__getitem__))  # the first of equal maxima, as argmax
            return entropies, looks
        own = cross * self._own_mask(S, cross.device)
        p = own / own.sum(dim=-1, keepdim=True).clamp_min(1e-9)
        entropy = torch.special.entr(p).sum(dim=-1)  # -p log p, 0 where p is 0
        rows = torch.stack([entropy, cross.argmax(dim=-1).to(entropy.dtype)]).tolist()  # one read of the device
        return rows[0], [int(position) for position in rows[1]]

    def _own_spans(self, S: int) -> list[tuple[int, int]]:
        """Per row, its own source pieces [first, last) (its sentence's attention_span; none for rows
        without one), made again only when the sentences or the source width change (not every step)."""
        key = (tuple(id(r) for r in self.slots), S)
        if self._own is None or self._own[0] != key:
            spans = [r.sentence.attention_span or (0, 0) if r is not None else (0, 0) for r in self.slots for _ in range(self.K)]
            self._own = (key, tuple(self.slots), spans, None)
        return self._own[2]

    def _own_mask(self, S: int, device: torch.device) -> torch.Tensor:
        """(N, S): _own_spans as a mask."""
        spans = self._own_spans(S)
        if self._own[3] is None:
            bounds = torch.tensor(spans, device=device)  # (N, 2)
            positions = torch.arange(S, device=device)
            self._own = (*self._own[:3], (positions >= bounds[:, :1]) & (positions < bounds[:, 1:]))
        return self._own[3]

    def _reset(self) -> None:
        """Nothing runs: the next sentences start a fresh cache, with no joined rows to mask."""
        self.cache = None
        self.slots = []
        self._forcing = False
        self._own = None
        self._left = False
        self.beam_scores = torch.zeros(0, self.K, device=self.runner.device)
        self.last_tokens = torch.zeros(0, dtype=torch.long, device=self.runner.device)
