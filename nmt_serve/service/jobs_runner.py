"""Runs jobs: in every API process, one task that takes the oldest job nobody runs (jobs_store.py: an
flock, so with several workers each job runs in exactly one of them, and a job whose process died is
taken up by the next that looks) and sends it to the engine chunk by chunk, at background priority.

A chunk's translations are written to the job's directory before it counts as done, so a job survives
an engine restart (the chunks in flight fail with 503 and are sent again, once the engine is back) and
an API restart (the next runner sends the chunks that have no file). CHUNKS_IN_FLIGHT chunks are in the
engine at once, so that the next one is already queued when one finishes. While a job runs its record
is written at least every HEARTBEAT_S (its `updated_at`) and after every chunk (its progress); the same
heartbeat notices a cancel asked through any worker.

Jobs take turns: a job that has run for SLICE_S while another waits (one that no runner holds) sends no
new chunk, lets the chunks in flight land and gives its turn up (jobs_store.JobStore.yield_turn: queued
again, behind the jobs waiting now), so a short job posted behind a long one is not kept waiting until
the long one ends.

A job's files that cannot be written (a full disk, a jobs directory turned read-only) do not fail it:
its runner stops it where it is (the chunks written are kept) and takes it up again DISK_RETRY_S later
(serving the other jobs meanwhile), so it goes on once the disk has room; the runner itself goes on
serving whatever happens to one job.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from nmt_serve.engine.protocol import DecodeOptions
from nmt_serve.service.directions import Pivot
from nmt_serve.service.errors import APIError
from nmt_serve.service.jobs_store import (
    CANCELLED,
    DONE,
    FAILED,
    RUNNING,
    Claim,
    IdempotencyConflict,
    JobStore,
)
from nmt_serve.service.pipeline import TextResult, glossary_through_pivot, stored_glossary, terminology, translate_texts
from nmt_serve.service.schemas import (
    Translation,
)
from nmt_serve.service.state import ServiceState

log = logging.getLogger("nmt_serve.service.jobs")
CHUNKS_IN_FLIGHT = 2
SLICE_S = 10.0  # a job runs at least this long before it gives its turn up to a job waiting for one
DISK_RETRY_S = 5.0  # a job whose files could not be written is taken up again this long after
HEARTBEAT_S = 1.0  # the record's updated_at moves at least this often while the job runs (progress: every 2 s at most)
TEXTS_KEPT = 4  # the texts of this many jobs are kept in memory between their turns
SCAN_INTERVAL_S = 1.0  # how often an idle runner looks for jobs (a job posted to this worker wakes it at once)
ONE_TEXTS_FAULT = {400, 413}  # a text the pipeline refuses (the pair and options were checked when the job was posted)
RETRIED = {499, 503, 504}  # the engine was lost, restarting, busy, or the chunk's deadline passed: send the chunk again


class JobFailed(Exception):
    """A chunk cannot be translated as asked (a 4xx from the pipeline): the job fails with its message."""


class JobPaused(Exception):
    """The job's files could not be written (a full disk): it stops where it is, to be taken up again."""


def disk_trouble(exc: BaseException) -> bool:
    """An OSError of the jobs directory that time or an operator mends (no space, read-only, no access),
    as opposed to a job whose own files are gone (FileNotFoundError: it fails)."""
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)


def request_digest(spec: dict, texts: list[str], original: bytes | None) -> str:
    """What a job was asked for, as a digest: an Idempotency-Key sent again must come with the same."""
    digest = hashlib.sha256(json.dumps([spec, texts], sort_keys=True).encode())
    digest.update(hashlib.sha256(original or b"").digest())
    return digest.hexdigest()


