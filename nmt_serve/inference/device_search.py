"""Greedy and beam search with the bookkeeping on the device, over a StaticDecoder.

Each step is one program (captured as one CUDA graph per bucket on CUDA): the decoder step, then the
search's update, all in tensors: log-softmax, the constraints (banned ids, min/max length), the
choice of tokens (greedy) or of beams among the top 2K of K x V candidates (beam), the finished
hypotheses, and the reorder of the cache by beam parents. The host replays it and reads back one
small tensor (which sentences still run) every `check_every` steps; it copies results out only when
the running rows shrink to a smaller bucket and at the end. Finished rows keep being computed, masked
out, until then: a little wasted work instead of a wait on the device every step. With `lookahead` (on
CUDA) a check's read is taken in once the next step is queued behind it (host_copy.py), so the GPU has a
step to compute while the host waits for the read and then works on it.

Results are those of the eager reference search (search.py), hypothesis for hypothesis: the same
candidates are taken in the same order, and scores are the same float32 sums; only the attention
kernels differ (masked over a bucket instead of exact lengths), so half-precision logits may differ
in the last bits. no_repeat_ngram_size is not done here (search.py does it).

A step may also keep, per row, what its cross-attention says (the entropy over the row's own source
pieces, the position attended most), for sentences that ask for it (the `detached` check, inline tags):
a twin program per bucket that follows them along the beams like the tokens (program's `attention`).

Lexical constraints (terms, avoided sequences) run in a second program per bucket, the beam step with
device_constraints.py's masks and choice: it is used while some running sentence has constraints, and
gives free sentences beside them what the plain step gives them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from nmt_serve.inference.device_constraints import MAX_TERMS, DeviceConstraints, term_slots
from nmt_serve.inference.device_constraints import fits as constraints_fit
from nmt_serve.inference.host_copy import HostCopy, device_ids
from nmt_serve.inference.lexical_constraints import LexicalConstraints
from nmt_serve.inference.search import (
    AT_MAX_EOS,
    CONSTRAINED_MIN_BEAM,
    SearchHypothesis,
    SearchOptions,
    banned_tokens,
    check_deadline,
    constrained_search,
    max_lengths_for,
    normalize,
    ranking,
)
from nmt_serve.inference.static_decoder import StaticDecoder, bucket_of, buckets

CHECK_EVERY = 4  # steps between reads of which sentences still run
# columns of a joining sentence's row in the join table before its ids: its group, source length,
# max_length, forced first token (-1: none), and the span of source positions whose attention it keeps
# (continuous.Sentence.attention_span; 0, 0: none)
JOIN_INFO = 6
# source positions (sentences x padded length) one join program encodes at most by default: the
# engine's default max_batch_tokens, for which the memory plan reserves a join's activations
JOIN_TOKENS = 4096


def join_chunk(lengths: list[int], group_buckets: list[int], length_buckets: list[int], max_tokens: int) -> tuple[int, int]:
    """Of joining sentences with these source lengths (ascending), how many the next join program takes
    and their padded length: the largest group bucket that fits them whose sentences x padded length
    stays within max_tokens (one sentence at least)."""
    for size in sorted((b for b in group_buckets if b <= len(lengths)), reverse=True):
        W = bucket_of(lengths[size - 1], length_buckets)
        if size * W <= max_tokens or size == 1:
            return size, W
    raise ValueError("no sentences to join")


class SearchSlots:
    """Fixed-address search state for beams of size K: per row (max_rows) and per sentence (max_rows // K)."""

    def __init__(self, decoder: StaticDecoder, K: int):
        R, T, device = decoder.max_rows, decoder.max_length, decoder.device
        G = R // K
        self.K = K
        self.V = decoder.runner.output.out_features
        self.lexical: DeviceConstraints | None = None  # made with the first constrained sentence (constraints())
        self.group_buckets = buckets(G)
        self.score = torch.zeros(R, device=device)  # greedy: the row's sum of log-probs; beam: the beam's score
        self.history = torch.zeros(R, T, dtype=torch.long, device=device)  # tokens each row generated so far
        self.min_len = torch.zeros(R, dtype=torch.long, device=device)
        self.max_len = torch.ones(R, dtype=torch.long, device=device)
        self.forced = torch.full((R,), -1, dtype=torch.long, device=device)  # a forced first token, -1: none
        self.alive = torch.zeros(G, dtype=torch.bool, device=device)  # per sentence: still searching
        # per row, the source positions [own_from, own_to) its attention's entropy is taken over (attention())
        self.own_from = torch.zeros(R, dtype=torch.long, device=device)
        self.own_to = torch.zeros(R, dtype=torch.long, device=device)
        self.kept: _KeptAttention | None = None  # made with the first sentence that keeps its attention
        if K > 1:
            # finished hypotheses per sentence: at most 2K - 1 before it is done, plus a slot for discards
            self.fin_score = torch.zeros(G, 2 * K + 1, device=device)
            self.fin_len = torch.zeros(G, 2 * K + 1, dtype=torch.long, device=device)
            self.fin_tokens = torch.zeros(G, 2 * K + 1, T, dtype=torch.long, device=device)
            self.fin_count = torch.zeros(G, dtype=torch.long, device=device)
            self.fin_unmet = torch.zeros(G, 2 * K + 1, dtype=torch.bool, device=device)  # ended with a term unmet
            self.first_k = torch.arange(2 * K, device=device) < K
            self.group_base = torch.arange(G, device=device)[:, None] * K
            # a joining sentence's beams: only beam 0 is live at the start, so that the first step does
            # not pick K copies of one token
            self.fresh_score = torch.zeros(G, K, device=device)
            self.fresh_score[:, 1:] = -math.inf

    def keep(self, groups: torch.Tensor, rows: torch.Tensor) -> None:
        n, m = rows.numel(), groups.numel()
        kept = self.kept.buffers() if self.kept is not None else ((), ())
        for buffer in (self.score, self.history, self.min_len, self.max_len, self.forced, self.own_from, self.own_to, *kept[0]):
            buffer[:n] = buffer[rows]
        per_group = (self.alive,) + ((self.fin_score, self.fin_len, self.fin_tokens, self.fin_count, self.fin_unmet) if self.K > 1 else ())
        for buffer in per_group + kept[1]:
            buffer[:m] = buffer[groups]
        if self.lexical is not None:
            self.lexical.keep(groups, rows)

    def attention(self) -> _KeptAttention:
        """The buffers of what sentences keep of their cross-attention, made on first use."""
        if self.kept is None:
            self.kept = _KeptAttention(self.score.numel(), self.history.size(1), self.K, self.score.device)
        return self.kept

    def constraints(self) -> DeviceConstraints:
        """The groups' lexical constraint buffers, made on first use (every group free)."""
        if self.lexical is None:
            self.lexical = DeviceConstraints(self.alive.numel(), self.K, self.V, self.score.device)
        return self.lexical

    def start(self, groups: torch.Tensor, constraints: list[LexicalConstraints | None] | None) -> None:
        """Sentences join these groups: their constraints (None: free) where any group has some."""
        if self.K > 1:
            self.fin_count[groups] = 0
            self.fin_unmet[groups] = False
        self.load_constraints(groups, constraints)

    def load_constraints(self, groups: torch.Tensor | list[int], constraints: list[LexicalConstraints | None] | None) -> None:
        """The joining groups' lexical constraints (None: free), where any group has some: their state is
        built on the host, eagerly (rare; without any, nothing is sent to the device)."""
        if self.lexical is None and (constraints is None or not any(constraints)):
            return
        if not isinstance(groups, torch.Tensor):
            groups = torch.tensor(groups, device=self.score.device)
        self.constraints().load(groups, constraints if constraints is not None else [None] * groups.numel())


class _KeptAttention:
    """Per row and generated position, what a sentence with an attention_span keeps of the cross-attention
    (continuous.py keeps the same in Python lists): the entropy over its own source pieces and the source
    position attended most; beam search keeps its finished hypotheses' too, like their tokens."""

    def __init__(self, rows: int, positions: int, K: int, device: torch.device):
        self.entropy = torch.zeros(rows, positions, device=device)
        self.look = torch.zeros(rows, positions, dtype=torch.int32, device=device)
        G = rows // K
        self.finished = (torch.zeros(G, 2 * K + 1, positions, device=device),  # entropy, look of finished hypotheses
                         torch.zeros(G, 2 * K + 1, positions, dtype=torch.int32, device=device)) if K > 1 else ()

    def buffers(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """(per row: entropy, look; per group: the finished hypotheses' entropy, look, in beam search)."""
        return (self.entropy, self.look), self.finished


def _keep_attention(dec: StaticDecoder, slots: SearchSlots, weights: torch.Tensor, B: int, L: int) -> None:
    """Each row's cross-attention of this step (B, L) -> its entropy over the row's own source positions
    (renormalised there; continuous.ContinuousSearch._attention_rows) and its most attended position,
    kept at the row's position, where its token's history is."""
    seen = dec.positions[:L]
    own = weights * ((seen[None, :] >= slots.own_from[:B, None]) & (seen[None, :] < slots.own_to[:B, None]))
    p = own / own.sum(dim=-1, keepdim=True).clamp_min(1e-9)
    rows, pos, kept = dec.rows[:B], dec.pos[:B], slots.kept
    kept.entropy[rows, pos] = torch.special.entr(p).sum(dim=-1)  # -p log p, 0 where p is 0
    kept.look[rows, pos] = weights.argmax(dim=-1).to(torch.int32)


def _decode(dec: StaticDecoder, slots: SearchSlots, B: int, L: int, attention: bool) -> torch.Tensor:
    """The decoder step's log-probs (B, V), float32; with attention, what the rows keep of it too."""
    if not attention:
        return torch.log_softmax(dec.step(B, L), dim=-1, dtype=torch.float32)
    logits, weights = dec.step(B, L, weights=True)
    _keep_attention(dec, slots, weights, B, L)
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


@dataclass
class _Constants:
    banned: torch.Tensor  # (n,) ids never generated
    eos: int
    forcing: bool = False  # the steps force a first token per row (a model that has target codes); else they skip it


def _mask_free(lp: torch.Tensor, steps: torch.Tensor, min_len: torch.Tensor, c: _Constants) -> None:
    """In place on lp (N, V) for rows that generated `steps` tokens: banned tokens, and eos before min_len."""
    if c.banned.numel():
        lp.index_fill_(1, c.banned, -math.inf)
    lp[:, c.eos].masked_fill_(steps < min_len, -math.inf)


def _one_choice(steps: torch.Tensor, max_len: torch.Tensor, forced: torch.Tensor, c: _Constants
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float]:
    """The rows left one choice, at no cost: a forced first token at step 0 (forced: one per row, -1 for none), else
    eos at max_length (search.AT_MAX_EOS). (N,) bool, (N,) that token, its log-prob."""
    at_max = steps + 1 >= max_len
    if not c.forcing:
        return at_max, torch.full_like(steps, c.eos), AT_MAX_EOS
    force = (steps == 0) & (forced >= 0)
    return at_max | force, torch.where(force, forced, c.eos), torch.where(force, 0.0, AT_MAX_EOS)


def _constrain(lp: torch.Tensor, steps: torch.Tensor, min_len: torch.Tensor, max_len: torch.Tensor, forced: torch.Tensor,
               c: _Constants) -> None:
    """In place on lp (N, V) for rows that generated `steps` tokens: what Constraints.apply does. A row left one
    choice (_one_choice) is masked through a (N, 1) mask: one pass over lp, no (N, V) mask made (the greedy step
    needs none: it overrides its choice instead)."""
    _mask_free(lp, steps, min_len, c)
    single, only, cost = _one_choice(steps, max_len, forced, c)
    only = only[:, None]
    kept = lp.gather(1, only)
    lp.masked_fill_(single[:, None], -math.inf)
    lp.scatter_(1, only, torch.where(single[:, None], cost if isinstance(cost, float) else cost[:, None], kept))


def _join_update(dec: StaticDecoder, slots: SearchSlots, table: torch.Tensor, min_length: int) -> None:
    """Sentences join the running search: table (n, JOIN_INFO + W) on the device holds per sentence its
    group, source length, max_length, forced first token and attention span, then its ids padded to W. Their source
    is encoded and their K rows each start at position 0, all of it in device tensors (no reads back),
    so that on CUDA it runs as one captured program per (n, W) bucket."""
    K = slots.K
    info, src = table[:, :JOIN_INFO], table[:, JOIN_INFO:]
    n, W = src.shape
    states, _ = dec.runner.encode(src, always_mask=True)  # (n, W, C)
    kv = dec.runner.source_kv(states, contiguous=False)  # (n_layers, 2, n, H, W, D), not copied
    groups = info[:, 0]
    beams = groups[:, None] * K + dec.rows[:K]  # (n, K): a sentence's beams adjacent
    rows = beams.view(-1)
    # each sentence's keys and values written once to its group's slot where the decoder's K rows share it, else to
    # its K rows, broadcast (neither a contiguous copy nor K of them); positions from the source's length to W hold
    # the encoder's output at padding: masked by src_len
    if dec.group == K:
        dec.cross_kv[:, :, groups, :, :W] = kv
    else:
        dec.cross_kv[:, :, beams, :, :W] = kv.unsqueeze(3)
    if K > 1:  # (expand, not repeat_interleave: that may ask the device for its size)
        info = info.unsqueeze(1).expand(n, K, JOIN_INFO).flatten(0, 1)
    dec.src_len[rows] = info[:, 1]
    dec.pos.index_fill_(0, rows, 0)
    dec.tokens.index_fill_(0, rows, dec.config.decoder_start_id)
    slots.max_len[rows] = info[:, 2]
    slots.min_len.index_fill_(0, rows, min_length)
    slots.forced[rows] = info[:, 3]
    slots.own_from[rows] = info[:, 4]
    slots.own_to[rows] = info[:, 5]
    if K == 1:
        slots.score.index_fill_(0, rows, 0.0)
    else:
        slots.score[rows] = slots.fresh_score[:n].reshape(-1)
        slots.fin_count.index_fill_(0, groups, 0)
        slots.fin_unmet.index_fill_(0, groups, False)
    slots.alive.index_fill_(0, groups, True)


class JoinTables:
    """The way joining sentences' ids and settings reach the device: a fixed device block that the join
    programs read (a (n, JOIN_INFO + W) view at its start per bucket), filled by one copy per program
    from pinned host memory. On CUDA that copy is asynchronous: a join queues its copies and programs
    behind the step in flight instead of waiting for it (a copy from pageable memory would)."""

    def __init__(self, device: torch.device, rows: int, max_length: int):
        """rows: the most sentences one join program takes; max_length: the widest source."""
        self.device = device
        self.size = size = rows * (JOIN_INFO + max_length)
        self.block = torch.zeros(size, dtype=torch.long, device=device)
        # a join's tables lie side by side in one half of this, so that none overwrites another before its copy
        # has run; the next join takes the other half, whose copies (two joins ago) are done by then
        self.host = torch.zeros(2 * size if device.type == "cuda" else 0, dtype=torch.long, pin_memory=device.type == "cuda")
        self._half = 0
        self._used = 0
        self._copied: list[torch.cuda.Event | None] = [None, None]  # per half: recorded after its join's last copy

    def table(self, n: int, W: int) -> torch.Tensor:
        """The device view that the program for n sentences of up to W source tokens reads."""
        return self.block[: n * (JOIN_INFO + W)].view(n, JOIN_INFO + W)

    def begin(self) -> None:
        """A new join, in the other half of the host memory: it may reuse that once the copies of the join
        before the last have read it (long done in practice: the last join's waits only for the step in
        flight, and a join comes at most once a step)."""
        self._half = 1 - self._half
        copied = self._copied[self._half]
        if copied is not None:
            copied.synchronize()
            self._copied[self._half] = None
        self._used = self._half * self.size

    def put(self, groups: list[int], sources: list[list[int]], info: list[tuple[int, ...]], W: int, pad_id: int) -> None:
        """Fill the table for these sentences (in these groups; info: source length, max_length, forced
        first token, attention span's start and end) and copy it to the device block."""
        n = len(groups)
        if self.device.type != "cuda":
            self._fill(self.table(n, W), groups, sources, info, pad_id)
            return
        size = n * (JOIN_INFO + W)
        host = self.host[self._used:self._used + size].view(n, JOIN_INFO + W)
        self._used += size
        self._fill(host, groups, sources, info, pad_id)
        self.table(n, W).copy_(host, non_blocking=True)
        copied = self._copied[self._half] = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device))

    @staticmethod
    def _fill(table: torch.Tensor, groups: list[int], sources: list[list[int]], info: list[tuple[int, ...]], pad_id: int) -> None:
        # through numpy (the same host memory): a join runs on the engine's main thread between steps, and
        # each small torch call costs it microseconds of dispatch, numpy's a fraction of that
        t = table.numpy()
        t[:, JOIN_INFO:] = pad_id
        t[:, :JOIN_INFO] = [(g, *i) for g, i in zip(groups, info)]
        for row, ids in zip(t, sources):
            row[JOIN_INFO:JOIN_INFO + len(ids)] = ids


