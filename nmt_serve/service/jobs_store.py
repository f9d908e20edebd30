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

Every file is written whole and renamed into place, so a reader (another worker, the same job after
a restart) never sees half of one. The chunks' bounds are fixed when the job is made, so whoever
resumes it sends exactly the chunks that have no file: none is lost, none translated twice. The lock
is an flock: the kernel drops it with the process that held it, so a job whose runner died is free to
be taken up again by any worker.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ID = re.compile(r"[0-9a-f]{32}")
QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
FINISHED = frozenset({DONE, FAILED, CANCELLED})
CHUNK_CHARS = 16_000  # a chunk closes at this many characters too (a few long texts make a chunk)


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


def _write(path: Path, value, durable: bool = True) -> None:
    """The JSON file whole or not at all: written beside it, renamed over it; durable: flushed to disk
    first (the chunks' results; the record's counts are made again from them on resume: tally)."""
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, separators=(",", ":"))
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(partial, path)


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

    def path(self, job_id: str) -> Path | None:
        """The job's directory, or None for anything that is not a job id (keeps paths out)."""
        return self.directory / job_id if ID.fullmatch(job_id) else None

    # ------------------------------------------------------------------ made by POST /v1/jobs
    def create(self, spec: dict, texts: list[str], chunk_texts: int, original: bytes | None = None) -> dict:
        """A new queued job: `spec` is what to do (source, target, format, options, ...); `original`, the
        uploaded file its texts were read from."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        job_id = secrets.token_hex(16)  # 128 random bits: knowing the id is what grants reading the job
        home = self.directory / job_id
        (home / "chunks").mkdir(parents=True)
        try:
            _write(home / "input.json", texts)
            if original is not None:
                (home / "original").write_bytes(original)
            now = time.time()
            record = dict(spec, id=job_id, state=QUEUED, total=len(texts), done=0, sentences=0, source_tokens=0, generated_tokens=0,
                          models=[], error=None, created_at=now, started_at=None, updated_at=now, finished_at=None,
                          resumed_at=None, done_at_resume=0, chunks=chunk_bounds(texts, chunk_texts))
            _write(home / "job.json", record)  # last: a directory without it is not a job yet
        except BaseException:
            # a job half written (a full disk) is no job, and nothing else would ever remove its directory
            shutil.rmtree(home, ignore_errors=True)
            raise
        return record

    # ------------------------------------------------------------------ read by any worker
    def read(self, job_id: str) -> dict | None:
        """The record, as a client sees it: a job asked to stop reads as cancelled at once, its progress
        as it was when asked (chunks in flight may still land before its runner stops; they are dropped)."""
        record = self._record(job_id)
        if record is not None and record["state"] not in FINISHED and self.cancelled(job_id):
            record.update(self._progress_when_cancelled(job_id), state=CANCELLED)
        return record

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
        writing a chunk and counting it left the count behind)."""
        done = self.done_chunks(record["id"])
        home = self.directory / record["id"] / "chunks"
        record.update(done=0, sentences=0, source_tokens=0, generated_tokens=0)
        for k in done:
            start, end = record["chunks"][k]
            payload = json.loads((home / f"{k:06d}.json").read_text(encoding="utf-8"))
            record["done"] += end - start
            for name in ("sentences", "source_tokens", "generated_tokens"):
                record[name] += payload[name]
        return done

    def original(self, job_id: str) -> bytes:
        return (self.directory / job_id / "original").read_bytes()

    def chunks(self, job_id: str) -> list[dict]:
        """Every chunk's results, in order (the job is done)."""
        home = self.directory / job_id / "chunks"
        count = len(self._record(job_id)["chunks"])
        return [json.loads((home / f"{k:06d}.json").read_text(encoding="utf-8")) for k in range(count)]

    def cancel(self, job_id: str) -> dict | None:
        """Ask the job to stop (its runner, whichever worker holds it, stops within a heartbeat); a job
        nobody runs is cancelled here and now."""
        record = self.read(job_id)
        if record is None or record["state"] in FINISHED:
            return record
        home = self.directory / job_id
        _write(home / "cancel", {"done": record["done"], "sentences": record["sentences"]}, durable=False)
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
        _write(self.directory / record["id"] / "job.json", record, durable=record["state"] != RUNNING)

    def write_chunk(self, job_id: str, k: int, results: dict) -> None:
        _write(self.directory / job_id / "chunks" / f"{k:06d}.json", results)

    def cancelled(self, job_id: str) -> bool:
        return (self.directory / job_id / "cancel").exists()

    def finish(self, record: dict, state: str, error: str | None = None) -> None:
        record.update(state=state, error=error, finished_at=time.time())
        if state == CANCELLED:  # its partial results are of no use to anyone
            record.update(self._progress_when_cancelled(record["id"]))
            shutil.rmtree(self.directory / record["id"] / "chunks", ignore_errors=True)
        self.write(record)

    def claim(self) -> Claim | None:
        """The oldest unfinished job that no runner holds, locked for this one; on the way, jobs finished
        more than ttl_s ago are removed."""
        if not self.directory.is_dir():
            return None
        now, waiting = time.time(), []
        for home in self.directory.iterdir():
            if not ID.fullmatch(home.name):
                continue
            record = self._record(home.name)
            if record is None:
                continue
            if record["state"] in FINISHED:
                if now - (record["finished_at"] or record["updated_at"]) > self.ttl_s:
                    shutil.rmtree(home, ignore_errors=True)
                continue
            waiting.append((record["created_at"], home.name))
        for _, job_id in sorted(waiting):
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
