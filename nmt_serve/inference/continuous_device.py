"""Continuous batching over the static decoder: sentences join and leave a search whose step is one
captured program (CUDA graphs) and whose bookkeeping stays on the device.

ContinuousSearch (continuous.py) runs the eager step: on a GPU its ~50 kernel launches, the
log-softmax/top-k and the per-step read of every chosen token cost milliseconds of host time for
a step whose kernels take a fraction of one. This search keeps the same interface,

    search = ContinuousDeviceSearch(DeviceSearch(StaticDecoder(runner, max_rows=256)), beam_size=1)
    search.add([Sentence(key, src_ids, max_length=...)])   # encodes them, their rows take free slots
    finished = search.step()                               # one token for every row; [(key, n-best)]

and runs each step as DeviceSearch's program for a (groups, positions) bucket: the decoder step, the
constraints, the choice of tokens or beams, the finished hypotheses and the beam reorder, all in the
decoder's fixed-address buffers. Rows come in groups of K (one sentence's beams) at fixed slots; in
the static decoder every row has its own position and source length, so a sentence that joins late
simply starts at position 0 in its slot, and its search is the one it gets alone.

The host keeps what it can know without asking the device (which slots hold which sentence, how
many steps each has run, hence the length bucket) and reads back one small tensor, which sentences
are still searching, every `check_every` steps (at once when a sentence reaches its max_length):
finished sentences are copied out and their slots freed for the next ones to join. Until then a
finished sentence's rows keep being computed and ignored, a little work instead of a wait on the
device each step. When the live sentences fit a smaller bucket they move to the front slots, before the
next step: after the sentences that join at the check have taken the free slots. With `lookahead` (on
CUDA) the read of a check is taken in by the next step() once that step is queued, and the finished
sentences' hypotheses by the one after (host_copy.py): the device always has a step to compute while
the host waits for a read and while the engine replies and prepares joins between steps.

Sentences with lexical constraints (beam search only) join like the others, their constraints in the
search's device buffers (device_constraints.py); while any runs, the step is the constrained program,
which gives the free sentences beside them what the plain one does. A hypothesis that ends with a
term unmet comes back flagged `unmet`, as from the eager search: the caller searches again without the
terms.

A sentence with an `attention_span` keeps, as in ContinuousSearch, each target token's entropy of the
cross-attention over its own source pieces and the position it attends most: while any such sentence
runs, the steps are the programs that keep them for every row, in device buffers that follow the beams
like the tokens (DeviceSearch.program's `attention`), copied out with the finished hypotheses.

Sentences must fit the decoder (`fits`): source and output within its max_length, constraints within
the buffers; the caller sends the others to the eager ContinuousSearch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import torch

from nmt_serve.inference.continuous import Sentence
from nmt_serve.inference.device_constraints import fits as constraints_fit
from nmt_serve.inference.device_constraints import term_slots
from nmt_serve.inference.device_search import CHECK_EVERY, JOIN_TOKENS, DeviceSearch, FinishedRead, join_chunk, read_finished
from nmt_serve.inference.host_copy import HostCopy, device_ids
from nmt_serve.inference.search import SearchHypothesis
from nmt_serve.inference.static_decoder import bucket_of


@dataclass
class _Slot:
    sentence: Sentence
    joined: int  # the search's step count when it joined: it has run `search.steps - joined` steps
    cancelled: bool = False


class ContinuousDeviceSearch:
    def __init__(self, device_search: DeviceSearch, *, beam_size: int = 1, min_length: int = 0, check_every: int = CHECK_EVERY,
                 join_tokens: int = JOIN_TOKENS, lookahead: bool | None = None):
        """join_tokens: the most source positions (sentences x padded length) one join program encodes;
        a join of more runs in several (the graphs' memory pool holds the largest one's activations).
        lookahead (default: the DeviceSearch's, on CUDA): what a check reads back is taken in by the next
        step() once that step is queued, and the finished sentences' hypotheses by the one after, so that
        the device always has a step to run while the host waits for a read and while the caller works
        between steps (replies, joins); their slots are free one step later and their results come two."""
        self.device_search = device_search
        self.join_tokens = join_tokens
        self.decoder = device_search.decoder
        self.runner = self.decoder.runner
        self.config = self.decoder.config
        self.K = beam_size
        self.min_length = min_length
        self.check_every = check_every
        self.lookahead = device_search.lookahead if lookahead is None else lookahead
        self.state = device_search.slots(beam_size)  # the fixed-address search state its programs read
        self.capacity = self.decoder.max_rows // beam_size  # sentences at once
        self.slots: list[_Slot | None] = []  # the sentence in each group of K rows, None where free
        self.steps = 0  # steps run
        self._since_check = 0  # steps since a check's read was taken in (joins come right after one)
        self._since_read = 0  # steps since a check's read was queued (lookahead: taken in one step later)
        # summaries of the running sentences, remade when they change (not every step)
        self._running = 0
        self._longest_source = 0  # source positions every step reads
        self._first_joined = 0  # the step count when the oldest joined (bounds every row's position)
        self._first_end = 0  # the step count by which some sentence reaches its max_length
        self._terms: int | None = None  # term slots of the running sentences' constraints (term_slots); None: no constraints
        self._attention = False  # some running sentence keeps its attention (attention_span): the steps keep it for every row
        self._cancelled = False
        # sentences left at the last check: the slots are trimmed before the next step, after the joins that may
        # fill them (trimmed at once, a bucket that shrank would grow again with the joins, its rows copied for nothing)
        self._trim_due = False
        # lookahead: which sentences ran at the last check (its slots then, and their copy on its way), and
        # the hypotheses of those found finished, on their way with their slots
        self._reading: tuple[HostCopy, list[_Slot | None]] | None = None
        self._collecting: tuple[FinishedRead, list[_Slot]] | None = None
        self._handed_over = False  # the last step handed finished sentences' results over (lookahead)

    def __len__(self) -> int:
        """Sentences whose results are still to come: running, or finished and on their way."""
        return self._running + (len(self._collecting[1]) if self._collecting is not None else 0)

    @property
    def running(self) -> int:
        """Sentences still searching (their rows computed by every step)."""
        return self._running

    @property
    def rows(self) -> int:
        """Rows the next step computes: its bucket of groups (once the slots are trimmed), times K."""
        if not self._trim_due:
            return self._group_bucket() * self.K if self.slots else 0
        if not self._running:
            return 0
        used = len(self.slots)
        while self.slots[used - 1] is None:
            used -= 1
        return min(bucket_of(used, self.state.group_buckets), bucket_of(self._running, self.state.group_buckets)) * self.K

    def keys(self) -> list[Hashable]:
        """The keys of the sentences whose results are still to come."""
        owed = [s.sentence.key for s in self._collecting[1] if not s.cancelled] if self._collecting is not None else []
        return [s.sentence.key for s in self.slots if s is not None] + owed

    def room(self) -> int:
        return self.capacity - self._running

    def joinable(self) -> bool:
        """Whether sentences should join now: when nothing runs, or right after a read of which
        sentences finished. A join runs the encoder and copies rows into the decoder (eager, it cost
        about 5 ms on an H100 host against 0.5 ms for a replayed step: BENCHMARKS.md; see add() for
        the captured join): joining once per check, with everything that arrived meanwhile, pays that
        once instead of every step, at the cost of waiting up to check_every - 1 steps. With lookahead
        also at the step after, which hands over the finished sentences' results: the next calls of
        the callers they answer join then, not a check later."""
        return self._running == 0 or self._since_check == 0 or self._handed_over

    def fits(self, sentence: Sentence) -> bool:
        """Whether the sentence's source and output fit the decoder's positions, and its lexical
        constraints (beam search only) the device buffers."""
        return (len(sentence.src) <= self.decoder.max_length and sentence.max_length < self.decoder.max_length
                and len(sentence.prefix) <= (1 if self.device_search.constants.forcing else 0)
                and (not sentence.constraints or (self.K > 1 and constraints_fit(sentence.constraints))))

    # ------------------------------------------------------------------ joining
    @torch.inference_mode()
    def add(self, sentences: list[Sentence]) -> None:
        """Encode the new sentences and put them in free slots (a step boundary).

        The join runs as programs over fixed buffers (captured on CUDA like the steps): the sentences,
        by source length, in chunks whose sizes are the group buckets (a join of 11 runs programs for
        8, 2 and 1; more, smaller ones past join_tokens), each chunk's sources padded to a length
        bucket. Their ids reach the device in one asynchronous copy per chunk, so a join waits neither
        for the step in flight nor on dozens of eager launches (DeviceSearch.join_program)."""
        if not sentences:
            return
        if len(sentences) > self.room():
            raise ValueError(f"{len(sentences)} sentences joining, room for {self.room()}")
        if not all(self.fits(s) for s in sentences):
            raise ValueError("a sentence does not fit the static decoder (see fits())")
        dec, st, cfg, K = self.decoder, self.state, self.config, self.K
        n = len(sentences)
        free = [g for g, s in enumerate(self.slots) if s is None][:n]
        groups = free + list(range(len(self.slots), len(self.slots) + n - len(free)))
        self.slots += [None] * (n - len(free))
        tables = self.device_search.join_tables
        tables.begin()
        order = sorted(range(n), key=lambda i: len(sentences[i].src))
        lengths = [len(sentences[i].src) for i in order]
        done = 0
        while done < n:
            size, W = join_chunk(lengths[done:], st.group_buckets, dec.length_buckets, self.join_tokens)
            chunk = order[done:done + size]
            done += size
            joining = [sentences[i] for i in chunk]
            tables.put([groups[i] for i in chunk], [s.src for s in joining],
                       [(len(s.src), s.max_length, s.prefix[0] if s.prefix else -1, *(s.attention_span or (0, 0))) for s in joining],
                       W, cfg.pad_id)
            dec.run(*self.device_search.join_program(K, size, W, self.min_length))
        st.load_constraints(groups, [s.constraints for s in sentences])
        for g, s in zip(groups, sentences):
            self.slots[g] = _Slot(s, self.steps)
        self._joined(sentences)

    def cancel(self, keys: set[Hashable]) -> None:
        """The sentences with these keys leave at the next step, without a result."""
        for s in self.slots:
            if s is not None and s.sentence.key in keys:
                s.cancelled = self._cancelled = True
        for s in self._collecting[1] if self._collecting is not None else ():
            if s.sentence.key in keys:
                s.cancelled = True  # finished already: its result is dropped when it arrives

    def _joined(self, sentences: list[Sentence]) -> None:
        """The summaries with these sentences joined at this step (the running ones' stand: the
        newcomers can only raise the longest source and lower the first end)."""
        if not self._running or any(s.constraints for s in sentences) or self._terms is not None:
            self._summarize()
            return
        self._running += len(sentences)
        self._longest_source = max(self._longest_source, max(len(s.src) for s in sentences))
        self._first_end = min(self._first_end, self.steps + min(s.max_length for s in sentences))
        self._attention = self._attention or any(s.attention_span for s in sentences)

    def _summarize(self) -> None:
        """The summaries remade from every slot (one pass: with hundreds running, a pass per summary
        cost the engine's loop tens of microseconds each time sentences left)."""
        running = longest = 0
        first_joined = first_end = 1 << 62
        constrained = attention = False
        for slot in self.slots:
            if slot is None:
                continue
            running += 1
            sentence, joined = slot.sentence, slot.joined
            longest = max(longest, len(sentence.src))
            first_joined = min(first_joined, joined)
            first_end = min(first_end, joined + sentence.max_length)
            constrained = constrained or bool(sentence.constraints)
            attention = attention or bool(sentence.attention_span)
        self._running = running
        if running:
            self._longest_source, self._first_joined, self._first_end = longest, first_joined, first_end
        self._terms = term_slots([s.sentence.constraints for s in self.slots if s is not None]) if constrained else None
        self._attention = attention

    # ------------------------------------------------------------------ one step
    def _group_bucket(self) -> int:
        return bucket_of(len(self.slots), self.state.group_buckets)

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[SearchHypothesis]]]:
        """Decode one token for every row; return the sentences found finished, with their n-best
        hypotheses (best first). Cancelled sentences leave without appearing here."""
        dec, st = self.decoder, self.state
        if self._cancelled:
            self._cancelled = False
            cancelled = [g for g, s in enumerate(self.slots) if s is not None and s.cancelled]
            st.alive[device_ids(cancelled, dec.device)] = False
            for g in cancelled:
                self.slots[g] = None
            self._trim()
            self._summarize()
        stepped = bool(self._running)
        if stepped:
            if self._trim_due:
                self._trim()
            # positions this step reads: every running row's source, and its target up to the new token;
            # no row has run more steps than the oldest, nor past the decoder's positions
            target = min(self.steps - self._first_joined + 1, dec.max_length)
            dec.run(*self.device_search.program(self.K, self._group_bucket(), dec.length_bucket(max(self._longest_source, target)),
                                                self._terms, self._attention))
            self.steps += 1
            self._since_check += 1
            self._since_read += 1
        if not self.lookahead:
            done = self._finished(self._read_alive()) if stepped and self._check_due() else []
        else:
            # what was read behind the steps before, taken in while this one runs
            self._handed_over = self._collecting is not None
            done = self._collected()
            if self._reading is not None:
                self._collect(self._finished_slots(*self._reading))
                self._reading = None
            if stepped and self._check_due():
                self._since_read = 0
                self._reading = (HostCopy([st.alive[: len(self.slots)]]), list(self.slots))
        if not self._running:
            self.slots = []
            self._trim_due = False
        return done

    def _check_due(self) -> bool:
        """Whether this step ends with a read of which sentences still search: every check_every steps, and
        at every step while a sentence may have reached its max_length (it leaves at once)."""
        return self._since_read >= self.check_every or self.steps >= self._first_end

    def _read_alive(self) -> list[_Slot]:
        """Which running sentences finished: read now (the one read back of a check, without lookahead)."""
        self._since_read = 0
        return self._finished_slots(HostCopy([self.state.alive[: len(self.slots)]]), self.slots)

    def _finished_slots(self, read: HostCopy, seen: list[_Slot | None]) -> list[_Slot]:
        """Of the sentences in the slots `seen` at a check, those that no longer searched and are still
        here (not cancelled since; wherever a trim has moved them), from that check's read."""
        self._since_check = 0
        alive = read.wait()[0].tolist()
        here = {id(s) for s in self.slots if s is not None}
        return [s for g, s in enumerate(seen) if s is not None and not alive[g] and id(s) in here]

    def _read(self, finished: list[_Slot]) -> FinishedRead | None:
        """Queue the copy of the finished sentences' hypotheses and free their slots."""
        if not finished:
            return None
        where = {id(s): g for g, s in enumerate(self.slots) if s is not None}
        groups = [where[id(s)] for s in finished]
        sentences = [s.sentence for s in finished]
        width = min(self.steps - min(s.joined for s in finished), self.decoder.max_length)  # tokens they can hold
        read = read_finished(self.decoder, self.state, groups, width, [s.length_penalty for s in sentences],
                             [s.num_hypotheses for s in sentences], [s.attention_span is not None for s in sentences])
        for g in groups:
            self.slots[g] = None
        self._trim_due = True
        self._summarize()
        return read

    def _finished(self, finished: list[_Slot]) -> list[tuple[Hashable, list[SearchHypothesis]]]:
        """The finished sentences copied out now, their slots freed."""
        read = self._read(finished)
        return [] if read is None else [(s.sentence.key, hyps) for s, hyps in zip(finished, read.hypotheses())]

    def _collect(self, finished: list[_Slot]) -> None:
        """The finished sentences' slots freed, their hypotheses left on their way (taken by _collected)."""
        read = self._read(finished)
        self._collecting = None if read is None else (read, finished)

    def _collected(self) -> list[tuple[Hashable, list[SearchHypothesis]]]:
        if self._collecting is None:
            return []
        (read, finished), self._collecting = self._collecting, None
        return [(s.sentence.key, hyps) for s, hyps in zip(finished, read.hypotheses()) if not s.cancelled]

    def _trim(self) -> None:
        """Drop free slots off the end; when the sentences left fit a smaller bucket, move them to the
        front slots (a copy of their rows) so that steps compute fewer rows."""
        self._trim_due = False
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        live = [g for g, s in enumerate(self.slots) if s is not None]
        if not live or bucket_of(len(live), self.state.group_buckets) >= self._group_bucket():
            return
        K, device = self.K, self.decoder.device
        groups = device_ids(live, device)
        rows = (groups[:, None] * K + torch.arange(K, device=device)).view(-1)
        # no running row has more positions than the longest source or the oldest sentence's target
        positions = min(max(self._longest_source, self.steps - self._first_joined + 1), self.decoder.max_length)
        self.decoder.keep_rows(rows, positions)
        self.state.keep(groups, rows)
        self.slots = [self.slots[g] for g in live]
        self._summarize()
        # the slots past the live ones keep stale rows: not searching (they may be read, never used)
        self.state.alive[len(live): self._group_bucket()] = False
