"""Runs jobs: in every API process, one task that takes the oldest job nobody runs (jobs_store.py: an
flock, so with several workers each job runs in exactly one of them, and a job whose process died is
taken up by the next that looks) and sends it to the engine chunk by chunk, at background priority.

A chunk's translations are written to the job's directory before it counts as done, so a job survives
an engine restart (the chunks in flight fail with 503 and are sent again, once the engine is back) and
an API restart (the next runner sends the chunks that have no file). CHUNKS_IN_FLIGHT chunks are in the
engine at once, so that the next one is already queued when one finishes. While a job runs its record
is written at least every HEARTBEAT_S (its `updated_at`) and after every chunk (its progress); the same
heartbeat notices a cancel asked through any worker.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from nmt_serve.engine.protocol import DecodeOptions
from nmt_serve.service.errors import APIError
from nmt_serve.service.jobs_store import (
    CANCELLED,
    DONE,
    FAILED,
    RUNNING,
    Claim,
    JobStore,
)
from nmt_serve.service.pipeline import TextResult, terminology, translate_texts
from nmt_serve.service.schemas import (
    Translation,
)
from nmt_serve.service.state import ServiceState

log = logging.getLogger("nmt_serve.service.jobs")
CHUNKS_IN_FLIGHT = 2
HEARTBEAT_S = 1.0  # the record's updated_at moves at least this often while the job runs (progress: every 2 s at most)
SCAN_INTERVAL_S = 1.0  # how often an idle runner looks for jobs (a job posted to this worker wakes it at once)
ONE_TEXTS_FAULT = {400, 413}  # a text the pipeline refuses (the pair and options were checked when the job was posted)
RETRIED = {499, 503, 504}  # the engine was lost, restarting, busy, or the chunk's deadline passed: send the chunk again


class JobFailed(Exception):
    """A chunk cannot be translated as asked (a 4xx from the pipeline): the job fails with its message."""


def translation_of(result: TextResult, options: DecodeOptions) -> dict:
    """One text's translation as /v1/translate shows it (schemas.Translation), as JSON."""
    return Translation.of(result, options.num_hypotheses).model_dump(exclude_none=True)


