"""Cross-request batching.

Requests put jobs (a list of texts for one model with one set of decoding options) on a queue. One
asyncio task gathers jobs for up to `max_wait_ms` (or until a batch is full, in sentences or tokens),
groups them by model and decoding options, and runs each group as model batches on the device's
worker thread, so torch never runs on the event loop and never runs twice at once on one device.
Every job gets exactly its own results; if a batch fails, its jobs are retried one by one so that a
failing input fails only its own request.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from model.inference.search import DeadlineExceeded
from model.translator import TranslationResult

from .admission import Admission
from .errors import overloaded
from .metrics import Metrics
from .models import LoadedModel
from .settings import Settings

log = logging.getLogger("service.batcher")
CALIBRATION_TEXT = "Ein Mann mit einer roten Jacke fährt mit dem Fahrrad durch die Straßen der Stadt."


@dataclass(frozen=True)
class DecodeOptions:
    """Options that must be equal for sentences to share a model batch."""

    beam_size: int = 4
    num_hypotheses: int = 1
    max_length: int | None = None
    length_penalty: float = 1.0
    return_scores: bool = False


@dataclass
class Job:
    model_id: str
    texts: list[str]
    token_counts: list[int]
    options: DecodeOptions
    future: asyncio.Future
    deadline: float  # time.monotonic() after which nobody waits for the result
    enqueued_at: float = field(default_factory=time.perf_counter)

    @property
    def tokens(self) -> int:
        return sum(self.token_counts)


class Batcher:
    def __init__(self, models: dict[str, LoadedModel], settings: Settings, metrics: Metrics, executor: ThreadPoolExecutor | None = None):
        """executor: the one-thread executor that all torch work runs on (the models were loaded on it);
        the batcher owns it from here on and shuts it down in stop()."""
        self.models = models
        self.settings = settings
        self.metrics = metrics
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.queued_sentences = 0
        self.batches_run = 0  # model batches (translate calls) so far; tests read it
        # one worker thread: torch work is serialized and off the event loop
        self.executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-worker")
        self._task: asyncio.Task | None = None
        self.admission = Admission(rate=1.0, margin=settings.admission_margin)

    async def start(self) -> None:
        if self.settings.admission:
            await self.calibrate()
        self._task = asyncio.create_task(self._loop(), name="batcher")

    async def calibrate(self) -> None:
        """Measure the engine's rate on one batch before the first request, so admission starts from a
        measured figure rather than a guess (the moving average then follows real batches)."""
        model = next(iter(self.models.values()))
        s = self.settings
        texts = [CALIBRATION_TEXT] * min(16, s.max_batch_sentences)
        beam = min(4, s.max_beam_size)
        counts = [model.translator.count_tokens(t) for t in texts]
        started = time.perf_counter()
        results = await self.run_on_device(model.translator.translate, texts, beam_size=beam)
        seconds = time.perf_counter() - started
        output = sum(len(r.hypotheses[0].tokens) + 1 for r in results)
        self.admission.rate = self.admission.units(len(texts), sum(counts), output, beam) / seconds
        self.metrics.engine_rate.set(self.admission.rate)
        log.info("admission: engine rate %.0f decode units/s (calibration batch of %d)", self.admission.rate, len(texts))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        while not self.queue.empty():
            job = self.queue.get_nowait()
            if not job.future.done():
                job.future.set_exception(overloaded(self.settings.retry_after_s))
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def run_on_device(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Run torch work on the device's worker thread (used for the unbatched endpoints too)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    async def translate(self, model_id: str, texts: list[str], token_counts: list[int], options: DecodeOptions, timeout: float) -> list[TranslationResult]:
        """Queue texts; resolve with their results in order. Raises the 503 error when the queue is full.
        Cancelling the caller cancels the job: if it has not started yet, it leaves its batch."""
        if self.queued_sentences + len(texts) > self.settings.max_queue_sentences:
            raise overloaded(self.settings.retry_after_s)
        cost = 0.0
        if self.settings.admission:
            cost = self.admission.cost(token_counts, options.beam_size)
            retry_after = self.admission.admit(cost, timeout)
            if retry_after is not None:
                self.metrics.refused_units.inc(cost)
                raise overloaded(int(retry_after), "the server is busy: the work queued ahead would not finish before "
                                                   "this request's deadline, retry later")
            self.metrics.admitted_units.inc(cost)
            self.metrics.pending_units.set(self.admission.pending)
        future = asyncio.get_running_loop().create_future()
        job = Job(model_id, texts, token_counts, options, future, time.monotonic() + timeout)
        self.queued_sentences += len(texts)
        self.metrics.queue_depth.set(self.queued_sentences)
        self.queue.put_nowait(job)
        try:
            return await job.future
        finally:  # done, failed, timed out or disconnected: its work no longer counts as ahead of others
            self.admission.release(cost)
            self.metrics.pending_units.set(self.admission.pending)

    # ------------------------------------------------------------------ the loop
    async def _next_jobs(self) -> list[Job]:
        """Wait for one job, then gather more for up to max_wait_ms, within the batch limits."""
        s = self.settings
        jobs = [await self.queue.get()]
        if not s.batching:
            return jobs
        sentences, tokens = len(jobs[0].texts), jobs[0].tokens
        deadline = time.perf_counter() + s.max_wait_ms / 1000
        while sentences < s.max_batch_sentences and tokens < s.max_batch_tokens:
            if self.queue.empty():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                # not asyncio.wait_for(queue.get()): on Python < 3.12 a get that completes as the timeout
                # fires can lose its item. Cancel the getter, then take what it may still have returned.
                getter = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait({getter}, timeout=remaining)
                if not done:
                    getter.cancel()
                    try:
                        job = await getter
                    except asyncio.CancelledError:
                        break
                else:
                    job = getter.result()
            else:
                job = self.queue.get_nowait()
            jobs.append(job)
            sentences += len(job.texts)
            tokens += job.tokens
        return jobs

    async def _loop(self) -> None:
        while True:
            jobs = await self._next_jobs()
            now = time.perf_counter()
            for job in jobs:
                self.queued_sentences -= len(job.texts)
                self.metrics.queue_wait.observe(now - job.enqueued_at)
            self.metrics.queue_depth.set(self.queued_sentences)
            live = [j for j in jobs if not j.future.done()]  # requests past their deadline are gone
            groups: dict[tuple[str, DecodeOptions], list[Job]] = {}
            for job in live:
                groups.setdefault((job.model_id, job.options), []).append(job)
            for (model_id, options), group in groups.items():
                try:
                    await self._run_group(model_id, options, group)
                except Exception as exc:  # never let one bad batch stop the loop
                    log.exception("batch failed")
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(exc)

    async def _run_group(self, model_id: str, options: DecodeOptions, jobs: list[Job]) -> None:
        deadline = max(j.deadline for j in jobs)  # the batch runs as long as someone still waits
        try:
            results = await self._translate_batch(
                model_id, options, [t for j in jobs for t in j.texts], [n for j in jobs for n in j.token_counts], deadline
            )
        except DeadlineExceeded:
            raise
        except Exception:
            if len(jobs) == 1:
                raise
            for job in jobs:  # isolate the failing input: each request alone
                if job.future.done():
                    continue
                try:
                    job_results = await self._translate_batch(model_id, options, job.texts, job.token_counts, job.deadline)
                except Exception as exc:
                    if not job.future.done():
                        job.future.set_exception(exc)
                else:
                    if not job.future.done():
                        job.future.set_result(job_results)
            return
        start = 0
        for job in jobs:
            if not job.future.done():
                job.future.set_result(results[start : start + len(job.texts)])
            start += len(job.texts)

    async def _translate_batch(
        self, model_id: str, options: DecodeOptions, texts: list[str], token_counts: list[int], deadline: float
    ) -> list[TranslationResult]:
        model = self.models[model_id]
        s = self.settings
        started = time.perf_counter()
        results = await self.run_on_device(
            model.translator.translate, texts,
            beam_size=options.beam_size, num_hypotheses=options.num_hypotheses, max_length=options.max_length,
            length_penalty=options.length_penalty, return_scores=options.return_scores,
            max_batch_tokens=s.max_batch_tokens, max_batch_size=s.max_batch_sentences, deadline=deadline,
        )
        output_tokens = sum(len(r.hypotheses[0].tokens) + 1 for r in results)
        self.admission.observe(len(texts), sum(token_counts), output_tokens, options.beam_size, time.perf_counter() - started)
        self.batches_run += 1
        m = self.metrics
        m.engine_rate.set(self.admission.rate)
        m.batches.labels(model=model_id).inc()
        m.batch_sentences.observe(len(texts))
        m.batch_tokens.observe(sum(token_counts))
        m.source_tokens.labels(model=model_id).inc(sum(token_counts))
        m.generated_tokens.labels(model=model_id).inc(sum(len(r.hypotheses[0].tokens) for r in results))
        return results
