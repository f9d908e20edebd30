"""Jobs on disk: what a job is asked to translate, how far it got, and its results, in one directory per
job under the `jobs_dir` setting, shared by every API worker and kept across restarts of the engine
and of the API processes.

    <jobs_dir>/<id>/job.json          the record: what to do (languages, options, the chunks' bounds)
                                      and the progress (state, texts done, timestamps)
    <jobs_dir>/<id>/input.json        the texts, written once
    <jobs_dir>/<id>/original          an uploaded file's bytes (a document job: its result is the file translated)
    <jobs_dir>/<id>/chunks/<k>.json   chunk k's translations: a chunk counts as done once its file exists
    <jobs_dir>/<id>/cancel            DELETE asked for the job to stop
    <jobs_dir>/<id>/lock              flock()ed by the process that runs the job
    <jobs_dir>/keys/<sha256>          an Idempotency-Key's job: {"id", "request"} (a digest of the request)

A job's record names its `owner` (a digest of the API key that made it; "" on a server without keys):
with keys on, a key reads, lists and deletes its own jobs only.

Every file is written whole and renamed into place, so a reader (another worker, the same job after
a restart) never sees half of one, and a write that fails (a full disk) leaves nothing behind. The
chunks' bounds are fixed when the job is made, so whoever resumes it sends exactly the chunks that have
no file: none is lost, none translated twice. The lock is an flock: the kernel drops it with the
process that held it, so a job whose runner died is free to be taken up again by any worker.

Jobs take turns: claim() takes the job that has waited longest for its turn (`queued_at`: when it was
posted, or when its runner last gave its turn up to let another job run: yield_turn), so a runner that
gives a long job up after a slice (jobs_runner.SLICE_S) while others wait runs the others before it again.
A finished job is removed ttl_s after it ended (its `expires_at`), or when DELETE removes it (remove());
from then on it reads as no job, even before a runner's scan removes its directory.

A finished record never changes again (only its removal), so each process keeps the finished ones it has
read in memory (without their chunks' bounds): the scans (an idle runner's every second, `/v1/jobs`, each
`/metrics` scrape) list the directory and read only the unfinished jobs' records. With 20,000 finished jobs
kept, a scan read 20,000 files (0.57 s of CPU, every second, in each idle worker).

An Idempotency-Key (already tied to its client by the caller) names one job for as long as that job is
kept: its file is made with link(), which fails where the file is there, so of two requests with one key
exactly one makes a job; the other (and every later one) gets that job, or IdempotencyConflict when it
asked for something else. The job's record is written only after its key is taken; the key's file is
removed with the job.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ID = re.compile(r"[0-9a-f]{32}")
QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
FINISHED = frozenset({DONE, FAILED, CANCELLED})
CHUNK_CHARS = 16_000  # a chunk closes at this many characters too (a few long texts make a chunk)
KEY_WAIT_S = 2.0  # how long a request waits for the job that another request with its key is making
# what a finished job's record is kept in memory with: what a listing shows (schemas.JobStatus), whose it is
# and when it expires: some 460 bytes a job (the whole record took 3.3 KB)
_LISTED = ("id", "state", "owner", "source", "target", "file_name", "done", "total", "sentences", "not_translated",
           "error", "created_at", "started_at", "updated_at", "finished_at", "resumed_at", "done_at_resume",
           "idempotency_key")
_SHARED = {"state", "owner", "source", "target"}  # values many jobs have alike: one string for them all
_ID, _FINISHED_AT, _UPDATED_AT, _KEY = (_LISTED.index(k) for k in ("id", "finished_at", "updated_at", "idempotency_key"))


class IdempotencyConflict(Exception):
    """An Idempotency-Key that names a job made for another request."""


def default_directory() -> Path:
    return Path(tempfile.gettempdir()) / f"nmt-serve-jobs-{os.getuid()}"


def chunk_bounds(texts: list[str], chunk_texts: int, chunk_chars: int = CHUNK_CHARS) -> list[tuple[int, int]]:
    """[start, end) of each chunk: up to chunk_texts texts and chunk_chars characters, at least one text."""
    bounds, start, chars = [], 0, 0
    for i, text in enumerate(texts):
        if i > start and (i - start >= chunk_texts or chars + len(text) > chunk_chars):
            bounds.append((start, i))
            start, chars = i, 0
        chars += len(text)
    if start < len(texts):
        bounds.append((start, len(texts)))
    return bounds


def write_json(path: Path, value, durable: bool = True) -> None:
    """The JSON file whole or not at all: written beside it, renamed over it; durable: flushed to disk
    first (the chunks' results; the record's counts are made again from them on resume: tally). A write
    that fails (OSError: a full disk) removes what it had written."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(value, f, ensure_ascii=False, separators=(",", ":"))
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        try:
            partial.unlink()
        except OSError:
            pass
        raise


