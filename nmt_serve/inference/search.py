"""Batched greedy and beam search, the eager reference: one decoder step at a time, bookkeeping on the host.

Both work on a batch of right-padded sources of different lengths. Sentences that are done leave the
batch (their rows are dropped from the decoder state), so the last long sentence does not drag the
whole batch along. `beam_size=1` takes the greedy fast path.

This path runs any model on any device with every option. On CUDA the static decoder
(static_decoder.py, device_search.py) runs the same searches as captured programs with the bookkeeping
on the device; the tests hold the two to the same results.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from nmt_serve.inference import beam_pick, greedy_pick
from nmt_serve.inference.attention import attention_backends
from nmt_serve.inference.lexical_constraints import (
    LexicalConstraints,
    Progress,
    choose_constrained,
    constraint_candidates,
    mask_lexical,
)
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.top_k import row_max, top_k
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.transformer import EncoderOutput


@dataclass
class SearchOptions:
    beam_size: int = 4  # 1 = greedy
    num_hypotheses: int = 1  # n-best size, <= beam_size
    max_length: int | None = None  # generated tokens (eos included); None: max_length_a * src_len + max_length_b
    max_length_a: float = 1.5
    max_length_b: int = 10
    min_length: int = 0  # eos is not allowed before this many tokens
    length_penalty: float = 1.0  # normalized score = sum log-prob / length ** length_penalty
    no_repeat_ngram_size: int = 0  # 0: off; n: an n-gram never appears twice in one hypothesis
    use_cache: bool = True  # False recomputes the whole prefix each step (reference / baseline)
    # tokens every hypothesis starts with, whatever the model says (a fairseq-family model's target
    # language code); they count as generated, with log-prob 0, as transformers' forced BOS
    target_prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError("beam_size must be >= 1")
        if not 1 <= self.num_hypotheses <= self.beam_size:
            raise ValueError("num_hypotheses must be between 1 and beam_size")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError("max_length must be >= 1")
        if self.min_length < 0 or self.no_repeat_ngram_size < 0:
            raise ValueError("min_length and no_repeat_ngram_size must be >= 0")


# Greedy requests with lexical constraints run beam search at least this wide: dynamic beam
# allocation needs beams to spread over its banks. Two keep a greedy request fast (bench/terminology.py,
# 320 captions with 1-3 terms, de-en: every term placed with 2, 3 or 4 beams; BLEU 40.9 / 42.1 / 42.9
# against free greedy's 31.7; speed 0.56 / 0.43 / 0.34 of free greedy); a wider beam is the request's.
CONSTRAINED_MIN_BEAM = 2

# Beam search with at least this many rows (sentences x beams) keeps keys/values in place and follows
# beam ancestry in attention (see cache.py): at 128 rows that saves the per-step copy of the whole
# cache; with a few rows the extra attention work costs more than the copy it saves.
GROUPED_BEAM_MIN_ROWS = 16


class DeadlineExceeded(TimeoutError):
    """The search passed its deadline (time.monotonic() value) and was abandoned."""


def check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded("search abandoned at its deadline")


@dataclass
class SearchHypothesis:
    tokens: list[int]  # generated ids, the final eos excluded
    score: float  # sum of token log-probs (eos included when finished)
    normalized_score: float  # score / length ** length_penalty; ranks the n-best list
    finished: bool  # ended with eos (always true: eos is forced at max_length)
    unmet: bool = False  # the sentence had positive lexical constraints that no hypothesis met: this is the free translation
    # per target row, eos's included, where the search was asked to keep them (continuous.Sentence.attention_span):
    # the entropy of the cross-attention over the source's own pieces, and the source position attended most
    entropies: list[float] | None = None
    looks: list[int] | None = None


# an empty source gets the empty translation, not whatever the model says to a bare eos
EMPTY = SearchHypothesis([], 0.0, 0.0, True)


def normalize(score: float, length: int, length_penalty: float) -> float:
    return score / (max(length, 1) ** length_penalty)


def choose_beams(scores: list[float], indices: list[int], K: int, V: int, eos: int
                 ) -> tuple[list[tuple[int, float]], list[tuple[int, int, float]]]:
    """One sentence's step of beam search, from its 2K best candidates (scores and flat beam * V + token
    indices, best first): the hypotheses that end, (beam, score), an eos among the best K; and the
    best K that continue, (beam, token, score), in order (at most K of the 2K are eos, so K remain).
    The choice is bookkeeping on a few numbers: in Python it costs less than the two dozen small tensor
    operations it would take per step (device_search.py has the same choice in tensor form, for
    CUDA graphs; the tests hold the two to the same results)."""
    ended: list[tuple[int, float]] = []
    continuing: list[tuple[int, int, float]] = []
    for c, (score, index) in enumerate(zip(scores, indices)):
        beam, token = divmod(index, V)
        if token == eos:
            if c < K and score > -math.inf:
                ended.append((beam, score))
        elif len(continuing) < K:
            continuing.append((beam, token, score))
    return ended, continuing


class DecoderState:
    """Next-token log-probabilities for a set of running prefixes, with or without a KV cache."""

    def __init__(self, runner: ModelRunner, src: torch.Tensor, use_cache: bool, max_steps: int, beam_size: int = 1,
                 first_alone: bool = False):
        """src (B, S) right-padded ids; max_steps: the most tokens any row may generate (the cache is
        preallocated for them); beam_size K: each sentence runs K rows, adjacent, from the start, or
        with first_alone one row until `expand` (after a first step in which only one beam is live).
        With the cache, the model runner encodes and decodes; without it, the nn.Module path
        recomputes the whole prefix each step (the reference)."""
        self.model = runner.model
        grouped = beam_size > 1 and src.size(0) * beam_size >= GROUPED_BEAM_MIN_ROWS
        self.group_size = beam_size if grouped else 1  # of the cache once each sentence runs K rows
        if use_cache:
            self.runner = runner
            self.cache = self.runner.new_cache(
                *self.runner.encode(src), capacity=max_steps, group_size=1 if first_alone else self.group_size
            )
            self.encoder_out = None
        else:
            self.runner, self.cache = None, None
            self.encoder_out = self.model.encode(src)
        if beam_size > 1 and not first_alone and not grouped:  # a grouped cache has B * K rows
            self.reorder(torch.arange(src.size(0), device=src.device).repeat_interleave(beam_size))

    def log_probs(self, prefix: torch.Tensor | None, last: torch.Tensor | None = None) -> torch.Tensor:
        """prefix (N, t) of decoder inputs -> log-probs (N, V) of the token after it (float32). last: prefix[:, -1]
        where the caller holds it: the cache reads only that (prefix may then be None), the path without it the
        whole prefix."""
        if self.cache is not None:
            logits = self.runner.step(prefix[:, -1] if last is None else last, self.cache)
        else:
            logits = self.model.decode(prefix, self.encoder_out).logits[:, -1]
        return torch.log_softmax(logits, dim=-1, dtype=torch.float32)

    def expand(self, indices: torch.Tensor) -> None:
        """From one row per sentence (first_alone) to K: row i becomes old row indices[i]."""
        if self.cache is not None:
            self.cache.expand(indices, self.group_size)
        else:
            self.reorder(indices)

    def reorder(self, indices: torch.Tensor, *, same_sources: bool = False) -> None:
        """Rows follow `indices`; same_sources: each row keeps its source (beam parents of one sentence)."""
        if self.cache is not None:
            self.cache.reorder(indices, cross=not same_sources)
        elif not same_sources:
            self.encoder_out = EncoderOutput(
                self.encoder_out.states.index_select(0, indices),
                self.encoder_out.src_mask.index_select(0, indices),
            )


def survivors_order(alive: list[bool]) -> list[int]:
    """The old places of what stays, in its new order, when some of a batch leave: each keeps its place where
    that is below the new count, and those past it take the places of the ones that left, in order. The cache
    then copies only those (KVCache's reorder; the old order would shift every row after the first to leave).
    A row's results do not depend on its place in the batch."""
    n = sum(alive)
    order = list(range(n))
    holes = (i for i in range(n) if not alive[i])
    for i in range(n, len(alive)):
        if alive[i]:
            order[next(holes)] = i
    return order


def ranking(h: SearchHypothesis) -> tuple[bool, float]:
    """How finished hypotheses are ordered, best last: those that met their lexical constraints before
    any that did not (all of them are, without constraints), then by normalized score."""
    return not h.unmet, h.normalized_score


def max_length_of(src_len: int, options: SearchOptions, cap: int) -> int:
    """The most tokens a sentence of src_len source tokens (eos included) may generate, eos included."""
    length = options.max_length if options.max_length is not None else int(src_len * options.max_length_a + options.max_length_b)
    return min(max(length, 1), cap)


def max_lengths_for(src: torch.Tensor, pad_id: int, options: SearchOptions, cap: int) -> torch.Tensor:
    """(B,) max_length_of every sentence of a right-padded batch."""
    src_len = (src != pad_id).sum(1).tolist()
    of = {n: max_length_of(n, options, cap) for n in set(src_len)}  # a few dozen lengths in a batch of thousands
    return torch.tensor([of[n] for n in src_len], dtype=torch.long)


def banned_tokens(config: ModelConfig) -> list[int]:
    """Ids a search never generates: padding, bos and the decoder start (unless one of them is eos)."""
    return sorted({i for i in (config.pad_id, config.bos_id, config.decoder_start_id) if 0 <= i and i != config.eos_id})


# A sentence at its max_length ends with eos, which costs nothing there: transformers' generate forces it at
# log-prob 0 (ForcedEOSTokenLogitsProcessor) and CTranslate2 returns the hypothesis without one, so that a
# converted model's hypotheses score and rank as theirs do. (Charging eos's own log-prob would rank a hypothesis
# cut short by the limit below one of the same tokens that the model chose to end.)
AT_MAX_EOS = 0.0


class Constraints:
    """Masks applied to next-token log-probs: never pad/bos, min_length, max_length, no-repeat n-grams."""

    def __init__(self, config: ModelConfig, options: SearchOptions, max_lens: torch.Tensor):
        """max_lens (B,): the most tokens each sentence may generate."""
        self.eos = config.eos_id
        banned = banned_tokens(config)
        self.banned = torch.tensor(banned, dtype=torch.long, device=max_lens.device) if banned else None
        self.min_length = options.min_length
        self.ngram = options.no_repeat_ngram_size
        self.max_lens = max_lens
        self.shortest_cap = int(max_lens.min())  # before this step no row can be at its cap
        self.prefix = options.target_prefix

    def at_max(self, rows: torch.Tensor | list[int], step: int) -> torch.Tensor | None:
        """(N,) bool: which of the running rows (sentence indices) must end with this step; None: none."""
        return self.max_lens[rows] <= step + 1 if step + 1 >= self.shortest_cap else None

    def apply(self, lp: torch.Tensor, step: int, at_max: torch.Tensor | None,
              generated: torch.Tensor | list[list[int]]) -> torch.Tensor:
        """lp (N, V); step = tokens generated so far; at_max (N,) bool rows that must end now (None: no
        row); generated: the tokens so far, (N, step), or each row's list."""
        if step < len(self.prefix):  # forced: the one choice, at no cost
            lp.fill_(-math.inf)
            lp[:, self.prefix[step]] = 0.0
            return lp
        if self.banned is not None:
            lp.index_fill_(1, self.banned, -math.inf)
        if step < self.min_length:
            lp[:, self.eos] = -math.inf
        if self.ngram and step + 1 >= self.ngram:
            n = self.ngram
            rows = generated.tolist() if isinstance(generated, torch.Tensor) else generated
            for r, toks in enumerate(rows):
                tail = tuple(toks[step - n + 1 :]) if n > 1 else ()
                banned = [toks[i + n - 1] for i in range(step - n + 1) if tuple(toks[i : i + n - 1]) == tail]
                if banned:
                    lp[r, banned] = -math.inf
        if at_max is not None and at_max.any():  # eos, at no cost: AT_MAX_EOS
            lp[at_max] = -math.inf
            lp[at_max, self.eos] = AT_MAX_EOS
        return lp


# the searches run in inference mode: cheaper per op than no_grad (no version counters or view tracking)
@torch.inference_mode()
def generate(runner: ModelRunner, src: torch.Tensor, options: SearchOptions, deadline: float | None = None,
             constraints: list[LexicalConstraints | None] | None = None) -> list[list[SearchHypothesis]]:
    """src (B, S) right-padded token ids -> per sentence, the n-best hypotheses sorted by score.

    Every search ends by max_length; `deadline` (a time.monotonic() value) also bounds it in time:
    past it, DeadlineExceeded is raised instead of finishing work nobody waits for. constraints: per
    sentence its lexical constraints or None (lexical_constraints.py); a sentence whose positive
    constraints no hypothesis met gets its free translation, marked `unmet`.
    """
    def search(src: torch.Tensor, options: SearchOptions, deadline: float | None,
               constraints: list[LexicalConstraints | None] | None) -> list[list[SearchHypothesis]]:
        if constraints is not None and any(constraints):
            options = replace(options, beam_size=max(options.beam_size, CONSTRAINED_MIN_BEAM))
            return beam_search(runner, src, options, deadline, constraints)
        if options.beam_size == 1:
            return [[h] for h in greedy_search(runner, src, options, deadline)]
        return beam_search(runner, src, options, deadline)

    with attention_backends(src.device):
        return constrained_search(search, src, options, deadline, constraints)


# (src, options, deadline, constraints) -> per sentence its n-best: a search that takes constraints as generate() does
Search = Callable[[torch.Tensor, SearchOptions, "float | None", "list[LexicalConstraints | None] | None"], list[list[SearchHypothesis]]]


def constrained_search(search: Search, src: torch.Tensor, options: SearchOptions, deadline: float | None,
                       constraints: list[LexicalConstraints | None] | None) -> list[list[SearchHypothesis]]:
    """Terms placed only where the model does not write them itself. Every sentence is searched free
    first (its avoided sequences only; the call's beam size); one whose best translation lacks one of its
    terms (free_lacks_terms) is searched again with them (dynamic beam allocation, CONSTRAINED_MIN_BEAM
    beams at least), and one whose terms no hypothesis met there keeps its free translation, flagged
    `unmet`. Searching with the terms from the start changed 48 of 120 translations (Multi30k val, the
    shipped model, a term taken from each one's own free translation): the banks steer beams towards
    placing the term early and the beams that have it end on their own best eos."""
    if constraints is None or not any(c and c.include for c in constraints):
        return search(src, options, deadline, constraints)
    free = [LexicalConstraints(avoid=c.avoid) if c and c.avoid else None for c in constraints]
    results = search(src, options, deadline, free if any(free) else None)
    todo = free_lacks_terms(constraints, results)
    if todo:
        wide = replace(options, beam_size=max(options.beam_size, CONSTRAINED_MIN_BEAM))
        for i, hyps in zip(todo, search(src[todo], wide, deadline, [constraints[i] for i in todo])):
            results[i] = hyps if not hyps[0].unmet else [replace(h, unmet=True) for h in results[i]]
    return results


def free_lacks_terms(constraints: list[LexicalConstraints | None], free: list[list[SearchHypothesis]]) -> list[int]:
    """The sentences whose free translation lacks one of their terms: those to search with them."""
    return [i for i, (c, hyps) in enumerate(zip(constraints, free)) if c and c.include and not c.holds(hyps[0].tokens)]


@torch.inference_mode()
def greedy_search(runner: ModelRunner, src: torch.Tensor, options: SearchOptions, deadline: float | None = None) -> list[SearchHypothesis]:
    cfg = runner.config
    B = src.size(0)
    device = src.device
    max_lens = max_lengths_for(src, cfg.pad_id, options, cfg.max_positions - 1).to(device)
    constraints = Constraints(cfg, options, max_lens)
    longest = int(max_lens.max())
    state = DecoderState(runner, src, options.use_cache, longest)

    rows = torch.arange(B, device=device)  # sentence index of each running row
    # every row's decoder inputs, the start and then each token chosen: (N, 1 + step) in use
    prefix = torch.full((B, 1 + longest), cfg.decoder_start_id, dtype=torch.long, device=device)
    tokens = prefix[:, 0].clone()  # (N,): each row's newest input
    scores = torch.zeros(B, device=device)
    results: list[SearchHypothesis | None] = [None] * B
    # one kernel call chooses the tokens (greedy_pick), past a forced prefix and without no-repeat n-grams (which read
    # the generated tokens): those take the tensor calls of Constraints.apply
    picks = not constraints.ngram and greedy_pick.available(device)
    step = 0
    while rows.numel() > 0:
        check_deadline(deadline)
        lp = state.log_probs(prefix[:, : step + 1], tokens)  # (N, V)
        at_max = constraints.at_max(rows, step)
        if picks and step >= len(constraints.prefix):
            ended = greedy_pick.pick(lp, constraints.banned, cfg.eos_id, step < constraints.min_length, at_max,
                                     AT_MAX_EOS, scores, tokens, prefix, step + 1)
            done = tokens == cfg.eos_id if ended else None
        else:
            lp = constraints.apply(lp, step, at_max, prefix[:, 1 : step + 1])
            token_lp, tokens = row_max(lp)  # (N,): lp.max(dim=-1)
            scores = scores + token_lp
            prefix[:, step + 1] = tokens
            done = tokens == cfg.eos_id
            done = done if done.any() else None
        step += 1
        if done is not None:
            for r in done.nonzero().flatten().tolist():
                s = scores[r].item()
                results[rows[r].item()] = SearchHypothesis(
                    prefix[r, 1:step].tolist(), s, normalize(s, step, options.length_penalty), True
                )
            keep = torch.tensor(survivors_order((~done).tolist()), dtype=torch.long, device=device)
            rows, prefix, scores, tokens = rows[keep], prefix[keep], scores[keep], tokens[keep]
            if rows.numel() > 0:
                state.reorder(keep)
    return results  # type: ignore[return-value]


@torch.inference_mode()
def beam_search(runner: ModelRunner, src: torch.Tensor, options: SearchOptions, deadline: float | None = None,
                lexical: list[LexicalConstraints | None] | None = None) -> list[list[SearchHypothesis]]:
    """lexical: per sentence its lexical constraints or None; a hypothesis that ends with positive
    constraints unmet (only at its length limit) is marked `unmet` (constrained_search redoes those)."""
    cfg = runner.config
    B, K = src.size(0), options.beam_size
    device = src.device
    max_lens = max_lengths_for(src, cfg.pad_id, options, cfg.max_positions - 1).to(device)
    constraints = Constraints(cfg, options, max_lens)
    lexical = lexical if lexical is not None and any(lexical) else None
    # rows per sentence: only beam 0 is live at the start, so the first step runs it alone and the K
    # rows of each sentence follow from its choices (with constraints every beam keeps its own state)
    width = K if lexical else 1
    state = DecoderState(runner, src, options.use_cache, int(max_lens.max()), beam_size=K, first_alone=width < K)

    sentences = list(range(B))  # sentence index of each running sentence
    max_len_of = max_lens.tolist()
    # per sentence, each beam's progress on its positive constraints
    progress: list[list[Progress]] = [[c.start()] * K if c else [] for c in lexical] if lexical else []
    # each row's tokens so far, and its newest input (what the cache reads): a list per row, as the engine's search
    # keeps them, where a tensor of the prefixes took an index and a cat a step (lone beam-4 searches 1.04-1.05x as fast)
    histories: list[list[int]] = [[] for _ in range(B * width)]
    last = torch.full((B * width,), cfg.decoder_start_id, dtype=torch.long, device=device)
    # the beams that are not live (all but beam 0 at the start) have no score, so that the first step
    # does not pick K copies of one token
    beam_scores = torch.full((B, width), -math.inf, device=device)
    beam_scores[:, 0] = 0.0
    finished: list[list[SearchHypothesis]] = [[] for _ in range(B)]
    step = 0
    # a few sentences' candidates in one kernel call (beam_pick) past a forced prefix, without no-repeat n-grams or
    # lexical constraints (which read the generated tokens): those take the tensor calls of Constraints.apply
    picks = not constraints.ngram and not lexical and beam_pick.available(device)
    while sentences:
        check_deadline(deadline)
        Nb = len(sentences)
        prefix = None if state.cache is not None else torch.tensor(
            [[cfg.decoder_start_id] + h for h in histories], dtype=torch.long, device=device)
        lp = state.log_probs(prefix, last)  # (Nb*width, V)
        V = lp.size(-1)
        at_max = constraints.at_max(sentences, step)
        top = None
        if picks and Nb < beam_pick.MAX_SENTENCES and step >= len(constraints.prefix):
            top = beam_pick.candidates(lp, beam_scores, constraints.banned, cfg.eos_id, step < constraints.min_length,
                                       at_max, AT_MAX_EOS, 2 * K)
        if top is None:
            lp = constraints.apply(lp, step, None if at_max is None else at_max.repeat_interleave(width), histories)
            if lexical:
                mask_lexical(lp, [lexical[s] for s in sentences], [progress[s] for s in sentences], histories.__getitem__, K,
                             [max_len_of[s] <= step + 1 for s in sentences], cfg.eos_id)
            candidates = lp.view(Nb, width, V).add_(beam_scores[:, :, None]).view(Nb, width * V)
            top = top_k(candidates, 2 * K)  # (Nb, 2K), best first
            extra = constraint_candidates(candidates, [lexical[s] for s in sentences], [progress[s] for s in sentences], V) if lexical else None
        top_scores, top_index = top
        step += 1

        parents: list[int] = []  # row of each next beam's parent
        next_tokens: list[int] = []
        next_scores: list[float] = []
        for b, (row_scores, row_index) in enumerate(zip(top_scores.tolist(), top_index.tolist())):
            sentence = sentences[b]
            lex = lexical[sentence] if lexical else None
            if lex:
                ended, chosen = choose_constrained(lex, progress[sentence], row_scores, row_index, extra[b], K, V, cfg.eos_id)
                continuing = [(beam, token, score) for beam, token, score, _ in chosen]
            else:
                ended, continuing = choose_beams(row_scores, row_index, K, V, cfg.eos_id)
            for beam, score in ended:
                tokens = histories[b * width + beam]
                unmet = bool(lex) and not lex.all_met(progress[sentence][beam])
                finished[sentence].append(SearchHypothesis(tokens, score, normalize(score, step, options.length_penalty), True, unmet))
            if lex:
                progress[sentence] = [after for *_, after in chosen]
            for beam, token, score in continuing:
                parents.append(b * width + beam)
                next_tokens.append(token)
                next_scores.append(score)
            if len(finished[sentence]) >= K or max_len_of[sentence] <= step:
                sentences[b] = -1  # done: its beams leave the batch
                del parents[-K:], next_tokens[-K:], next_scores[-K:]
        sentences_left = len(parents) < Nb * K
        if sentences_left:
            # the ones that stay keep their places where they can (survivors_order); each brought its K beams
            stayed = [b for b in range(Nb) if sentences[b] >= 0]
            rank = {b: j for j, b in enumerate(stayed)}
            order = [rank[b] for b in survivors_order([s >= 0 for s in sentences])]
            parents, next_tokens, next_scores = ([x for j in order for x in column[j * K:(j + 1) * K]]
                                                 for column in (parents, next_tokens, next_scores))
            sentences = [sentences[stayed[j]] for j in order]
        if not sentences:
            break
        parent = torch.tensor(parents, device=device)
        histories = [histories[p] + [token] for p, token in zip(parents, next_tokens)]
        last = torch.tensor(next_tokens, device=device)
        beam_scores = torch.tensor(next_scores, dtype=beam_scores.dtype, device=device).view(-1, K)
        if width < K:  # after the first step: K rows per sentence from here on
            state.expand(parent)
            width = K
        else:  # beams stay within their sentence, so the source side is copied only when sentences leave
            state.reorder(parent, same_sources=not sentences_left)

    results = []
    for hyps in finished:
        hyps.sort(key=ranking, reverse=True)
        results.append(hyps[: options.num_hypotheses])
    return results