def _greedy_update(dec: StaticDecoder, slots: SearchSlots, c: _Constants, B: int, L: int, attention: bool) -> None:
    lp = _decode(dec, slots, B, L, attention)  # (B, V)
    pos = dec.pos[:B]
    _mask_free(lp, pos, slots.min_len[:B], c)
    token_lp, token = lp.max(dim=-1)  # (B,)
    # what _constrain's masks would leave a row with one choice, without a pass over lp
    single, only, cost = _one_choice(pos, slots.max_len[:B], slots.forced[:B], c)
    token = torch.where(single, only, token)
    token_lp = torch.where(single, cost, token_lp)
    alive = slots.alive[:B]
    score = slots.score[:B]
    score.copy_(torch.where(alive, score + token_lp, score))
    slots.history[dec.rows[:B], pos] = token
    dec.tokens[:B] = token
    pos.add_(alive)  # a finished row stays where it ended
    alive.logical_and_(token != c.eos)


def _beam_update(dec: StaticDecoder, slots: SearchSlots, c: _Constants, G: int, L: int, attention: bool) -> None:
    K = slots.K
    B = G * K
    lp = _decode(dec, slots, B, L, attention)  # (B, V)
    V = lp.size(-1)
    pos = dec.pos[:B]
    _constrain(lp, pos, slots.min_len[:B], slots.max_len[:B], slots.forced[:B], c)
    candidates = lp.view(G, K, V).add_(slots.score[:B].view(G, K, 1)).view(G, K * V)  # in place: a (B, V) float32 buffer less
    top_scores, top_index = candidates.topk(2 * K, dim=-1)  # (G, 2K), best first
    beam, token = top_index // V, top_index % V
    is_eos = token == c.eos
    step = pos.view(G, K)[:, 0] + 1  # tokens generated with this one, eos included: (G,)
    alive = slots.alive[:G]
    was_alive = alive.clone()

    # eos among the best K candidates ends a hypothesis: it goes to its sentence's next free slot
    ends = is_eos & slots.first_k & (top_scores > -math.inf) & alive[:, None]
    count = slots.fin_count[:G]
    slot = torch.where(ends, count[:, None] + ends.cumsum(1) - 1, 2 * K)  # (G, 2K); 2K: discarded
    slots.fin_score[:G].scatter_(1, slot, top_scores)
    slots.fin_len[:G].scatter_(1, slot, step[:, None].expand(G, 2 * K))
    parents_of_candidates = (slots.group_base[:G] + beam).view(-1)  # (G * 2K,)
    prefixes = slots.history[parents_of_candidates, :L].view(G, 2 * K, L)
    slots.fin_tokens[:G, :, :L].scatter_(1, slot[:, :, None].expand(G, 2 * K, L), prefixes)
    if attention:  # this step's numbers are the parent's, at its position: eos's row with the rest
        for per_row, fin in zip(*slots.kept.buffers()):
            fin[:G, :, :L].scatter_(1, slot[:, :, None].expand(G, 2 * K, L), per_row[parents_of_candidates, :L].view(G, 2 * K, L))
    count.add_(ends.sum(1))

    # the best K candidates that are not eos continue, in order (at most K of the 2K are eos)
    continues = ~is_eos
    rank = continues.cumsum(1) - 1
    dest = torch.where(continues & (rank < K), rank, K)  # K: discarded
    next_score = top_scores.new_empty(G, K + 1).scatter_(1, dest, top_scores)[:, :K]
    next_beam = beam.new_empty(G, K + 1).scatter_(1, dest, beam)[:, :K]
    next_token = token.new_empty(G, K + 1).scatter_(1, dest, token)[:, :K].reshape(B)
    parent = (slots.group_base[:G] + next_beam).view(B)

    alive.logical_and_(~((count >= K) | (step >= slots.max_len[:B].view(G, K)[:, 0])))
    slots.score[:B] = next_score.reshape(B)
    slots.history[:B, :L] = slots.history[parent, :L]
    slots.history[dec.rows[:B], pos] = next_token
    if attention:
        for per_row in slots.kept.buffers()[0]:
            per_row[:B, :L] = per_row[parent, :L]
    dec.reorder(parent, L)
    dec.tokens[:B] = next_token
    pos.add_(was_alive[:, None].expand(G, K).reshape(B))  # (no repeat_interleave: nothing here may wait on the device)


def _lexical_beam_update(dec: StaticDecoder, slots: SearchSlots, c: _Constants, G: int, L: int, terms: int, attention: bool) -> None:
    """_beam_update with lexical constraints (device_constraints.py) over `terms` term slots: the masks,
    then the choice among the top 2K and the constraint candidates, grouped in banks."""
    K, lex = slots.K, slots.lexical
    B = G * K
    lp = _decode(dec, slots, B, L, attention)  # (B, V)
    V = lp.size(-1)
    pos = dec.pos[:B]
    max_len = slots.max_len[:B]
    _constrain(lp, pos, slots.min_len[:B], max_len, slots.forced[:B], c)
    lex.mask(lp, slots.history[:B], pos, max_len, c.eos, terms)
    candidates = lp.view(G, K, V).add_(slots.score[:B].view(G, K, 1)).view(G, K * V)  # in place: a (B, V) float32 buffer less
    top_scores, top_index = candidates.topk(2 * K, dim=-1)  # (G, 2K), best first
    step = pos.view(G, K)[:, 0] + 1
    alive = slots.alive[:G]
    was_alive = alive.clone()
    chosen = lex.choose(candidates, top_scores, top_index, alive, c.eos, terms)

    # the hypotheses that end go to their sentence's next free slots, in list order; one per beam at most
    ended = chosen["ended"]
    count = slots.fin_count[:G]
    slot = torch.where(ended, count[:, None] + ended.cumsum(1) - 1, 2 * K)  # (G, M); 2K: discarded
    slots.fin_score[:G].scatter_(1, slot, chosen["score"])
    slots.fin_len[:G].scatter_(1, slot, step[:, None].expand_as(slot))
    slots.fin_unmet[:G].scatter_(1, slot, chosen["unmet"])
    beam_slot = slot.new_full((G, K + 1), 2 * K).scatter_(1, torch.where(ended, chosen["beam"], K), slot)[:, :K]
    slots.fin_tokens[:G, :, :L].scatter_(1, beam_slot[:, :, None].expand(G, K, L), slots.history[:B, :L].view(G, K, L))
    if attention:
        for per_row, fin in zip(*slots.kept.buffers()):
            fin[:G, :, :L].scatter_(1, beam_slot[:, :, None].expand(G, K, L), per_row[:B, :L].view(G, K, L))
    count.add_(ended.sum(1))

    next_token = chosen["next_token"].reshape(B)
    parent = (slots.group_base[:G] + chosen["next_beam"]).view(B)
    alive.logical_and_(~((count >= K) | (step >= max_len.view(G, K)[:, 0])))
    slots.score[:B] = chosen["next_score"].reshape(B)
    lex.progress[:B, :terms] = chosen["next_progress"].reshape(B, terms)
    slots.history[:B, :L] = slots.history[parent, :L]
    slots.history[dec.rows[:B], pos] = next_token
    if attention:
        for per_row in slots.kept.buffers()[0]:
            per_row[:B, :L] = per_row[parent, :L]
    dec.reorder(parent, L)
    dec.tokens[:B] = next_token
    pos.add_(was_alive[:, None].expand(G, K).reshape(B))


def supports_options(options: SearchOptions) -> bool:
    """Whether this search runs these options: n-gram blocking and the uncached baseline are search.py's, and
    a target prefix is one forced token at most."""
    return not (options.no_repeat_ngram_size or not options.use_cache or len(options.target_prefix) > 1)


def supports(decoder: StaticDecoder, src: torch.Tensor, options: SearchOptions) -> bool:
    """Whether this search fits the decoder: rows, lengths and options (supports_options)."""
    if not supports_options(options):
        return False
    if src.size(0) * options.beam_size > decoder.max_rows or src.size(1) > decoder.max_length:
        return False
    cap = decoder.config.max_positions - 1
    longest = options.max_length if options.max_length is not None else int(src.size(1) * options.max_length_a + options.max_length_b)
    return min(longest, cap) < decoder.max_length


def _constants(decoder: StaticDecoder, forcing: bool) -> _Constants:
    cfg, device = decoder.config, decoder.device
    return _Constants(torch.tensor(banned_tokens(cfg), dtype=torch.long, device=device), cfg.eos_id, forcing)


class DeviceSearch:
    """Searches over one StaticDecoder; keeps the per-beam-size state between searches (fixed addresses
    that its captured graphs read)."""

    def __init__(self, decoder: StaticDecoder, check_every: int = CHECK_EVERY, forced_first_token: bool = False,
                 lookahead: bool | None = None):
        """forced_first_token: its steps force a per-row first token (a fairseq-family model's target code);
        without it they leave out those operations, and searches with a target prefix do not fit.
        lookahead: a check's read of which sentences still search is taken in once the next step is queued
        behind it, so that the device computes that step while the host waits for the read and works on
        it (host_copy.py); the finished sentences' rows run one step more. Default: on CUDA, where the
        device runs behind the host (elsewhere each operation is done when it returns)."""
        self.decoder = decoder
        self.check_every = check_every
        self.lookahead = decoder.device.type == "cuda" if lookahead is None else lookahead
        self.constants = _constants(decoder, forced_first_token)
        self._slots: dict[int, SearchSlots] = {}
        self._join_tables: JoinTables | None = None

    def accepts(self, src: torch.Tensor, options: SearchOptions, constraints: list[LexicalConstraints | None] | None = None) -> bool:
        """supports(), a target prefix only where the steps force one, and constraints that fit the
        buffers (device_constraints.fits) with room for the wider beam they run with."""
        if constraints is not None and any(constraints):
            options = replace(options, beam_size=max(options.beam_size, CONSTRAINED_MIN_BEAM))
            if not all(constraints_fit(lex) for lex in constraints):
                return False
        return supports(self.decoder, src, options) and self.accepts_options(options)

    def accepts_options(self, options: SearchOptions) -> bool:
        """supports_options, and a target prefix only where the steps force one (each sentence's fit is its own)."""
        return supports_options(options) and (not options.target_prefix or self.constants.forcing)

    def slots(self, K: int) -> SearchSlots:
        if K not in self._slots:  # (checked once per beam size: every step asks for its slots)
            if self.decoder.group not in (1, K):
                raise ValueError(f"this decoder's rows come in groups of {self.decoder.group}: it runs beam size {self.decoder.group} only")
            self._slots[K] = SearchSlots(self.decoder, K)
        return self._slots[K]

    def program(self, K: int, G: int, L: int, terms: int | None = None, attention: bool = False):
        """The step of G groups of K rows over L positions: (its graph key, the function to run or capture).
        terms: with lexical constraints over that many term slots (device_constraints.term_slots; beam
        search only, slots(K).constraints() made); None: without. attention: the rows keep what their
        cross-attention says (the entropy over their own_from/own_to span, the position attended most;
        slots(K).attention() is made here)."""
        dec, slots, c = self.decoder, self.slots(K), self.constants
        if attention:
            slots.attention()
        tag = "-attention" if attention else ""
        if K == 1:
            return ("greedy" + tag, G, L), lambda: _greedy_update(dec, slots, c, G, L, attention)
        if terms is not None:
            return ("beam-lexical" + tag, K, G, L, terms), lambda: _lexical_beam_update(dec, slots, c, G, L, terms, attention)
        return ("beam" + tag, K, G, L), lambda: _beam_update(dec, slots, c, G, L, attention)

    @property
    def join_tables(self) -> JoinTables:
        """Made on the first join: the fixed device block every join program reads."""
        if self._join_tables is None:
            self._join_tables = JoinTables(self.decoder.device, self.decoder.max_rows, self.decoder.max_length)
        return self._join_tables

    def join_program(self, K: int, n: int, W: int, min_length: int):
        """n sentences of up to W source tokens join the search of beam size K, from join_tables.table(n, W):
        (its graph key, the function to run or capture). min_length is part of the program."""
        dec, slots, table = self.decoder, self.slots(K), self.join_tables.table(n, W)
        return ("join", K, n, W, min_length), lambda: _join_update(dec, slots, table, min_length)

    def warmup(self, beam_sizes=(1, 4), max_sentences: int | None = None, lengths: list[int] | None = None,
               lexical: bool = False, join_tokens: int | None = None, attention: bool = False) -> int:
        """Run (and on CUDA capture) the step of every bucket for these beam sizes, up to max_sentences
        per step and these length buckets (all by default), so that no request pays for a first run;
        lexical: the constrained beam steps too (every number of term slots); join_tokens: the join
        programs too (continuous batching, min_length 0), those of at most that many source positions;
        attention: each step's twin that keeps the rows' attention too (see program()). Leaves every
        group free. Returns the number of programs."""
        dec = self.decoder
        count = 0
        for K in beam_sizes:
            slots = self.slots(K)
            for G in slots.group_buckets:
                if max_sentences is not None and G > bucket_of(min(max_sentences, slots.group_buckets[-1]), slots.group_buckets):
                    break
                for L in lengths or dec.length_buckets:
                    # harmless rows: nothing alive, every row at position 0
                    dec.pos[: G * K] = 0
                    dec.src_len[: G * K] = 1
                    slots.alive[:G] = False
                    for kept in (False, True) if attention else (False,):
                        dec.run(*self.program(K, G, L, attention=kept))
                        count += 1
                        if lexical and K > 1:
                            slots.constraints()
                            for terms in buckets(MAX_TERMS):
                                dec.run(*self.program(K, G, L, terms, attention=kept))
                                count += 1
            if join_tokens is not None:
                count += self._warm_joins(K, max_sentences, lengths or dec.length_buckets, join_tokens)
            slots.alive.fill_(False)
        if dec.device.type == "cuda":
            torch.cuda.synchronize(dec.device)
        return count

    def _warm_joins(self, K: int, max_sentences: int | None, lengths: list[int], join_tokens: int) -> int:
        """The join programs add() can run (join_chunk's sizes), on harmless sentences (one eos each)."""
        slots, tables, eos = self.slots(K), self.join_tables, self.decoder.config.eos_id
        count = 0
        for n in slots.group_buckets:
            if max_sentences is not None and n > bucket_of(min(max_sentences, slots.group_buckets[-1]), slots.group_buckets):
                break
            for W in lengths:
                if n * W > join_tokens and n > 1:
                    continue
                tables.begin()
                tables.put(list(range(n)), [[eos]] * n, [(1, 1, -1, 0, 0)] * n, W, self.decoder.config.pad_id)
                self.decoder.run(*self.join_program(K, n, W, 0))
                count += 1
        return count

    @torch.inference_mode()
    def search(self, src: torch.Tensor, options: SearchOptions, deadline: float | None = None,
               constraints: list[LexicalConstraints | None] | None = None) -> list[list[SearchHypothesis]]:
        """src (B, S) right-padded ids -> per sentence the n-best hypotheses, as search.generate;
        constraints as there (search.constrained_search: free first, then the sentences that lack a term
        with their terms, at least CONSTRAINED_MIN_BEAM beams)."""
        def search(src, options, deadline, constraints):
            if constraints is not None and any(constraints):
                return self._search(src, replace(options, beam_size=max(options.beam_size, CONSTRAINED_MIN_BEAM)), deadline, constraints)
            return self._search(src, options, deadline, None)

        return constrained_search(search, src, options, deadline, constraints)

    def _search(self, src: torch.Tensor, options: SearchOptions, deadline: float | None,
                constraints: list[LexicalConstraints | None] | None) -> list[list[SearchHypothesis]]:
        dec, cfg = self.decoder, self.decoder.config
        K = options.beam_size
        B, S = src.shape
        slots = self.slots(K)
        device = dec.device
        max_lens = max_lengths_for(src, cfg.pad_id, options, cfg.max_positions - 1)
        max_steps = int(max_lens.max())
        assert max_steps < dec.max_length, "call supports() first: this search does not fit the decoder"

        G = B  # sentences in the running rows (finished ones included until they are copied out)
        Gb = bucket_of(G, slots.group_buckets)
        n = dec.load_sources(src, repeat=K, bucket_rows=Gb * K)
        slots.max_len[:n] = device_ids(max_lens.tolist(), device)[:, None].expand(B, K).reshape(-1)
        slots.min_len[:n] = options.min_length
        slots.forced[:n] = options.target_prefix[0] if options.target_prefix else -1
        slots.alive[:B] = True
        slots.alive[B:Gb] = False
        if K == 1:
            slots.score[:n] = 0.0
        else:
            slots.score[:n].view(B, K).fill_(-math.inf)[:, 0] = 0.0  # only beam 0 is live at first
        slots.start(torch.arange(B, device=device), constraints)
        terms = term_slots(constraints) if K > 1 and constraints is not None else None
        sentences = list(range(B))  # sentence index of each group of rows
        results: list[list[SearchHypothesis] | None] = [None] * B

        steps = 0
        waiting: HostCopy | None = None  # which sentences still searched at the last check, on its way (lookahead)
        reads: list[tuple[FinishedRead, list[int]]] = []  # finished sentences' hypotheses on their way, their indices

        def check(alive: list[bool]) -> bool:
            """The finished leave when the rest fit a smaller bucket (to the front of it); True once none runs."""
            nonlocal G, Gb, sentences
            running = [g for g in range(G) if alive[g]]
            if running and bucket_of(len(running), slots.group_buckets) >= Gb:
                return False
            finished = [g for g in range(G) if not alive[g]]
            if finished:
                read = read_finished(dec, slots, finished, steps, [options.length_penalty] * len(finished),
                                     [options.num_hypotheses] * len(finished))
                reads.append((read, [sentences[g] for g in finished]))
            if not running:
                return True
            groups = device_ids(running, device)
            rows = (groups[:, None] * K + torch.arange(K, device=device)).view(-1)
            dec.keep_rows(rows, min(max(S, steps + 1), dec.max_length))
            slots.keep(groups, rows)
            sentences = [sentences[g] for g in running]
            G, Gb = len(running), bucket_of(len(running), slots.group_buckets)
            slots.alive[G:Gb] = False
            return False

        while True:
            check_deadline(deadline)
            dec.run(*self.program(K, Gb, dec.length_bucket(max(S, steps + 1)), terms))
            steps += 1
            # what was read behind the steps before, while this one runs
            for read, indices in reads:
                for i, hyps in zip(indices, read.hypotheses()):
                    results[i] = hyps
            reads.clear()
            if waiting is not None:
                alive, waiting = waiting.wait()[0].tolist(), None
                if check(alive):
                    break
            if steps % self.check_every and steps < max_steps:
                continue
            if self.lookahead and steps < max_steps:
                waiting = HostCopy([slots.alive[:G]])  # read once the next step is queued behind it
            elif check(HostCopy([slots.alive[:G]]).wait()[0].tolist()):
                break
        for read, indices in reads:
            for i, hyps in zip(indices, read.hypotheses()):
                results[i] = hyps
        return results  # type: ignore[return-value]