@dataclass
class Claim:
    """A job this process runs: its record, and the lock that keeps every other runner off it."""

    record: dict
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1


class JobStore:
    def __init__(self, directory: str | Path, ttl_s: float):
        self.directory = Path(directory)
        self.ttl_s = ttl_s
        self._finished: dict[str, tuple] = {}  # id -> a finished job's record, its _LISTED fields
        self._finished_lock = threading.Lock()  # the store is used from several threads (asyncio.to_thread)

    def path(self, job_id: str) -> Path | None:
        """The job's directory, or None for anything that is not a job id (keeps paths out)."""
        return self.directory / job_id if ID.fullmatch(job_id) else None

    # ------------------------------------------------------------------ made by POST /v1/jobs
    def create(self, spec: dict, texts: list[str], chunk_texts: int, original: bytes | None = None,
               idempotency: tuple[str, str] | None = None) -> dict:
        """A new queued job: `spec` is what to do (source, target, format, options, ...); `original`, the
        uploaded file its texts were read from. `idempotency`: (key, digest of the request); where the key
        already names a job that is kept, that job's record (with "replayed": True) and no new job."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        job_id = secrets.token_hex(16)  # 128 random bits: knowing the id is what grants reading the job
        home = self.directory / job_id
        (home / "chunks").mkdir(parents=True)
        key = None
        try:
            write_json(home / "input.json", texts)
            if original is not None:
                (home / "original").write_bytes(original)
            if idempotency is not None:
                key = hashlib.sha256(idempotency[0].encode("utf-8", "backslashreplace")).hexdigest()
                existing = self._take_key(key, idempotency[1], job_id)
                if existing is not None:
                    shutil.rmtree(home, ignore_errors=True)
                    return dict(existing, replayed=True)
            now = time.time()
            record = dict(spec, id=job_id, state=QUEUED, total=len(texts), done=0, sentences=0, source_tokens=0, generated_tokens=0,
                          models=[], error=None, created_at=now, started_at=None, updated_at=now, finished_at=None,
                          resumed_at=None, done_at_resume=0, queued_at=now, idempotency_key=key,
                          chunks=chunk_bounds(texts, chunk_texts))
            write_json(home / "job.json", record)  # last: a directory without it is not a job yet
        except BaseException:
            # a job half written (a full disk) is no job, and nothing else would ever remove its directory
            shutil.rmtree(home, ignore_errors=True)
            if key is not None:
                self._drop_key(key, job_id)
            raise
        return record

    def _take_key(self, key: str, request: str, job_id: str) -> dict | None:
        """None once the key names job_id (the job is then made); the record of the job it names already
        (IdempotencyConflict where that job was asked for another request). A key whose job is gone
        (expired, or its request failed before it was made) is taken over."""
        keys = self.directory / "keys"
        keys.mkdir(mode=0o700, exist_ok=True)
        path, mine = keys / key, keys / f".{key}.{job_id}"
        write_json(mine, {"id": job_id, "request": request})
        try:
            for _ in range(5):
                try:
                    os.link(mine, path)
                    return None
                except FileExistsError:
                    pass
                try:
                    held = json.loads(path.read_text(encoding="utf-8"))
                except FileNotFoundError:
                    continue  # removed meanwhile: try again
                record = self._record_when_made(held["id"])
                if record is not None:
                    if held["request"] != request:
                        raise IdempotencyConflict(held["id"])
                    return record
                self._drop_key(key, held["id"])
            raise IdempotencyConflict(None)  # taken and given up again and again meanwhile: a conflict all the same
        finally:
            mine.unlink(missing_ok=True)

    def _record_when_made(self, job_id: str) -> dict | None:
        """The job as a client reads it, waiting (KEY_WAIT_S) for one whose record is still being written;
        None for a job that is not kept (or was never made)."""
        deadline = time.monotonic() + KEY_WAIT_S
        while ID.fullmatch(job_id):
            if self._record(job_id) is not None:
                return self.read(job_id)  # (None once it has expired)
            if not (self.directory / job_id).is_dir() or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return None

    def _drop_key(self, key: str | None, job_id: str) -> None:
        """Remove the key's file where it names job_id."""
        if not key:
            return
        path = self.directory / "keys" / key
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("id") == job_id:
                path.unlink()
        except (OSError, ValueError):
            pass

    # ------------------------------------------------------------------ read by any worker
    def read(self, job_id: str) -> dict | None:
        """The record, as a client sees it: a job asked to stop reads as cancelled at once, its progress
        as it was when asked (chunks in flight may still land before its runner stops; they are dropped);
        a finished job has its `expires_at`, and past it reads as None (expired) whether or not a runner
        has removed it yet."""
        return self._shown(self._record(job_id))

    def _shown(self, record: dict | None) -> dict | None:
        """A record as read() shows it (see there)."""
        if record is None:
            return None
        job_id = record["id"]
        record["expires_at"] = None
        if record["state"] in FINISHED:
            record["expires_at"] = self.expires_at(record)
            if time.time() > record["expires_at"]:
                return None
        elif self.cancelled(job_id):
            record.update(self._progress_when_cancelled(job_id), state=CANCELLED)
        return record

    def expires_at(self, record: dict) -> float:
        """When a finished job is removed: ttl_s after it ended."""
        return (record["finished_at"] or record["updated_at"]) + self.ttl_s

    def _progress_when_cancelled(self, job_id: str) -> dict:
        try:
            asked = json.loads((self.directory / job_id / "cancel").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: asked[k] for k in ("done", "sentences") if isinstance(asked, dict) and k in asked}

    def _record(self, job_id: str) -> dict | None:
        """The record as its runner last wrote it."""
        home = self.path(job_id)
        if home is None:
            return None
        try:
            return json.loads((home / "job.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def texts(self, job_id: str) -> list[str]:
        return json.loads((self.directory / job_id / "input.json").read_text(encoding="utf-8"))

    def done_chunks(self, job_id: str) -> set[int]:
        return {int(p.stem) for p in (self.directory / job_id / "chunks").glob("*.json")}

    def tally(self, record: dict) -> set[int]:
        """The chunks done, and the record's counts made from their files (a runner stopped between
        writing a chunk and counting it left the count behind). A job whose runner gave its turn up
        (yield_turn) counted every chunk it wrote: its files are not read again."""
        done = self.done_chunks(record["id"])
        if record.get("yielded"):
            return done
        home = self.directory / record["id"] / "chunks"
        record.update(done=0, sentences=0, source_tokens=0, generated_tokens=0, not_translated=0)
        for k in done:
            start, end = record["chunks"][k]
            payload = json.loads((home / f"{k:06d}.json").read_text(encoding="utf-8"))
            record["done"] += end - start
            record["not_translated"] += sum("error" in t for t in payload["translations"])
            for name in ("sentences", "source_tokens", "generated_tokens"):
                record[name] += payload[name]
        return done

    def original(self, job_id: str) -> bytes:
        return (self.directory / job_id / "original").read_bytes()

    def chunks(self, record: dict) -> list[dict]:
        """Every chunk's results, in order (the job is done; FileNotFoundError once it is removed)."""
        home = self.directory / record["id"] / "chunks"
        return [json.loads((home / f"{k:06d}.json").read_text(encoding="utf-8")) for k in range(len(record["chunks"]))]

    def chunks_so_far(self, record: dict) -> list[dict | None]:
        """Each chunk's results where its file is written, else None (a job that is not done)."""
        home = self.directory / record["id"] / "chunks"
        results: list[dict | None] = []
        for k in range(len(record["chunks"])):
            try:
                results.append(json.loads((home / f"{k:06d}.json").read_text(encoding="utf-8")))
            except FileNotFoundError:
                results.append(None)
        return results

    def jobs(self, owner: str | None, state: str | None = None, before: str | None = None, limit: int = 20) -> tuple[list[dict], bool]:
        """Up to `limit` jobs as read() shows them, the newest first, and whether there are more: those of
        `owner` (None: everyone's; a job made with no owner is everyone's), in `state` if given, made
        before the job `before` (the last one of the previous page) if given. Every job's record is read:
        the jobs kept are those of the last job_ttl_s, finished, plus the unfinished."""
        records = [r for r in self._kept() if owner is None or r.get("owner") in (owner, None, "")]
        records.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
        if before is not None:
            cursor = next((r for r in records if r["id"] == before), None)
            if cursor is None:
                return [], False
            records = [r for r in records if (r["created_at"], r["id"]) < (cursor["created_at"], cursor["id"])]
        if state is not None:
            records = [r for r in records if r["state"] == state]
        return records[:limit], len(records) > limit

    def counts(self) -> dict[str, int]:
        """How many jobs are kept in each state, as read() shows them."""
        counts = dict.fromkeys((QUEUED, RUNNING, DONE, FAILED, CANCELLED), 0)
        for record in self._kept():
            counts[record["state"]] += 1
        return counts

    def _kept(self):
        """Every job kept, as read() shows it."""
        for record in self._records():
            try:
                shown = self._shown(dict(record))
            except (OSError, ValueError):  # removed meanwhile
                continue
            if shown is not None:
                yield shown

    def _records(self) -> list[dict]:
        """Every job's record as its runner last wrote it: a finished one from memory once it has been read
        (its _LISTED fields), an unfinished one read now."""
        finished, unfinished = self._scan()
        return [dict(zip(_LISTED, kept)) for kept in finished] + unfinished

    def _scan(self) -> tuple[list[tuple], list[dict]]:
        """(the finished jobs' _LISTED fields, the unfinished jobs' records)."""
        if not self.directory.is_dir():
            return [], []
        finished, unfinished, present = [], [], set()
        for home in os.scandir(self.directory):
            job_id = home.name
            if not ID.fullmatch(job_id):
                continue
            present.add(job_id)
            kept = self._finished.get(job_id)
            if kept is None:
                try:
                    record = self._record(job_id)
                except (OSError, ValueError):  # removed meanwhile, or a record being replaced
                    continue
                if record is None:
                    continue
                if record["state"] not in FINISHED:
                    unfinished.append(record)
                    continue
                kept = tuple(sys.intern(v) if k in _SHARED and isinstance(v, str) else v
                             for k, v in ((k, record.get(k)) for k in _LISTED))
                with self._finished_lock:
                    self._finished[job_id] = kept
            finished.append(kept)
        with self._finished_lock:  # removed by any worker (expired, or DELETE)
            for job_id in [j for j in self._finished if j not in present]:
                del self._finished[job_id]
        return finished, unfinished

    def remove(self, job_id: str) -> dict | None:
        """Remove a finished job and its results now (DELETE of a job that has ended): its record as it was,
        with `expires_at` now; None where no runner-free finished job is there (one still stopping after
        its cancel: it is removed when it expires)."""
        try:
            fd = self._lock(job_id)
        except FileNotFoundError:  # removed meanwhile (another DELETE)
            return None
        if fd is None:
            return None
        try:
            record = self._record(job_id)
            if record is None or record["state"] not in FINISHED:
                return None
            record["expires_at"] = time.time()
            self._drop_key(record.get("idempotency_key"), job_id)
            # renamed away first: from that moment no reader finds the job, however long the removal takes
            gone = self.directory / f".removed-{job_id}"
            os.replace(self.directory / job_id, gone)
            shutil.rmtree(gone, ignore_errors=True)
            return record
        finally:
            os.close(fd)

    def cancel(self, job_id: str) -> dict | None:
        """Ask the job to stop (its runner, whichever worker holds it, stops within a heartbeat); a job
        nobody runs is cancelled here and now."""
        record = self.read(job_id)
        if record is None or record["state"] in FINISHED:
            return record
        home = self.directory / job_id
        write_json(home / "cancel", {"done": record["done"], "sentences": record["sentences"]}, durable=False)
        fd = self._lock(job_id)
        if fd is not None:  # nobody runs it
            try:
                record = self._record(job_id)
                if record["state"] not in FINISHED:
                    self.finish(record, CANCELLED)
            finally:
                os.close(fd)
        return self.read(job_id)

    # ------------------------------------------------------------------ written by the runner holding the lock
    def write(self, record: dict) -> None:
        record["updated_at"] = time.time()
        write_json(self.directory / record["id"] / "job.json", record, durable=record["state"] != RUNNING)

    def write_chunk(self, job_id: str, k: int, results: dict) -> None:
        write_json(self.directory / job_id / "chunks" / f"{k:06d}.json", results)

    def cancelled(self, job_id: str) -> bool:
        return (self.directory / job_id / "cancel").exists()

    def yield_turn(self, record: dict) -> None:
        """The runner gives the job's turn up (another job waits; every chunk it sent is written and
        counted): queued again, behind the jobs waiting now, its progress and started_at kept."""
        record.update(state=QUEUED, queued_at=time.time(), yielded=True)
        self.write(record)

    def finish(self, record: dict, state: str, error: str | None = None) -> None:
        record.update(state=state, error=error, finished_at=time.time())
        if state == CANCELLED:  # its partial results are of no use to anyone
            record.update(self._progress_when_cancelled(record["id"]))
            shutil.rmtree(self.directory / record["id"] / "chunks", ignore_errors=True)
        self.write(record)

    def _unfinished(self) -> list[tuple[float, float, str]]:
        """(queued_at, created_at, id) of every unfinished job, longest waiting first; on the way, jobs
        finished more than ttl_s ago are removed."""
        if not self.directory.is_dir():
            return []
        for home in os.scandir(self.directory):
            if home.name.startswith(".removed-"):  # a removal (remove()) that stopped half way
                shutil.rmtree(home.path, ignore_errors=True)
        finished, unfinished = self._scan()
        now = time.time()
        for kept in finished:
            job_id, ended, updated, key = kept[_ID], kept[_FINISHED_AT], kept[_UPDATED_AT], kept[_KEY]
            if now > (ended or updated) + self.ttl_s:  # expires_at()
                self._drop_key(key, job_id)
                shutil.rmtree(self.directory / job_id, ignore_errors=True)
        return sorted((r.get("queued_at") or r["created_at"], r["created_at"], r["id"]) for r in unfinished)

    def others_waiting(self, job_id: str) -> bool:
        """Whether an unfinished job other than this one waits for a runner (no runner holds it)."""
        for _, _, other in self._unfinished():
            if other == job_id or self.cancelled(other):
                continue
            fd = self._lock(other)
            if fd is not None:
                os.close(fd)
                return True
        return False

    def claim(self, skip: frozenset[str] = frozenset()) -> Claim | None:
        """The unfinished job that has waited longest for its turn (queued_at) and that no runner holds,
        locked for this one (none of `skip`); on the way, jobs finished more than ttl_s ago are removed."""
        for _, _, job_id in self._unfinished():
            if job_id in skip:
                continue
            fd = self._lock(job_id)
            if fd is None:
                continue
            record = self._record(job_id)  # again, under the lock: another runner may have finished it meanwhile
            if record is not None and record["state"] not in FINISHED:
                if self.cancelled(job_id):
                    self.finish(record, CANCELLED)
                else:
                    return Claim(record, fd)
            os.close(fd)
        return None

    def _lock(self, job_id: str) -> int | None:
        """An flock on the job's lock file, or None when another runner holds it."""
        fd = os.open(self.directory / job_id / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd
