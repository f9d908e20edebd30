"""The engine: calls in, replies out, one decoder step at a time (continuous batching).

EngineCore knows nothing of sockets or HTTP: `handle(message)` takes a call (translate, attention,
cancel) and `work()` runs one step of every running batch; both return the replies that are ready.
The process around it (process.py) moves messages; the tests drive it directly.

- A translate call is admitted or refused at once (admission.py: the work admitted and not finished,
  at the measured rate, must finish within the call's deadline), then its sentences wait in a FIFO.
- Sentences run in one continuous search per (model, beam size): at every step boundary waiting
  sentences join (up to `max_batch_sentences` running and `max_batch_tokens` source tokens encoded
  per step), and finished ones leave at once and complete their call. Where the model uses the
  static decoder (CUDA by default) that search is ContinuousDeviceSearch, whose steps are captured
  graphs, one decoder of its own per beam size (graphs captured at start-up for beams 1 and 4);
  sentences too long for the decoder run in an eager ContinuousSearch beside it.
- A call past its deadline, or cancelled by its caller, leaves (queued or running) and frees its
  admitted work.
- Attention calls wait for the next round and run together (one forced decoding per model for those
  that give their translation). With lanes (CPU) they run on a thread of their own while the lanes
  go on stepping, and the calls that come in meanwhile run together next; without, between steps.
- A background call (a job's chunk, protocol.BACKGROUND) waits in a queue of its own: its sentences join
  only while no interactive sentence waits, hold at most `background_share` of the running sentences
  of a model and beam size, and keep to that share of the lanes (at least one): interactive calls join
  at the next step boundary whatever a job has queued, and on CPU find lanes with no job in them. On
  CPU the lanes step together, so a round lasts as long as its largest step: while interactive calls
  are about, a job's sentences join only one per lane (those running finish).
- On CPU the running sentences are spread over `lanes` searches per (model, beam size), whose steps
  run at the same time on a pool of threads, each with `threads` torch threads of its own (one by
  default): independent single-threaded decode loops, as CTranslate2's inter_threads, rather than one
  loop whose OpenMP threads wait on each other at every op. Measured on 2 cores (BENCHMARKS.md): 1.4x
  (beam 4) to 1.7x (greedy) the sentences/s of one loop with 2 threads on a quiet machine, and no
  collapse when another process takes a core. A sentence joins the lane with the least work. A round in
  which one search steps (one request at a time, the last sentences of a batch) runs it on the engine's
  own thread with as many torch threads as the usable cores other processes left idle (cpu_room.py;
  `threads` 0): nothing else steps then.
"""
from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections import deque
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from nmt_serve.engine.admission import Admission
from nmt_serve.engine.attention_maps import attention_maps, forced_attention_maps, own_pieces, searched_entropy
from nmt_serve.engine.cpu_room import CpuRoom
from nmt_serve.engine.memory_plan import MemoryPlan
from nmt_serve.engine.protocol import (
    EXPIRED,
    FAILED,
    INTERACTIVE,
    INVALID,
    OUT_OF_MEMORY,
    REFUSED,
    Attention,
    Cancel,
    DecodeOptions,
    EngineHypothesis,
    EngineStatus,
    Reply,
    Translate,
)
from nmt_serve.engine.result_cache import ResultCache
from nmt_serve.inference.attention import attention_backend
from nmt_serve.inference.continuous import ContinuousSearch, Sentence
from nmt_serve.inference.continuous_device import ContinuousDeviceSearch
from nmt_serve.inference.device_search import DeviceSearch
from nmt_serve.inference.lexical_constraints import LexicalConstraints
from nmt_serve.inference.search import (
    CONSTRAINED_MIN_BEAM,
    EMPTY,
    SearchHypothesis,
    SearchOptions,
    max_length_of,
)
from nmt_serve.inference.static_decoder import StaticDecoder
from nmt_serve.inference.translator import Translator
from nmt_serve.network.routing import decode_cost

log = logging.getLogger("engine")
CALIBRATION_TEXT = "Ein Mann mit einer roten Jacke fährt mit dem Fahrrad durch die Straßen der Stadt."
RATE_WINDOW_S = 0.5  # engine time over which the rate for admission is measured
EXPIRY_CHECK_S = 0.02  # how often calls are checked against their deadlines
CALIBRATION_ROUNDS = 3  # at most; the best round is kept
CALIBRATION_SECONDS = 2.0  # no further rounds once the rounds took this long; a round still going then is cut short
# (NLLB-200-600M's shape on a 2-core CPU: one round of 2 x 16 sentences took 36 s)
WARMUP_BEAMS = (1, 4)  # beam sizes whose device-search graphs are captured at start-up
# max_batch_sentences by device: on CPU a step costs in proportion to its rows, so more rows mostly
# add latency; on a GPU a step of 256 rows costs about what one of 16 does
AUTO_BATCH_SENTENCES = {"cpu": 64, "cuda": 256}
ATTENTION_BATCH = 16  # attention calls forced-decoded in one pass at most (their maps are (T, S) per layer and head)
ATTENTION_WAIT_S = 0.005  # with nothing else to do, how long a round waits for attention work before it looks for calls
INTERACTIVE_GRACE_S = 0.5  # on CPU, background sentences keep to one per lane this long after an interactive call left


@dataclass
class EngineConfig:
    """The engine's share of the service settings (a plain dataclass: the engine imports no pydantic)."""

    max_batch_sentences: int = 0  # sentences running at once per (model, beam size); 0: AUTO_BATCH_SENTENCES
    lanes: int = 1  # searches per (model, beam size) whose steps run side by side (CPU); 0: usable_cores() / engines
    engines: int = 1  # engine processes of the server, this one among them: each takes its share of the cores
    threads: int = 0  # torch threads of each lane (0: one where there are several lanes or engines, a lone search the idle cores: CpuRoom; else torch's default)
    max_batch_tokens: int = 4096  # source tokens encoded per step (the cost of joining)
    max_queue_sentences: int = 2048  # sentences of the calls in the engine (waiting, running or done in an unfinished call) at most
    batching: bool = True  # false: a batch runs one call at a time (for comparison)
    admission: bool = True
    admission_margin: float = 0.8
    admission_rate: float = 0.0  # decode units/s to start from; 0: calibrate() measures it at start-up
    retry_after_s: int = 1
    background_share: float = 0.25  # of a search's running sentences, at most this share (at least one) background ones
    translation_cache_entries: int = 0  # n-best lists kept for all API workers (result_cache.py); the service sets it where workers > 1


@dataclass
class _Call:
    message: Translate
    results: list[list[EngineHypothesis] | None]  # per text, its n-best
    left: int  # sentences not finished
    reservation: tuple[float, int, bool]  # admitted work units, sentences and whether background, released when the call leaves
    source_tokens: list[int]  # per text, eos excluded (0 for empty texts)
    max_lengths: list[int] = field(default_factory=list)  # per text, tokens it may generate (eos included)
    groups: set = field(default_factory=set)  # the keys of the groups its sentences run in
    unmet: set = field(default_factory=set)  # texts whose terms did not fit: their free translation goes, flagged
    sources: list = field(default_factory=list)  # per text its encoder ids (None: empty)
    keys: list = field(default_factory=list)  # per text its key in the translation cache (ResultCache.keys)
    lexical: list = field(default_factory=list)  # per text its LexicalConstraints (None: free)
    # texts with terms, translated free first (search.constrained_search): their free n-best, kept for
    # when the terms cannot be placed
    free: dict = field(default_factory=dict)