@dataclass
class FinishedRead:
    """The hypotheses of finished sentences on their way to the host (read_finished): hypotheses() waits for
    them and makes the n-best lists."""

    copy: HostCopy
    K: int
    length_penalties: list[float]
    num_hypotheses: list[int]
    keeps: list[bool]

    def hypotheses(self) -> list[list[SearchHypothesis]]:
        # the wide buffers (tokens, kept attention: a row per hypothesis slot, as wide as the steps run) are
        # sliced in numpy per hypothesis kept: lists of all of them, mostly past each hypothesis's end or of
        # beam slots that are not kept, cost more than the rest of the collection
        host = self.copy.wait()
        keep = any(self.keeps)
        if self.K == 1:
            lengths, scores = host[0].tolist(), host[1].tolist()  # lengths: tokens generated, eos included
            tokens = host[2].numpy()
            entropies, looks = (t.numpy() for t in host[3:5]) if keep else (None, None)
            return [[SearchHypothesis(tokens[i, : length - 1].tolist(), score, normalize(score, length, lp), True,
                                      entropies=entropies[i, :length].tolist() if k else None,
                                      looks=looks[i, :length].tolist() if k else None)]
                    for i, (length, score, lp, k) in enumerate(zip(lengths, scores, self.length_penalties, self.keeps))]
        counts, scores, lengths, unmet = (host[j].tolist() for j in (0, 1, 2, 4))  # slots past a sentence's count are stale
        tokens = host[3].numpy()
        entropies, looks = (t.numpy() for t in host[5:7]) if keep else (None, None)
        found = []
        for i, (lp, n, k) in enumerate(zip(self.length_penalties, self.num_hypotheses, self.keeps)):
            score, length, miss = scores[i], lengths[i], unmet[i]
            # every slot's hypothesis ranked, the n best given their tokens (and what they kept)
            hyps = [SearchHypothesis([], score[j], normalize(score[j], length[j], lp), True, miss[j]) for j in range(counts[i])]
            best = sorted(range(len(hyps)), key=lambda j: ranking(hyps[j]), reverse=True)[:n]  # stable: ties in slot order
            for j in best:
                hyps[j].tokens = tokens[i, j, : length[j] - 1].tolist()
                if k:
                    hyps[j].entropies, hyps[j].looks = entropies[i, j, : length[j]].tolist(), looks[i, j, : length[j]].tolist()
            found.append([hyps[j] for j in best])
        return found