def storage_error(exc: OSError, what: str = "jobs") -> APIError:
    """What a client is told when a job (or a glossary: what) cannot be written: 507 for a full disk, else 503;
    both are to be retried later (the message says why, without the server's paths)."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return APIError(507, "insufficient_storage", f"the {what} directory is full ({reason}): retry later", None,
                        {"Retry-After": "60"})
    return APIError(503, f"{what}_unavailable", f"the {what} directory cannot be written ({reason}): retry later", None,
                    {"Retry-After": "60"})


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
        self._texts: dict[str, list[str]] = {}  # _texts_of
        self._paused: dict[str, float] = {}  # a job whose files could not be written: when it may be taken again

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

    async def submit(self, spec: dict, texts: list[str], options: DecodeOptions, original: bytes | None = None,
                     idempotency_key: str | None = None) -> dict:
        """A new job's record (jobs_store.JobStore.create), picked up at once by this runner or any other.
        idempotency_key (already tied to its client): a key that names a job kept gives that job's record
        ("replayed": True) where the request is the same, 409 where it is not."""
        # a wrong pair is refused now, not when the job runs; a served language to itself is given back
        if spec["source"] != "auto" and not self.state.to_itself(spec["source"], spec["target"]):
            route = self.state.route(spec["source"], spec["target"])
            if isinstance(route, Pivot) and (spec.get("glossary") or spec.get("glossary_id")):
                raise glossary_through_pivot(route)
        spec = dict(spec, options=dataclasses.asdict(options))
        idempotency = None if idempotency_key is None else (idempotency_key, request_digest(spec, texts, original))
        try:
            record = await asyncio.to_thread(self.store.create, spec, texts, self.state.settings.job_chunk_texts, original, idempotency)
        except IdempotencyConflict:
            raise APIError(409, "idempotency_key_reused", "this Idempotency-Key was given to another request (other texts "
                                                          "or options): a new job needs a new key", "Idempotency-Key") from None
        except OSError as exc:
            log.error("a job could not be written to %s: %s", self.store.directory, exc)
            raise storage_error(exc) from None
        self.wake()
        return record

    async def cancel(self, job_id: str) -> dict | None:
        """DELETE of a queued or running job: jobs_store.JobStore.cancel."""
        return await self._change(self.store.cancel, job_id, "the cancel could not be written")

    async def remove(self, job_id: str) -> dict | None:
        """DELETE of a finished job: jobs_store.JobStore.remove."""
        return await self._change(self.store.remove, job_id, "it could not be removed")

    async def _change(self, change, job_id: str, failure: str) -> dict | None:
        """A change of a job asked for by a client: 503/507 where the jobs directory cannot be written."""
        try:
            return await asyncio.to_thread(change, job_id)
        except OSError as exc:
            log.error("job %s: %s (%s): %s", job_id, failure, self.store.directory, exc)
            raise storage_error(exc) from None

    async def _serve(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            self._paused = {job_id: until for job_id, until in self._paused.items() if until > now}
            try:
                claim = await self._disk(self.store.claim, frozenset(self._paused))
            except OSError as exc:
                log.error("the jobs directory %s cannot be used: %s", self.store.directory, exc)
                await asyncio.sleep(DISK_RETRY_S)
                continue
            if claim is None:
                try:
                    await asyncio.wait_for(self._wake.wait(), SCAN_INTERVAL_S)
                except asyncio.TimeoutError:
                    pass
                continue
            paused = False
            try:
                await self._run(claim)
            except JobPaused as exc:
                paused = True
                log.error("job %s stopped where it is, to go on in %gs: its files cannot be written (%s)",
                          claim.record["id"], DISK_RETRY_S, exc)
            except Exception as exc:
                if disk_trouble(exc):
                    paused = True
                    log.error("job %s stopped where it is, to go on in %gs: %s", claim.record["id"], DISK_RETRY_S, exc)
                else:
                    log.exception("job %s failed", claim.record["id"])
                    try:
                        await self._disk(self.store.finish, claim.record, FAILED, f"the job could not run: {type(exc).__name__}")
                    except Exception as again:  # (the record cannot be written either: the job is taken up again)
                        paused = True
                        log.error("job %s: its end could not be written: %s", claim.record["id"], again)
            finally:
                claim.release()
            if paused:  # taken up again after DISK_RETRY_S; meanwhile the runner serves the other jobs
                self._texts.pop(claim.record["id"], None)
                self._paused[claim.record["id"]] = time.monotonic() + DISK_RETRY_S

    async def _texts_of(self, job_id: str) -> list[str]:
        """The job's texts, kept for the few jobs taking turns here (a job taken up again after its turn
        does not read them again)."""
        if job_id not in self._texts:
            texts = await self._disk(self.store.texts, job_id)
            while len(self._texts) >= TEXTS_KEPT:
                self._texts.pop(next(iter(self._texts)))
            self._texts[job_id] = texts
        return self._texts[job_id]

    async def _run(self, claim: Claim) -> None:
        record, store = claim.record, self.store
        job_id = record["id"]
        texts = await self._texts_of(job_id)
        finished = await self._disk(store.tally, record)
        todo = iter([k for k in range(len(record["chunks"])) if k not in finished])
        now = time.time()
        if not record.get("yielded") or not record["resumed_at"]:
            # a run of its own (not a turn after the job gave one up): the ETA's rate is measured from here;
            # across turns it is measured over the turns and the waits between them (the job's share)
            record.update(resumed_at=now, done_at_resume=record["done"])
        record.update(state=RUNNING, started_at=record["started_at"] or now, yielded=False)
        await self._disk(store.write, dict(record))
        log.info("job %s: %d of %d texts done, %d chunks to go", job_id, record["done"], record["total"],
                 len(record["chunks"]) - len(finished))
        options = DecodeOptions(**record["options"])
        lock = asyncio.Lock()  # the record is written by the chunks and the heartbeat: one at a time
        turn_began, yielding, landed = time.monotonic(), False, 0

        async def turn_over() -> bool:
            """Whether the job gives its turn up: it has run for SLICE_S, a chunk of it has landed in this
            turn (every turn moves it on), and another job waits for one."""
            nonlocal turn_began, yielding
            if not yielding and landed and time.monotonic() - turn_began >= SLICE_S:
                turn_began = time.monotonic()  # nobody waits: look again after another slice
                yielding = await self._disk(store.others_waiting, job_id)
            return yielding

        async def chunks() -> None:
            try:
                await translate_chunks()
            except Exception:
                for worker in workers:  # the job failed: its other chunks are of no use
                    if worker is not asyncio.current_task():
                        worker.cancel()
                raise

        async def translate_chunks() -> None:
            nonlocal cancelled, landed
            for k in todo:  # one iterator shared by the workers: each chunk is taken once
                if await self._disk(store.cancelled, job_id):  # asked to stop: no new chunk goes out
                    cancelled = True
                    return
                if await turn_over():  # chunk k is sent on the job's next turn (it has no file)
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
                    landed += 1
                self.state.metrics.job_texts.inc(end - start)

        workers = [asyncio.create_task(chunks()) for _ in range(CHUNKS_IN_FLIGHT)]
        cancelled, unwritable = False, None

        async def heartbeat() -> None:
            nonlocal cancelled, unwritable
            while True:
                await asyncio.sleep(HEARTBEAT_S)
                try:
                    if await self._disk(store.cancelled, job_id):
                        cancelled = True
                    else:
                        async with lock:
                            await self._disk(store.write, dict(record))
                        continue
                except OSError as exc:  # the record cannot be written: the job stops where it is
                    unwritable = exc
                for worker in workers:
                    worker.cancel()  # the engine drops the chunks in flight
                return

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
        unwritable = unwritable or next((f for f in failures if disk_trouble(f)), None)
        if cancelled:
            state, error = CANCELLED, None
        elif unwritable is not None:
            raise JobPaused(str(unwritable))  # its written chunks are kept; _serve takes it up again later
        elif failures:
            state, error = FAILED, str(failures[0]) if isinstance(failures[0], JobFailed) else "the job could not run"
            if not isinstance(failures[0], JobFailed):
                log.error("job %s failed", job_id, exc_info=failures[0])
        elif record["done"] < record["total"]:  # gave its turn up, with chunks still to send
            await self._disk(store.yield_turn, record)
            log.info("job %s gives its turn up: %d of %d texts done", job_id, record["done"], record["total"])
            return
        else:
            state, error = DONE, None
        self._texts.pop(job_id, None)
        await self._disk(store.finish, record, state, error)
        log.info("job %s %s: %d of %d texts", job_id, state, record["done"], record["total"])

    async def _translate(self, record: dict, texts: list[str], options: DecodeOptions) -> list[TextResult]:
        """One chunk through the pipeline, sent again (after a pause) for as long as the engine is away
        or busy; a failure that another try would not mend fails the job."""
        try:
            stored = await stored_glossary(self.state, record.get("glossary_id"), None, record["source"], record["target"])
        except APIError as exc:  # its glossary was deleted: none of its texts can be translated as asked
            raise JobFailed(exc.message) from None
        while True:
            try:
                return await translate_texts(self.state, None, source=record["source"], target=record["target"], texts=texts,
                                             options=options, param="q", format=record["format"],
                                             split_sentences=record["split_sentences"],
                                             terminology=terminology(record.get("glossary"), record.get("avoid"), stored))
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