@dataclass
class _Group:
    search: ContinuousSearch | ContinuousDeviceSearch
    waiting: deque = field(default_factory=deque)  # (call id, index, Sentence)
    background: deque = field(default_factory=deque)  # the same, of background calls: they join after `waiting`

    def room(self, max_sentences: int) -> int:
        return min(max_sentences - len(self.search), self.search.room())


@dataclass
class _StepOutcome:
    done: list  # (sentence key, n-best) of the sentences that finished
    error: Exception | None  # of the step
    seconds: float  # the join's and the step's
    rows: int  # rows the step computed
    live: int  # of them, rows of sentences still searching
    stepped: bool = True
    join_error: Exception | None = None
    join_seconds: float = 0.0  # of `seconds`, the join's (the joining sentences' encoder)
    ended: float = 0.0  # perf_counter() at its end


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, bounded by a cgroup CPU quota (a pod's limit)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def is_device_fault(exc: BaseException) -> bool:
    """A CUDA error other than out of memory (an illegal address, a device-side assert): it breaks the
    device's context for every call, not one, so it ends the engine process, and the supervisor starts
    a new one on a fresh context."""
    if is_out_of_memory(exc):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)  # torch >= 2.8; before, a RuntimeError that says so
    return (accelerator_error is not None and isinstance(exc, accelerator_error)) or "CUDA error" in str(exc)


class NoTranslation(RuntimeError):
    """The calibration's translations scored NaN: weights that load but do not compute."""

    def __init__(self) -> None:
        super().__init__("the model produced no translation of the calibration text (its scores are not numbers)")

    @classmethod
    def check(cls, done: list[tuple]) -> None:
        """Raised where a finished sentence has no hypothesis or its best scores NaN."""
        if not all(h and not math.isnan(h[0].score) for _, h in done):
            raise cls()