class JobRunner:
    def __init__(self, state: ServiceState, store: JobStore):
        self.state, self.store = state, store
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # the job's files, read and written on one thread in the order asked: a write whose coroutine was
        # cancelled still lands before the next one (the final state is the last word)
        self._files = ThreadPoolExecutor(1, thread_name_prefix="jobs-files")

    async def _disk(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._files, functools.partial(fn, *args))

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="jobs")

    async def stop(self) -> None:
        """The job in hand stops where it is (its written chunks stay; the next runner goes on from them)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._files.shutdown(wait=True)

    def wake(self) -> None:
        """A job was posted: look now rather than at the next scan."""
        self._wake.set()

    async def submit(self, spec: dict, texts: list[str], options: DecodeOptions, original: bytes | None = None) -> dict:
        """A new job's record (jobs_store.JobStore.create), picked up at once by this runner or any other."""
        # a wrong pair is refused now, not when the job runs; a served language to itself is given back
        if spec["source"] != "auto" and not self.state.to_itself(spec["source"], spec["target"]):
            self.state.model_for(spec["source"], spec["target"])
        spec = dict(spec, options=dataclasses.asdict(options))
        record = await asyncio.to_thread(self.store.create, spec, texts, self.state.settings.job_chunk_texts, original)
        self.wake()
        return record

    async def _serve(self) -> None:
        while True:
            self._wake.clear()
            try:
                claim = await self._disk(self.store.claim)
            except OSError:
                log.exception("the jobs directory %s cannot be read", self.store.directory)
                claim = None
            if claim is None:
                try:
                    await asyncio.wait_for(self._wake.wait(), SCAN_INTERVAL_S)
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                await self._run(claim)
            except Exception as exc:
                log.exception("job %s failed", claim.record["id"])
                await self._disk(self.store.finish, claim.record, FAILED, f"the job could not run: {type(exc).__name__}")
            finally:
                claim.release()

    async def _run(self, claim: Claim) -> None:
        record, store = claim.record, self.store
        job_id = record["id"]
        texts = await self._disk(store.texts, job_id)
        finished = await self._disk(store.tally, record)
        todo = iter([k for k in range(len(record["chunks"])) if k not in finished])
        now = time.time()
        record.update(state=RUNNING, started_at=record["started_at"] or now, resumed_at=now, done_at_resume=record["done"])
        await self._disk(store.write, dict(record))
        log.info("job %s: %d of %d texts done, %d chunks to go", job_id, record["done"], record["total"],
                 len(record["chunks"]) - len(finished))
        options = DecodeOptions(**record["options"])
        lock = asyncio.Lock()  # the record is written by the chunks and the heartbeat: one at a time

        async def chunks() -> None:
            try:
                await translate_chunks()
            except Exception:
                for worker in workers:  # the job failed: its other chunks are of no use
                    if worker is not asyncio.current_task():
                        worker.cancel()
                raise

        async def translate_chunks() -> None:
            nonlocal cancelled
            for k in todo:  # one iterator shared by the workers: each chunk is taken once
                if await self._disk(store.cancelled, job_id):  # asked to stop: no new chunk goes out
                    cancelled = True
                    return
                start, end = record["chunks"][k]
                results = await self._translate(record, texts[start:end], options)
                payload = dict(translations=[translation_of(r, options) for r in results],
                               sentences=sum(r.sentences for r in results), source_tokens=sum(r.source_tokens for r in results),
                               generated_tokens=sum(r.generated_tokens for r in results))
                await self._disk(store.write_chunk, job_id, k, payload)  # written before it counts as done
                async with lock:
                    record["done"] += end - start
                    record["not_translated"] = record.get("not_translated", 0) + sum(r.error is not None for r in results)
                    for name in ("sentences", "source_tokens", "generated_tokens"):
                        record[name] += payload[name]
                    record["models"] = sorted(set(record["models"]) | {r.model for r in results if r.model})
                    await self._disk(store.write, dict(record))

        workers = [asyncio.create_task(chunks()) for _ in range(CHUNKS_IN_FLIGHT)]
        cancelled = False

        async def heartbeat() -> None:
            nonlocal cancelled
            while True:
                await asyncio.sleep(HEARTBEAT_S)
                if await self._disk(store.cancelled, job_id):
                    cancelled = True
                    for worker in workers:
                        worker.cancel()  # the engine drops the chunks in flight
                    return
                async with lock:
                    await self._disk(store.write, dict(record))

        beat = asyncio.create_task(heartbeat())
        try:
            outcomes = await asyncio.gather(*workers, return_exceptions=True)
        finally:
            beat.cancel()
            for worker in workers:
                worker.cancel()
        failures = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)]
        # asked to stop after the last chunk went out: it ends cancelled, not done
        cancelled = cancelled or await self._disk(store.cancelled, job_id)
        if cancelled:
            state, error = CANCELLED, None
        elif failures:
            state, error = FAILED, str(failures[0]) if isinstance(failures[0], JobFailed) else "the job could not run"
            if not isinstance(failures[0], JobFailed):
                log.error("job %s failed", job_id, exc_info=failures[0])
        else:
            state, error = DONE, None
        await self._disk(store.finish, record, state, error)
        log.info("job %s %s: %d of %d texts", job_id, state, record["done"], record["total"])

    async def _translate(self, record: dict, texts: list[str], options: DecodeOptions) -> list[TextResult]:
        """One chunk through the pipeline, sent again (after a pause) for as long as the engine is away
        or busy; a failure that another try would not mend fails the job."""
        while True:
            try:
                return await translate_texts(self.state, None, source=record["source"], target=record["target"], texts=texts,
                                             options=options, param="q", format=record["format"],
                                             split_sentences=record["split_sentences"],
                                             terminology=terminology(record.get("glossary"), record.get("avoid")))
            except APIError as exc:
                if exc.status in ONE_TEXTS_FAULT:
                    # one text's own problem (no served language found in it, too long) must not lose the
                    # others: each is sent alone, and the one at fault comes back as it is, with why
                    if len(texts) == 1:
                        return [TextResult.untranslated(texts[0], exc.message)]
                    return [r for text in texts for r in await self._translate(record, [text], options)]
                if exc.status not in RETRIED:
                    raise JobFailed(exc.message) from None
                pause = float((exc.headers or {}).get("Retry-After", 1))
                log.info("job %s: a chunk is sent again in %gs (%s)", record["id"], pause, exc.message)
                await asyncio.sleep(min(max(pause, 0.2), 10.0))