def read_finished(decoder: StaticDecoder, slots: SearchSlots, groups: list[int], width: int, length_penalties: list[float],
                  num_hypotheses: list[int], attention: list[bool] | None = None) -> FinishedRead:
    """Queue the copy of finished sentences' hypotheses (groups of rows) out of the device, one copy per
    buffer for all of them, without waiting for it. width: no hypothesis has more tokens, eos included
    (the steps they ran: the host knows it without asking; the per-position buffers are max_length wide,
    and turning all of it into Python lists cost more than the rest of a large batch's collection).
    attention: per group, whether its hypotheses carry what the search kept of their attention
    (entropies, looks: one per generated token, eos's included)."""
    K = slots.K
    index = device_ids(groups, slots.score.device)
    keeps = list(attention) if attention is not None and any(attention) else [False] * len(groups)
    width = max(1, min(width, slots.history.size(1)))
    if K == 1:
        tensors = [decoder.pos[index], slots.score[index], slots.history[index, :width]]
        if any(keeps):
            tensors += [b[index, :width] for b in slots.kept.buffers()[0]]
    else:
        tensors = [slots.fin_count[index], slots.fin_score[index], slots.fin_len[index], slots.fin_tokens[index, :, :width],
                   slots.fin_unmet[index]]
        if any(keeps):
            tensors += [b[index, :, :width] for b in slots.kept.buffers()[1]]
    return FinishedRead(HostCopy(tensors), K, list(length_penalties), list(num_hypotheses), keeps)