class EngineCore:
    def __init__(self, models: dict[str, Translator], config: EngineConfig, *, model_meta: dict[str, dict] | None = None,
                 memory: MemoryPlan | None = None, unloaded: list[dict] | None = None):
        """model_meta: more to report per model id (checkpoint path, load time, tokenizer file);
        memory: the plan the models were loaded under (memory_plan.py): it sets the running sentences;
        unloaded: the checkpoints of the models directory left unloaded, and why (loader.LoadPlan)."""
        self.models = models
        self.model_meta = model_meta or {}
        self.unloaded = unloaded or []
        self.memory = memory
        self._model_info: dict[str, dict] | None = None
        on_cuda = any(t.device.type == "cuda" for t in models.values())
        if memory is not None:
            config = replace(config, max_batch_sentences=memory.sentences)
        elif not config.max_batch_sentences:
            config = replace(config, max_batch_sentences=AUTO_BATCH_SENTENCES["cuda" if on_cuda else "cpu"])
        # lanes are for the CPU: on a GPU one step already fills the device, and its graphs are one per beam size
        config = replace(config, lanes=1 if on_cuda else (config.lanes or max(1, usable_cores() // config.engines)))
        self.config = config
        self._pool = self._attention_pool = None
        self._room: CpuRoom | None = None
        if config.lanes > 1 or (config.engines > 1 and not on_cuda):
            # this thread's joins too; and an engine beside others has its share of the cores, one per lane
            torch.set_num_threads(config.threads or 1)
            if not config.threads and not on_cuda:
                # a search stepped alone on this thread takes the cores the other processes leave idle (cpu_room.py)
                self._room = CpuRoom(usable_cores())
        if config.lanes > 1:
            self._pool = ThreadPoolExecutor(config.lanes, thread_name_prefix="engine-lane",
                                            initializer=torch.set_num_threads, initargs=(config.threads or 1,))
            # a forced decoding costs about what translating the sentence did: on its own thread the lanes do not wait for it
            self._attention_pool = ThreadPoolExecutor(1, thread_name_prefix="engine-attention",
                                                      initializer=torch.set_num_threads, initargs=(config.threads or 1,))
        self.incarnation = uuid.uuid4().hex
        self.calls: dict[int, _Call] = {}
        self.groups: dict[tuple[str, int, str, int], _Group] = {}  # (model, beam size, "device" or "eager", lane)
        self._device_searches: dict[tuple[str, int], DeviceSearch] = {}  # one static decoder per model and beam size
        self.admission = Admission(rate=1.0, margin=config.admission_margin)
        self._queued_sentences = 0  # sentences of the calls taken in and not finished (max_queue_sentences)
        # on CPU a step costs in proportion to its rows and the lanes step together: while interactive calls
        # are about, background sentences join only one per lane (see _joining)
        self._cpu = not on_cuda
        self._interactive_at = -1e9  # when the last interactive call left
        # call id -> what screen() reserved (work units, sentences) and the sources it checked, until handle() takes them
        self._reserved: dict[Any, tuple[float, int, list, list, list]] = {}  # screen()'s: cost, sentences, sources, keys, kept n-best
        self.cache = ResultCache(config.translation_cache_entries)
        # with the cache on, a text that another call's search already answers takes that answer (_follow): the
        # text whose search answers each (priority, key), and the texts of other calls waiting on it
        self._answering: dict[tuple[int, Hashable], tuple[Any, int]] = {}
        self._sharing: dict[tuple[Any, int], list[tuple[Any, int]]] = {}
        self._attention_calls: list[Attention] = []  # for the next round
        self._attending: tuple[Future, list[Attention]] | None = None  # the attention calls running on their thread
        self.started = time.monotonic()
        self._last_expiry_check = 0.0
        self._window = [0.0, 0.0, 0, 0]  # engine seconds, units, source tokens, output tokens
        self.model_stats = {mid: dict(source_tokens=0.0, generated_tokens=0.0, sentences=0.0) for mid in models}
        self._recent = dict(at=time.monotonic(), busy=0.0, steps=0.0, step_seconds=0.0, rows_live=0.0, rows_computed=0.0)
        self.stats: dict[str, float] = dict.fromkeys((
            "busy_seconds", "steps", "step_seconds", "join_seconds", "rows_computed", "rows_live", "joins", "sentences_joined",
            "sentences_done", "admitted_units", "refused_units", "refused_calls", "expired_calls",
            "failed_calls", "calls", "call_seconds", "result_seconds", "io_seconds", "attention_calls", "attention_seconds",
            "cache_hits", "shared_sentences", "wide_steps",
        ), 0.0)

    # ------------------------------------------------------------------ status
    def model_info(self) -> list[dict]:
        """What the API learns of each model; the fixed part is made once (status goes out every 0.1 s)."""
        if self._model_info is None:
            self._model_info = {
                # a many-to-many model's directions are every pair of its language codes: the codes go, not the
                # pairs (unless it serves some of them only)
                mid: dict(id=mid, source=t.source_lang, target=t.target_lang,
                          directions=t.info.directions if t.info.language_codes else t.directions,
                          target_tags=t.info.target_tags, language_codes=t.info.language_codes, test_bleu=t.test_bleu(), test_scores=t.info.test_scores(), quality_flags=t.info.flag_threshold_table(), parameters=t.num_parameters(), decode_cost=decode_cost(t.config), device=str(t.device),
                          dtype=str(t.dtype).removeprefix("torch."), attention=attention_backend(t.device), quantization=t.quantization, step_mode=t.step_mode,
                          n_decoder_layers=t.config.n_decoder_layers, n_encoder_layers=t.config.n_encoder_layers,
                          n_heads=t.config.n_heads, max_positions=t.config.max_positions,
                          append_eos_to_source=t.config.append_eos_to_source, source_suffix=t.info.source_suffix,
                          shared_weights_bytes=t.runner.shared_weights.shared_bytes if t.runner.shared_weights else 0,
                          **self.model_meta.get(mid, {}))
                for mid, t in self.models.items()
            }
        # static decoders' graphs are captured as buckets are first used: their memory can grow
        return [dict(info, static_decoder=self._static_memory(mid), memory=self._memory_of(mid)) for mid, info in self._model_info.items()]

    def _memory_of(self, model_id: str) -> dict | None:
        """The memory plan's share of one model, the plan's totals, and what the device holds now."""
        if self.memory is None:
            return None
        out = dict(self.memory.models[model_id], running_sentences=self.memory.sentences, budget_bytes=self.memory.budget_bytes,
                   budget_source=self.memory.budget_source, planned_bytes_all_models=self.memory.planned_bytes,
                   engines=self.config.engines)
        device = self.models[model_id].device
        if device.type == "cuda":
            out["device_reserved_bytes"] = torch.cuda.memory_reserved(device)
        return out

    def _static_memory(self, model_id: str) -> dict | None:
        """The static decoders of a model: its device searches' and the translator's own (attention maps)."""
        parts = [m for m in (self.device_memory().get(model_id), self.models[model_id].static_memory()) if m]
        return {name: sum(p[name] for p in parts) for name in parts[0]} if parts else None

    def status(self) -> EngineStatus:
        waiting = sum(len(g.waiting) + len(g.background) for g in self.groups.values())
        running = sum(len(g.search) for g in self.groups.values())
        stats = dict(self.stats, waiting_sentences=waiting, running_sentences=running, calls_in_flight=len(self.calls),
                     pending_units=self.admission.pending, rate_units_per_second=self.admission.rate,
                     uptime_seconds=time.monotonic() - self.started, **self._recent_stats())
        if self._room is not None:
            stats.update(lone_search_threads=float(self._room.free_cores()), other_processes_cores=self._room.others)
        if torch.cuda.is_available() and any(t.device.type == "cuda" for t in self.models.values()):
            stats["device_memory_bytes"] = float(torch.cuda.memory_allocated())
        return EngineStatus(self.incarnation, True, self.model_info(), None, stats, self.model_stats, unloaded=self.unloaded)

    def _recent_stats(self) -> dict[str, float]:
        """Busy share, occupancy, padding and step time over the time since the last call (>= 1 s)."""
        now, r, s = time.monotonic(), self._recent, self.stats
        if now - r["at"] >= 1.0:
            steps = s["steps"] - r["steps"]
            computed = s["rows_computed"] - r["rows_computed"]
            live = s["rows_live"] - r["rows_live"]
            r["shown"] = dict(
                busy_share=(s["busy_seconds"] - r["busy"]) / (now - r["at"]),
                rows_per_step=live / steps if steps else 0.0,
                padding_share=1 - live / computed if computed else 0.0,
                step_ms=1000 * (s["step_seconds"] - r["step_seconds"]) / steps if steps else 0.0,
            )
            r.update(at=now, busy=s["busy_seconds"], steps=s["steps"], step_seconds=s["step_seconds"], rows_live=s["rows_live"],
                     rows_computed=s["rows_computed"])
        return r.get("shown", {})

    @property
    def busy(self) -> bool:
        """Work is running or waiting: the caller should not block waiting for messages."""
        return (bool(self._attention_calls) or self._attending is not None
                or any(len(g.search) or g.waiting or g.background for g in self.groups.values()))

    # ------------------------------------------------------------------ calls
    def screen(self, message: Any) -> list[Reply] | None:
        """A first look at a call, safe to run on another thread while the main one steps (the engine
        process runs it on its I/O thread, so that a refusal does not wait for the step in flight):
        returns the replies that settle the call at once (unknown model, deadline passed, queue full,
        refused by admission), or None when it goes on to handle(), its admitted work reserved."""
        if not isinstance(message, Translate):
            return None
        self.stats["calls"] += 1
        options = message.options
        if message.model not in self.models:
            return [Reply(message.id, error=INVALID, message=f"no model {message.model}")]
        timeout = message.deadline - time.monotonic()
        if timeout <= 0:
            return [Reply(message.id, error=EXPIRED, message="the deadline passed before the engine got the call")]
        translator = self.models[message.model]
        try:  # the model's own limit (eos added, positions): every check of a call is made here, once
            sources = [translator.inputs.source_ids(ids) if ids else None for ids in message.sources]
        except ValueError as exc:
            return [Reply(message.id, error=INVALID, message=str(exc))]
        if any(not 0 <= t < translator.config.tgt_vocab_size for t in message.target_prefix):
            return [Reply(message.id, error=INVALID, message="the target prefix is not in the model's vocabulary")]
        for term in dict.fromkeys(t for terms in message.terms or () for t in terms):
            # the model would write <unk> there, which nothing can put back: the term would not be as written
            if unknown := translator.tgt_tokenizer.unknown_spans(term):
                return [Reply(message.id, error=INVALID, message=f"the glossary's target term {term!r} has characters this model "
                                                                 f"cannot write: {' '.join(unknown)}", param="glossary")]
        keys = self.cache.keys(message, sources)
        kept = self.cache.get(keys)  # answered from memory: no work to admit
        # source tokens, eos excluded: the unit the rate was measured in
        counts = [len(ids) for ids, hit in zip(message.sources, kept) if ids and hit is None]
        cost = 0.0
        with self.admission.lock:  # the queue bound and the admitted work change together
            if self._queued_sentences + len(counts) > self.config.max_queue_sentences:
                self.stats["refused_calls"] += 1
                return [Reply(message.id, error=REFUSED, message="the queue is full", retry_after=self.config.retry_after_s)]
            if self.config.admission and counts:
                cost = self.admission.cost(counts, options.beam_size)
                retry_after = self.admission.admit(cost, timeout, background=message.priority != INTERACTIVE)
                if retry_after is not None:
                    self.stats["refused_units"] += cost
                    self.stats["refused_calls"] += 1
                    return [Reply(message.id, error=REFUSED, retry_after=retry_after, message=(
                        "the server is busy: the work queued ahead would not finish before this request's deadline, retry later"))]
                self.stats["admitted_units"] += cost
            self._queued_sentences += len(counts)
        self._reserved[message.id] = (cost, len(counts), sources, keys, kept)
        return None

    def _release(self, reservation: tuple[float, int, bool]) -> None:
        cost, sentences, background = reservation
        with self.admission.lock:
            self.admission.release(cost, background)
            self._queued_sentences -= sentences

    def handle(self, message: Any) -> list[Reply]:
        """Take a call on the main thread (screening it first unless screen() already let it through)."""
        if isinstance(message, Translate):
            started = time.perf_counter()
            try:
                if message.id not in self._reserved and (settled := self.screen(message)) is not None:
                    return settled
                cost, count, sources, keys, kept = self._reserved.pop(message.id)
                reservation = (cost, count, message.priority != INTERACTIVE)
                try:
                    return self._translate(message, reservation, sources, keys, kept)
                except Exception as exc:  # noqa: BLE001 - one call that cannot be taken in fails, not the engine (_call_failed)
                    return self._call_failed(message.id, exc, "taking in a call failed", reservation)
            finally:
                self.stats["call_seconds"] += time.perf_counter() - started
        if isinstance(message, Cancel):
            return self._drop(message.id, None)
        if isinstance(message, Attention):
            if (settled := self._screen_attention(message)) is not None:
                return [settled]
            self._attention_calls.append(message)
            return []
        raise TypeError(f"unknown message {type(message).__name__}")

    def _translate(self, call: Translate, reservation: tuple[float, int, bool], sources: list[list[int] | None],
                   keys: list, kept: list[list[EngineHypothesis] | None]) -> list[Reply]:
        """The screened call's sentences (their encoder ids, None for an empty text) join their groups' queues,
        but those the translation cache kept (kept: their n-best)."""
        translator = self.models[call.model]
        options = call.options
        todo = [i for i, s in enumerate(sources) if s is not None and kept[i] is None]
        results: list[list[EngineHypothesis] | None] = list(kept)
        hits = sum(k is not None for k in kept)
        if len(todo) + hits < len(sources):  # empty texts: the empty translation, no search
            empty = self._translation(translator, EMPTY, options, max_length=1 << 30)
            for i, s in enumerate(sources):
                if s is None:
                    results[i] = [empty] * options.num_hypotheses
        self.stats["cache_hits"] += hits
        if not todo:
            self._release(reservation)
            return [Reply(call.id, value=results)]
        state = _Call(call, results, len(todo), reservation, [len(s) - 1 if s else 0 for s in sources], sources=sources, keys=keys)
        self.calls[call.id] = state
        search_options = SearchOptions(beam_size=options.beam_size, num_hypotheses=options.num_hypotheses,
                                       max_length=options.max_length, length_penalty=options.length_penalty)
        state.lexical = translator.lexical_constraints(call.terms, call.avoid, len(sources), sources)
        limits = self._length_limits(translator, [sources[i] for i in todo], search_options)
        state.max_lengths = [0] * len(sources)
        for i, limit in zip(todo, limits):
            state.max_lengths[i] = limit
            if self._follow(state, i):
                continue
            # terms are placed only where the model does not write them itself: free first (its avoided terms only)
            self._join(state, i, terms=False)
        return []

    @staticmethod
    def _question(state: _Call, index: int) -> tuple[int, Hashable] | None:
        """What a text's answer depends on, as texts share it (_follow): its cache key, and its call's priority, so
        that an interactive text never waits on a job's queue; None without the cache."""
        key = state.keys[index] if state.keys else None
        return None if key is None else (state.message.priority, key)

    def _follow(self, state: _Call, index: int) -> bool:
        """With the translation cache on, whether a text waits for the answer of another call's search of the same
        question; if none runs, this text's search answers the later ones."""
        question = self._question(state, index)
        if question is None:
            return False
        answering = self._answering.get(question)
        if answering is not None and answering[0] in self.calls:
            self._sharing.setdefault(answering, []).append((state.message.id, index))
            return True
        self._answering[question] = (state.message.id, index)
        return False

    def _answer_followers(self, state: _Call, index: int) -> list[Reply]:
        """A text's search finished: the texts waiting on it take its n-best (and their calls' replies go out
        once those were their last)."""
        question = self._question(state, index)
        if question is None:
            return []
        if self._answering.get(question) == (state.message.id, index):
            del self._answering[question]
        replies = []
        for call_id, i in self._sharing.pop((state.message.id, index), ()):
            follower = self.calls.get(call_id)
            if follower is None or follower.results[i] is not None:
                continue
            follower.results[i] = state.results[index]
            follower.left -= 1
            self.stats["shared_sentences"] += 1
            if follower.left == 0:
                replies += self._drop(call_id, Reply(call_id, value=follower.results))
        return replies

    def _hand_over(self, state: _Call) -> None:
        """A call leaves before its texts were answered: of the texts waiting on each of them, the first whose call
        is still here is searched in its place, and the others wait on it."""
        for index in range(len(state.results)):
            question = self._question(state, index)
            if question is None:
                continue
            if self._answering.get(question) == (state.message.id, index):
                del self._answering[question]
            waiting = [(c, i) for c, i in self._sharing.pop((state.message.id, index), ()) if c in self.calls]
            if waiting:
                (call_id, i), rest = waiting[0], waiting[1:]
                self._answering[question] = (call_id, i)
                if rest:
                    self._sharing[(call_id, i)] = rest
                self._join(self.calls[call_id], i, terms=False)

    def _join(self, state: _Call, index: int, terms: bool) -> None:
        """A text joins the queue of its group: with its terms, or with its avoided terms only."""
        call, translator = state.message, self.models[state.message.model]
        lexical = state.lexical[index]
        if lexical and not terms:
            lexical = LexicalConstraints(avoid=lexical.avoid) if lexical.avoid else None
        sentence = Sentence((call.id, index), state.sources[index], state.max_lengths[index], call.options.length_penalty,
                            call.options.num_hypotheses, tuple(call.target_prefix), lexical,
                            self._attention_span(translator, call.options, state.sources[index]))
        # dynamic beam allocation needs beams, so a greedy call's constrained sentences run beam search
        beam = max(call.options.beam_size, CONSTRAINED_MIN_BEAM) if lexical else call.options.beam_size
        background = call.priority != INTERACTIVE
        key, group = self._group_for(call.model, beam, sentence, background=background)
        state.groups.add(key)
        entry = (call.id, index, sentence)
        if terms:  # it has waited its turn once already
            group.waiting.appendleft(entry)
        else:
            (group.background if background else group.waiting).append(entry)

    # ------------------------------------------------------------------ searches
    def _group_for(self, model_id: str, beam: int, sentence: Sentence, background: bool = False) -> tuple[tuple, _Group]:
        """The running group a sentence joins: the device search where the model has one and the
        sentence fits it, else the eager search; made on first use. A background sentence keeps to
        the first lanes (_background_lanes), so that interactive ones find lanes with no job in them."""
        translator = self.models[model_id]
        # a sentence with lexical constraints joins the device search too (its fits() says whether they fit
        # the device buffers): constrained and free sentences share its steps
        if translator.uses_static_decoder and self._decoder_fits(model_id, beam):
            device = self.groups.get((model_id, beam, "device", 0))
            search = device.search if device is not None else self._new_search(model_id, beam, "device")
            if search.fits(sentence):
                if device is None:
                    device = self.groups[(model_id, beam, "device", 0)] = _Group(search)
                return (model_id, beam, "device", 0), device  # one lane
        kind, lanes = "eager", self.config.lanes
        for lane in range(lanes):
            if (model_id, beam, kind, lane) not in self.groups:
                self.groups[(model_id, beam, kind, lane)] = _Group(self._new_search(model_id, beam, kind))
        # the lane with the least work, running and waiting
        key = min(((model_id, beam, kind, lane) for lane in range(self._background_lanes(lanes) if background else lanes)),
                  key=lambda k: len(self.groups[k].search) + len(self.groups[k].waiting) + len(self.groups[k].background))
        return key, self.groups[key]

    def _decoder_fits(self, model_id: str, beam: int) -> bool:
        """Whether a static decoder for this beam size exists, was planned, or fits what the budget has
        left now; a beam size that does not fit runs in the eager search, whose memory comes and goes
        with its sentences."""
        if (model_id, beam) in self._device_searches or self.memory is None:
            return True
        planned = self.memory.models[model_id]["beams"]
        if str(beam) in planned:
            return True
        translator = self.models[model_id]
        if translator.device.type != "cuda":
            return True
        any_beam = next(iter(planned.values()))
        needed = any_beam["bytes"] // max(any_beam["rows"], 1) * self.config.max_batch_sentences * beam
        return torch.cuda.memory_reserved(translator.device) + needed <= self.memory.budget_bytes

    def _new_search(self, model_id: str, beam: int, kind: str) -> ContinuousSearch | ContinuousDeviceSearch:
        translator = self.models[model_id]
        if kind == "eager":
            return ContinuousSearch(translator.runner, beam_size=beam)
        return ContinuousDeviceSearch(self._device_search(model_id, beam), beam_size=beam, join_tokens=self._join_tokens)

    @property
    def _join_tokens(self) -> int:
        """Source positions one captured join encodes at most, padding included: max_batch_tokens, what
        the memory plan reserves for a join (a join's sentences padded to length buckets take more
        programs rather than more memory)."""
        return self.config.max_batch_tokens

    def _device_search(self, model_id: str, beam: int) -> DeviceSearch:
        """The static decoder of one model and beam size, sized for max_batch_sentences sentences (a
        decoder's buffers belong to one running search: beam sizes run side by side, so each has its own)."""
        key = (model_id, beam)
        if key not in self._device_searches:
            t = self.models[model_id]
            rows = self.config.max_batch_sentences * beam
            # one beam size a decoder: a sentence's K rows share its source's keys and values (group)
            self._device_searches[key] = DeviceSearch(StaticDecoder(t.runner, max_rows=rows, max_length=t.static_length, group=beam),
                                                      forced_first_token=bool(t.inputs.codes))
        return self._device_searches[key]

    def warmup(self) -> int:
        """Capture the device searches' programs (steps and joins) of every bucket for the common beam
        sizes, before any call, so that no request pays for a capture; the steps that keep the rows'
        attention too (the service asks for it with the `detached` check on, its default). Returns the
        number of programs."""
        count = 0
        for model_id, translator in self.models.items():
            if translator.uses_static_decoder:
                for beam in WARMUP_BEAMS:
                    count += self._device_search(model_id, beam).warmup(beam_sizes=(beam,), join_tokens=self._join_tokens,
                                                                        attention=True)
        return count

    def over_budget(self) -> str | None:
        """After warm-up: why what the GPU holds is past the memory budget (one line), or None. The plan
        is an estimate; the CUDA allocator's reservation is what counts."""
        if self.memory is None:
            return None
        for device in {t.device for t in self.models.values() if t.device.type == "cuda"}:
            held = torch.cuda.memory_reserved(device)
            if held > self.memory.budget_bytes:
                return (f"after warm-up the engine holds {held / 2**30:.2f} GiB on {device}, past the memory budget of "
                        f"{self.memory.budget_bytes / 2**30:.2f} GiB ({self.memory.budget_source}; the plan expected "
                        f"{self.memory.planned_bytes / 2**30:.2f} GiB): raise --memory-budget-gb (NMT_MEMORY_BUDGET_GB) or lower --max-batch-sentences")
        return None

    def device_memory(self) -> dict[str, dict]:
        """Per model, what its device searches' static decoders hold (buffers and graph pools), summed."""
        out: dict[str, dict] = {}
        for (model_id, _), search in self._device_searches.items():
            total = out.setdefault(model_id, dict(buffers_bytes=0, graphs=0, graph_pool_bytes=0))
            for name, value in search.decoder.memory().items():
                total[name] += value
        return out

    @staticmethod
    def _length_limits(translator: Translator, sources: list[list[int]], options: SearchOptions) -> list[int]:
        """Tokens each source may generate (search.max_length_of, the one formula)."""
        cap = translator.config.max_positions - 1
        return [max_length_of(len(ids), options, cap) for ids in sources]

    def _screen_attention(self, call: Attention) -> Reply | None:
        """The reply that settles an attention call at once (unknown model, deadline passed), or None."""
        if call.model not in self.models:
            return Reply(call.id, error=INVALID, message=f"no model {call.model}")
        if call.deadline < time.monotonic():
            return Reply(call.id, error=EXPIRED, message="the deadline passed before the engine got the call")
        return None

    def _attend(self, calls: list[Attention]) -> list[Reply]:
        """The round's attention calls: those that give their translation (and ask alike) in one forced
        decoding per model, a few at a time; a failed pass is retried one call at a time, so that only
        the call that breaks it fails."""
        started = time.perf_counter()
        replies, forced = [], {}
        for call in calls:
            if (settled := self._screen_attention(call)) is not None:  # its deadline passed while it waited
                replies.append(settled)
            elif call.target_text is None:
                replies.append(self._attention(call, attention_maps))
            else:
                forced.setdefault((call.model, tuple(call.include), call.score), []).append(call)
        for (model_id, _, _), group in forced.items():
            group.sort(key=lambda c: len(c.source))  # similar lengths pad less
            for i in range(0, len(group), ATTENTION_BATCH):
                chunk = group[i:i + ATTENTION_BATCH]
                try:
                    maps = forced_attention_maps(self.models[model_id], chunk)
                    replies += [Reply(call.id, value=value) for call, value in zip(chunk, maps)]
                except Exception:  # noqa: BLE001 - found again below, call by call
                    replies += [self._attention(call, lambda t, c: forced_attention_maps(t, [c])[0]) for call in chunk]
        self.stats["attention_calls"] += len(calls)
        self.stats["attention_seconds"] += time.perf_counter() - started
        return replies

    def _attention(self, call: Attention, maps_of) -> Reply:
        """One call's reply: maps_of(translator, call), or its error."""
        try:
            return Reply(call.id, value=maps_of(self.models[call.model], call))
        except ValueError as exc:
            return Reply(call.id, error=INVALID, message=str(exc))
        except Exception as exc:  # noqa: BLE001 - one failing call must not stop the engine
            log.exception("attention failed")
            return Reply(call.id, error=OUT_OF_MEMORY if is_out_of_memory(exc) else FAILED, message=str(exc))

    def _drop(self, call_id: int, reply: Reply | None) -> list[Reply]:
        """The call leaves: its waiting sentences go, its running ones are cancelled, its work is freed."""
        state = self.calls.pop(call_id, None)
        if state is None:
            return []
        if state.message.priority == INTERACTIVE:
            self._interactive_at = time.monotonic()
        self._release(state.reservation)
        if state.left:
            self._hand_over(state)
        for key in state.groups if state.left else ():
            group = self.groups.get(key)
            if group is not None:
                group.waiting = deque(w for w in group.waiting if w[0] != call_id)
                group.background = deque(w for w in group.background if w[0] != call_id)
                group.search.cancel({(call_id, i) for i in range(len(state.results))})
        return [reply] if reply is not None else []

    def _fail(self, call_id: int, kind: str, message: str) -> list[Reply]:
        self.stats["failed_calls"] += 1
        return self._drop(call_id, Reply(call_id, error=kind, message=message))

    def _call_failed(self, call_id, exc: Exception, what: str, reservation: tuple[float, int, bool] | None = None) -> list[Reply]:
        """An error in one call's own work (taking it in, completing one of its texts) fails that call,
        and the engine serves the others; a device fault is every call's and goes on up (is_device_fault).
        reservation: the call's admitted work, freed here if the call failed before it was taken in."""
        if is_device_fault(exc):
            raise exc
        log.error("%s", what, exc_info=exc)
        kind, message = OUT_OF_MEMORY if is_out_of_memory(exc) else FAILED, f"{type(exc).__name__}: {exc}"
        if call_id in self.calls:
            return self._fail(call_id, kind, message)
        if reservation is not None:
            self._release(reservation)
        self.stats["failed_calls"] += 1
        return [Reply(call_id, error=kind, message=message)]

    # ------------------------------------------------------------------ steps
    def work(self) -> list[Reply]:
        """Expire calls past their deadline, then for every batch: let waiting sentences join and run
        one step (with several lanes, the batches' joins and steps side by side), and answer the
        attention calls that came in (beside the lanes' steps)."""
        replies = self._expire()
        plans = []
        for key, group in list(self.groups.items()):
            joining = self._joining(group)
            if joining or len(group.search):
                plans.append((key, group, joining))
        replies += self._attention_round()
        wide = self._lone_threads(plans)
        started = time.perf_counter()
        outcomes, overlapped = self._in_lanes(lambda plan: self._advance(plan[1].search, plan[2]), plans)
        if wide > 1:
            self.stats["wide_steps"] += sum(o.stepped for o in outcomes)
        # engine time: the lanes overlapped, so each has its share of their wall time
        share = (max(o.ended for o in outcomes) - started) / len(plans) if overlapped else None
        for (key, group, joining), outcome in zip(plans, outcomes):
            seconds = outcome.seconds if share is None else share
            # the lanes' wall time is shared out evenly; each lane's join keeps its own part of its share
            join_seconds = seconds * outcome.join_seconds / outcome.seconds if outcome.seconds > 0 else 0.0
            self.stats["join_seconds"] += join_seconds
            if outcome.join_error is not None:
                replies += self._join_one_by_one(group, joining, outcome.join_error)
            elif joining:
                self.stats["joins"] += 1
                self.stats["sentences_joined"] += len(joining)
            if outcome.stepped:
                replies += self._after_step(key, group, outcome, seconds, step_seconds=seconds - join_seconds)
            else:
                self._count(seconds, 0, 0, 0)
        if not plans and self._attending is not None:  # nothing else runs: rather than spin, wait a little for it
            wait_for([self._attending[0]], timeout=ATTENTION_WAIT_S)
            replies += self._attention_round()
        return replies

    def _attention_round(self) -> list[Reply]:
        """The replies of the attention work that finished; the calls that wait start (on the attention
        thread where there is one, else here, now)."""
        replies = []
        if self._attending is not None and self._attending[0].done():
            (attending, calls), self._attending = self._attending, None
            try:
                replies += attending.result()
            except Exception as exc:  # noqa: BLE001 - _attend answers every call; should it not, they fail, not the engine
                log.exception("attention failed")
                replies += [Reply(call.id, error=FAILED, message=str(exc)) for call in calls]
        if self._attention_calls and self._attending is None:
            calls, self._attention_calls = self._attention_calls, []
            if self._attention_pool is None:
                replies += self._attend(calls)
            else:
                self._attending = (self._attention_pool.submit(self._attend, calls), calls)
        return replies

    def _lone_threads(self, plans: list) -> int:
        """The torch threads of this thread's steps this round, set: where the engine measures its room (CpuRoom),
        a search stepped here (one alone, or each in turn without lanes) takes the cores the other processes
        leave idle, unless attention work runs beside it; the lanes' own threads keep one each."""
        if self._room is None:
            return torch.get_num_threads()
        self._room.refresh()
        if not plans or (self._pool is not None and len(plans) > 1):  # nothing steps here
            return 1
        # a forced decoding on the attention thread computes beside it: then one, as a lane
        threads = 1 if self._attending is not None else self._room.free_cores()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads

    def _in_lanes(self, fn, items: list) -> tuple[list, bool]:
        """fn over items, side by side on the lanes' threads where there are lanes and more than one
        item, else one after the other here; and whether they ran side by side."""
        if self._pool is not None and len(items) > 1:
            return list(self._pool.map(fn, items)), True
        return [fn(item) for item in items], False

    @staticmethod
    def _advance(search, joining: list[Sentence]) -> "_StepOutcome":
        """On a lane's thread (or this one): the joining sentences join (their encoder runs), then one
        step; what finished, or the error. A failed join leaves the step to the next round."""
        started = time.perf_counter()
        if joining:
            try:
                search.add(joining)
            except Exception as exc:  # noqa: BLE001 - handled on the engine's thread (_join_one_by_one)
                ended = time.perf_counter()
                return _StepOutcome([], None, ended - started, 0, 0, stepped=False, join_error=exc, join_seconds=ended - started,
                                    ended=ended)
        ended = time.perf_counter()
        joined = ended - started
        if not len(search):
            return _StepOutcome([], None, joined, 0, 0, stepped=False, join_seconds=joined, ended=ended)
        outcome = EngineCore._run_step(search)
        outcome.ended = time.perf_counter()
        outcome.seconds = outcome.ended - started
        outcome.join_seconds = joined
        return outcome

    @staticmethod
    def _run_step(search) -> "_StepOutcome":
        """One step of one search: what finished, or its error."""
        rows, live = search.rows, search.running * search.K
        started = time.perf_counter()
        try:
            done, error = search.step(), None
        except Exception as exc:  # noqa: BLE001 - handled by _after_step, on the engine's thread
            done, error = [], exc
        return _StepOutcome(done, error, time.perf_counter() - started, rows, live)

    def _expire(self) -> list[Reply]:
        now = time.monotonic()
        if now - self._last_expiry_check < EXPIRY_CHECK_S:
            return []
        self._last_expiry_check = now
        replies = []
        for call_id in [c for c, s in self.calls.items() if s.message.deadline < now]:
            self.stats["expired_calls"] += 1
            replies += self._drop(call_id, Reply(call_id, error=EXPIRED, message="the deadline passed"))
        return replies

    def _joining(self, group: _Group) -> list[Sentence]:
        """The waiting sentences that join the group's batch at this step (taken off its queues): as many
        as it has room for, up to max_batch_tokens source tokens, one call at a time without batching;
        interactive ones first, then background ones while no interactive sentence waits anywhere, up to
        their share of the rows."""
        search, cfg = group.search, self.config
        if not group.waiting and not group.background:
            return []
        if not cfg.batching and len(search):  # one call at a time
            return []
        if not search.joinable():
            return []
        # max_batch_sentences is per model and beam size: the lanes share it (and the memory plan with it)
        lanes = cfg.lanes if isinstance(group.search, ContinuousSearch) else 1
        most = -(-cfg.max_batch_sentences // lanes)
        room = group.room(most)
        joining: list[Sentence] = []
        self._take(group.waiting, room, joining)
        if group.background and len(joining) < room and not any(g.waiting for g in self.groups.values()):
            running = sum(1 for key in search.keys() if self._is_background(key[0]))
            # background_share of the model and beam size's sentences, spread over the lanes background work may use
            share = -(-max(1, int(cfg.background_share * cfg.max_batch_sentences)) // self._background_lanes(lanes))
            if self._cpu and self._interactive_about():
                share = 1  # the lanes' steps last as long as the longest: a job's rows would slow every interactive step
            self._take(group.background, min(room, len(joining) + share - running), joining)
        return joining

    def _interactive_about(self) -> bool:
        """An interactive call is in the engine, or one left within INTERACTIVE_GRACE_S (the next of a
        client's requests is on its way)."""
        return (time.monotonic() - self._interactive_at < INTERACTIVE_GRACE_S
                or any(c.message.priority == INTERACTIVE for c in self.calls.values()))

    def _background_lanes(self, lanes: int) -> int:
        """Of `lanes` lanes, how many the first of which background sentences may use: their share, at least one."""
        return max(1, int(self.config.background_share * lanes))

    def _is_background(self, call_id) -> bool:
        state = self.calls.get(call_id)
        return state is not None and state.message.priority != INTERACTIVE

    def _take(self, queue: deque, limit: int, joining: list[Sentence]) -> None:
        """Move sentences from the front of `queue` into `joining` while it holds fewer than `limit`,
        up to max_batch_tokens source tokens, one call at a time without batching."""
        cfg = self.config
        tokens = sum(len(s.src) for s in joining)
        first_call = joining[0].key[0] if joining else (queue[0][0] if queue else None)
        while queue and len(joining) < limit:
            call_id, _, sentence = queue[0]
            if joining and tokens + len(sentence.src) > cfg.max_batch_tokens:
                break
            if not cfg.batching and call_id != first_call:
                break
            queue.popleft()
            joining.append(sentence)
            tokens += len(sentence.src)

    def _join_one_by_one(self, group: _Group, joining: list[Sentence], exc: Exception) -> list[Reply]:
        """A join failed: find the sentence that breaks it, fail its call, let the others join."""
        if len(joining) == 1 or is_out_of_memory(exc):
            log.exception("a sentence failed to join", exc_info=exc)
            kind = OUT_OF_MEMORY if is_out_of_memory(exc) else FAILED
            replies = []
            for call_id in dict.fromkeys(s.key[0] for s in joining):
                replies += self._fail(call_id, kind, str(exc))
            return replies
        replies = []
        for sentence in joining:
            if sentence.key[0] not in self.calls:  # its call already failed
                continue
            try:
                group.search.add([sentence])
            except Exception as one:  # noqa: BLE001
                replies += self._join_one_by_one(group, [sentence], one)
        return replies

    def _after_step(self, key: tuple[str, int, str, int], group: _Group, outcome: "_StepOutcome", seconds: float,
                    step_seconds: float) -> list[Reply]:
        """Account for one search's join and step (`seconds` of engine time, `step_seconds` of them the
        step's) and complete what finished; a failed step loses its batch (its calls fail), and the
        engine goes on."""
        search, done, error, rows, live = group.search, outcome.done, outcome.error, outcome.rows, outcome.live
        if error is not None:
            log.error("a step failed", exc_info=error)
            kind = OUT_OF_MEMORY if is_out_of_memory(error) else FAILED
            replies = []
            for call_id in dict.fromkeys(k[0] for k in search.keys()):
                replies += self._fail(call_id, kind, str(error))
            self.groups[key] = _Group(self._new_search(*key[:3]), group.waiting, group.background)
            return replies
        finished = time.perf_counter()
        s = self.stats
        s["steps"] += 1
        s["step_seconds"] += step_seconds
        s["rows_computed"] += rows
        s["rows_live"] += live
        replies = []
        units = source = output = 0
        for (call_id, index), hyps in done:
            state = self.calls.get(call_id)
            if state is None:
                continue
            try:
                completed, counts = self._complete(key, state, call_id, index, hyps)
            except Exception as exc:  # noqa: BLE001 - one text whose result cannot be completed fails its call, not the engine
                replies += self._call_failed(call_id, exc, "completing a translation failed")
                continue
            replies += completed
            units, source, output = units + counts[0], source + counts[1], output + counts[2]
        self._count(seconds, units, source, output)
        s["result_seconds"] += time.perf_counter() - finished
        return replies

    def _complete(self, key: tuple, state: _Call, call_id, index: int,
                  hyps: list[SearchHypothesis]) -> tuple[list[Reply], tuple[float, int, int]]:
        """One text's search finished: its n-best goes into its call's results (and the call's reply out
        once it was the last), or the text joins again without its terms; the replies, and the work it
        completed (decode units, source and output tokens) for the rate."""
        # a score that is not a number (weights of NaN) is no translation: the eager search drops
        # such hypotheses itself, the device search's greedy step keeps them
        hyps = [h for h in hyps if not math.isnan(h.score)]
        if not hyps:
            log.error("%s produced no translation (its scores are not numbers)", state.message.model)
            return self._fail(call_id, FAILED, f"the model produced no translation of text {index} (its scores are not numbers)"), (0, 0, 0)
        lexical = state.lexical[index] if state.lexical else None
        if lexical and lexical.include:
            if index not in state.free:  # its free translation: done if it has the terms, else kept
                if lexical.holds(hyps[0].tokens):
                    state.free[index] = None
                else:
                    state.free[index] = hyps
                    self._join(state, index, terms=True)
                    return [], (0, 0, 0)
            elif hyps[0].unmet:  # no hypothesis holds every term: the free translation instead, flagged
                state.unmet.add(index)
                hyps = state.free[index]
        translator = self.models[state.message.model]
        options = state.message.options
        forced = len(state.message.target_prefix)
        state.results[index] = [self._translation(translator, h, options, state.max_lengths[index], forced,
                                                  unmet=index in state.unmet, source=state.sources[index]) for h in hyps]
        free = state.free.get(index) if lexical and index not in state.unmet else None
        if free:  # the terms were placed: what they cost against the model's own translation
            for result, h in zip(state.results[index], hyps):
                result.free_mean_logprob = free[0].score / (len(free[0].tokens) - forced + 1)
                result.constraint_cost = (free[0].score - h.score) / len(lexical.include)
        self.cache.put(state.keys[index], state.results[index])
        shared = self._answer_followers(state, index)
        state.left -= 1
        n_src = state.source_tokens[index]
        n_out = len(hyps[0].tokens) + 1
        self.stats["sentences_done"] += 1
        per_model = self.model_stats[state.message.model]
        per_model["source_tokens"] += n_src
        per_model["generated_tokens"] += n_out - 1
        per_model["sentences"] += 1
        replies = self._drop(call_id, Reply(call_id, value=state.results)) if state.left == 0 else []
        return shared + replies, (Admission.units(1, n_src, n_out, options.beam_size), n_src, n_out)

    @staticmethod
    def _attention_span(translator: Translator, options: DecodeOptions, source: list[int]) -> tuple[int, int] | None:
        """The source positions a sentence's search keeps the cross-attention's entropy over (and where it
        looks most), where the call asks for either."""
        return own_pieces(translator, len(source)) if options.return_source_entropy or options.return_alignment else None

    @staticmethod
    def _translation(translator: Translator, h: SearchHypothesis, options: DecodeOptions, max_length: int,
                     forced: int = 0, unmet: bool = False, source: list[int] | None = None) -> EngineHypothesis:
        """forced: the call's target prefix at the start of h's tokens, which is not the translation's;
        source: the encoder's ids, for what the search kept of its attention."""
        scores = options.return_scores
        entropy = alignment = source_pieces = target_pieces = None
        if h.entropies is not None and source is not None:
            if options.return_source_entropy:
                entropy = searched_entropy(h.entropies, own_pieces(translator, len(source)))
            if options.return_alignment:  # as attention_maps() has them: the target's pieces with eos
                alignment = h.looks
                source_pieces = translator.src_tokenizer.pieces(source)
                target_pieces = translator.tgt_tokenizer.pieces(h.tokens + [translator.config.eos_id])
        # the search forces eos at max_length, so a hypothesis that used every position was cut there
        return EngineHypothesis(translator.tgt_tokenizer.decode(h.tokens[forced:]), h.score if scores else None,
                                h.normalized_score if scores else None, len(h.tokens) - forced, len(h.tokens) + 1 >= max_length,
                                unmet, entropy, alignment, source_pieces, target_pieces)

    def _count(self, seconds: float, units: float, source: int, output: int) -> None:
        """Engine time and finished work, folded into the admission rate every RATE_WINDOW_S."""
        self.stats["busy_seconds"] += seconds
        w = self._window
        w[0] += seconds
        w[1] += units
        w[2] += source
        w[3] += output
        if w[0] >= RATE_WINDOW_S and w[1] > 0:
            self.admission.learn(w[1], w[0], w[2], w[3])
            self._window = [0.0, 0.0, 0, 0]

    # ------------------------------------------------------------------ start-up
    def first_runs(self) -> None:
        """Every model translates once before the engine serves, so weights that load but do not compute
        (NaN scores) are refused at start-up rather than by the first request, and admission gets its
        starting rate: the settings' admission_rate where they give one (a restart then skips the
        calibration's second or two), else calibrate()'s measurement, whose rounds check the first model."""
        checked = None
        if self.config.admission and self.config.admission_rate > 0:
            self.admission.rate = self.config.admission_rate
            log.info("admission: engine rate %.0f decode units/s (admission_rate; no calibration)", self.config.admission_rate)
        elif self.config.admission and self.models:
            self.calibrate()
            checked = next(iter(self.models))
        for model_id in self.models:
            if model_id != checked:
                self._check_scores(model_id)

    def calibrate(self, rounds: int = CALIBRATION_ROUNDS, within_s: float = CALIBRATION_SECONDS) -> None:
        """Measure the rate before the first call, so that admission starts from a measured figure rather
        than a guess (it then follows the real work): a batch in every lane at once, as the engine runs
        them, repeated up to `rounds` times while the rounds take less than `within_s`, keeping the best
        round. A round that other processes slowed down (a busy start-up) says little of the engine;
        the best one is the engine's own rate, and the work it then does corrects it either way. A round
        still going at `within_s` (a large model on a CPU) is cut short after its current step, its
        sentences leave the searches, and its rate is that of the whole round had it gone on to the output
        expected (the output/source ratio learned or assumed) at the pace of its steps after the first (which
        also encoded the sources): counting only what was made would weigh the sources' tokens, all
        encoded, against a few steps' output, and scaling the first step's time would repeat the encoder; one
        sentence of two tokens then checks that the model's scores are numbers where none of the round's
        finished."""
        if not self.models or rounds < 1:
            return
        model_id, translator = next(iter(self.models.items()))
        beam = 4
        src, kind = self._calibration_source(model_id)
        n = min(16, self.config.max_batch_sentences)
        lanes = self.config.lanes if kind == "eager" else 1
        [limit] = self._length_limits(translator, [src], SearchOptions(beam_size=beam))
        best, spent, checked = 0.0, 0.0, False
        for round_ in range(rounds):
            searches = [self._new_search(model_id, beam, kind) for _ in range(lanes)]
            started = time.perf_counter()
            for search in searches:
                search.add([Sentence(i, src, limit) for i in range(n)])
            done, made, cut = [], 0, False  # made: tokens so far, one a step for each sentence still searching
            first = None  # (seconds, made) after the first step, which encoded the sources too
            while any(len(search) for search in searches):
                if first is not None and made > first[1] and spent + time.perf_counter() - started > within_s:
                    cut = True
                    for search in searches:
                        search.cancel(set(search.keys()))
                    break
                outcomes, _ = self._in_lanes(self._run_step, [search for search in searches if len(search)])
                for outcome in outcomes:
                    if outcome.error is not None:
                        raise outcome.error
                    done += outcome.done
                    made += outcome.live // beam
                first = first or (time.perf_counter() - started, made)
            seconds = time.perf_counter() - started
            spent += seconds
            NoTranslation.check(done)
            checked = checked or bool(done)
            source = n * lanes * (len(src) - 1)
            if cut:  # as if the round had gone on to the output expected, at the pace of the steps after the first
                output = self.admission.output_ratio * source
                seconds = first[0] + (seconds - first[0]) * max(output - first[1], 0) / (made - first[1])
            else:
                output = sum(len(h[0].tokens) + 1 for _, h in done)
            rate = Admission.units(n * lanes, source, output, beam) / seconds
            if rate > best:
                best = rate
                if not cut:
                    self.admission.output_ratio = output / source
            if spent > within_s:
                break
        if not checked:
            self._check_scores(model_id)
        self.admission.rate = best
        log.info("admission: engine rate %.0f decode units/s (best of %d calibration round(s) in %.1fs: %d lane(s) of %d sentences%s)",
                 best, round_ + 1, spent, lanes, n, "; the last cut short" if cut else "")

    def _calibration_source(self, model_id: str) -> tuple[list[int], str]:
        """(CALIBRATION_TEXT's encoder ids in the model's first direction, the kind of search it runs in)."""
        translator = self.models[model_id]
        source, target = translator.directions[0].split("-", 1)
        return translator.encode_source(CALIBRATION_TEXT, target, source), "device" if translator.uses_static_decoder else "eager"

    def _check_scores(self, model_id: str) -> None:
        """One sentence of two tokens, greedy: NoTranslation where its score is not a number."""
        src, kind = self._calibration_source(model_id)
        search = self._new_search(model_id, 1, kind)
        search.add([Sentence("scores", src, 2)])
        done = []
        while len(search):
            outcome = self._run_step(search)
            if outcome.error is not None:
                raise outcome.error
            done += outcome.done
        NoTranslation.check(done)
