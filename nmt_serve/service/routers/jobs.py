"""POST /v1/jobs, GET /v1/jobs, GET /v1/jobs/{id}, GET /v1/jobs/{id}/result, DELETE /v1/jobs/{id}: many texts
translated in the background with progress (the store and the runner: jobs_store.py, jobs_runner.py).

With API keys on, a job is its key's: another key reads, lists and deletes none of it (404 as for no job);
the id alone (128 random bits) still reads it on a server without keys, where every client is the same one.

A POST with an Idempotency-Key header makes one job per key (for as long as the job is kept): sent again, with
the same request, it answers that job (Idempotent-Replayed: true), so a client that lost the answer (a timeout)
retries without making the job twice; with another request, 409. The key is the client's own: tied to its API
key where keys are on. The result with ?partial=true is there while the job runs (or after it failed): the
texts translated so far, null for the others (a file job: the file with the paragraphs done translated)."""
from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Header, Query, Request, Response, UploadFile
from pydantic import BaseModel, Field

from nmt_serve.service.dependencies import get_state, job_owner, seen_owner
from nmt_serve.service.errors import APIError, bad_request, documented_error
from nmt_serve.service.file_store import FILE_CONTENT
from nmt_serve.service.file_translation import attachment_headers, utf8_file
from nmt_serve.service.jobs_files import (
    FORMATS,
    extension_of,
    media_type,
    read_texts,
    submit_file,
    translated_file,
)
from nmt_serve.service.jobs_runner import JobRunner
from nmt_serve.service.jobs_store import DONE, FAILED, FINISHED, QUEUED, RUNNING
from nmt_serve.service.pipeline import AUTO, resolve_model, stored_glossary, terminology
from nmt_serve.service.routers.ids import path_id
from nmt_serve.service.schemas import (
    JobList,
    JobRequest,
    JobResult,
    JobState,
    JobStatus,
    Translation,
    Usage,
)
from nmt_serve.service.security import bearer_token
from nmt_serve.service.state import ServiceState

router = APIRouter(prefix="/v1", tags=["jobs"])  # access checked before: middleware.BodySizeLimit
JobId = path_id("job")


class PartialJobResult(BaseModel):
    """GET /v1/jobs/{id}/result?partial=true of a job that is not done: what it has so far."""

    id: str
    state: JobState = Field(description="queued, running or failed")
    done: int = Field(description="texts translated so far (the translations that are not null)")
    total: int
    model: str = Field(description="the models that translated, comma-separated")
    translations: list[Translation | None] = Field(description="one per text of q, in its order: null for a text not "
                                                               "translated yet")
    usage: Usage = Field(description="of the texts translated so far")


IdempotencyKey = Annotated[str, Header(alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$",
                                       description="one job per key (printable ASCII): the same request sent again with it "
                                                   "answers the job it made (Idempotent-Replayed: true) for as long as that "
                                                   "job is kept; another request with it, 409")]


def client_key(request: Request, state: ServiceState, key: str | None) -> str | None:
    """An Idempotency-Key, tied to the API key that sent it where keys are on (one client's key is not another's)."""
    if key is None:
        return None
    client = (bearer_token(request) or "") if state.keys.enabled else ""
    return f"{client}\n{key}"


def submitted(record: dict, response: Response) -> JobStatus:
    if record.get("replayed"):
        response.headers["Idempotent-Replayed"] = "true"
    return JobStatus.of(record)


NOT_FOUND = {404: documented_error("no such job (or it expired: job_ttl_s)", "not_found", "no job 5f0c9d3e8a7b41c2a1d4e6f8b9c0d1e2", "id")}
STORAGE = {503: {"description": "the models are still loading or the engine is restarting, or the jobs directory cannot be "
                                "written: retry (see Retry-After)"},
           507: documented_error("the jobs directory is full: retry later (see Retry-After)", "insufficient_storage",
                      "the jobs directory is full (No space left on device): retry later")}
SUBMIT = {400: {"description": "no model for the language pair, or a file that cannot be read as its extension says"},
          409: documented_error("the Idempotency-Key was given to another request", "idempotency_key_reused",
                     "this Idempotency-Key was given to another request (other texts or options): a new job needs a new key",
                     "Idempotency-Key"),
          **STORAGE}


def runner_of(request: Request) -> JobRunner:
    return request.app.state.jobs


async def read_job(runner: JobRunner, job_id: str, owner: str) -> dict:
    """The job's record; 404 where there is none, or where it is another key's (keys on): a key cannot
    tell another's job from none."""
    record = await asyncio.to_thread(runner.store.read, job_id)
    if record is None or record.get("owner") not in (owner, None, ""):
        raise APIError(404, "not_found", f"no job {job_id}", "id")
    return record


@router.get("/jobs", response_model=JobList)
async def list_jobs(request: Request, state: ServiceState = Depends(get_state),
                    job_state: Annotated[JobState | None, Query(alias="state", description="only the jobs in this state")] = None,
                    before: Annotated[str | None, Query(description="the id of the last job of the page before: the jobs "
                                                                    "made before it", pattern="^[0-9a-f]{32}$")] = None,
                    limit: Annotated[int, Query(ge=1, le=100, description="at most this many jobs")] = 20) -> JobList:
    """The jobs this API key made (on a server without keys: every job), the newest first: queued and
    running ones, and finished ones until they expire (job_ttl_s). A page ends with has_more; the next one
    is asked for with before=<its last job's id>. A `before` job that is gone (expired, deleted) gives an
    empty page."""
    records, more = await asyncio.to_thread(runner_of(request).store.jobs, seen_owner(state, request),
                                            job_state, before, limit)
    return JobList(jobs=[JobStatus.of(r) for r in records], has_more=more)


@router.post("/jobs", status_code=202, response_model=JobStatus,
             responses={**SUBMIT, 413: {"description": "more than max_job_texts texts, a text over max_chars_per_text, or a body over max_job_bytes"}})
async def create_job(body: JobRequest, request: Request, response: Response, idempotency_key: IdempotencyKey = None,
                     state: ServiceState = Depends(get_state)) -> JobStatus:
    state.limits.check_job_texts(body.q, "q")
    state.require_ready()
    options = state.limits.decode_options(body.beam_size, body.num_hypotheses, body.max_length, body.length_penalty, body.return_scores)
    stored = await stored_glossary(state, body.glossary_id, seen_owner(state, request), body.source, body.target)
    terminology(body.glossary, body.avoid, stored)  # refused now, not in every chunk
    glossary = [term.model_dump() for term in body.glossary or ()]
    record = await runner_of(request).submit(dict(source=body.source, target=body.target, format=body.format,
                                                  split_sentences=body.split_sentences, glossary=glossary, avoid=body.avoid or [],
                                                  glossary_id=body.glossary_id, owner=job_owner(state, request)),
                                             body.q, options, idempotency_key=client_key(request, state, idempotency_key))
    return submitted(record, response)


@router.post("/jobs/file", status_code=202, response_model=JobStatus,
             responses={**SUBMIT, 413: {"description": "a file over max_job_bytes, more than max_job_texts paragraphs (lines of a .txt), "
                                             "or one over max_chars_per_text"}})
async def create_file_job(request: Request, response: Response, file: UploadFile = File(description=f"the file: {', '.join(FORMATS)}"),
                          source: str = Form(min_length=1, description='source language code, or "auto" (the whole file is '
                                                                         "taken as one language)"),
                          target: str = Form(min_length=1), idempotency_key: IdempotencyKey = None,
                          glossary_id: str = Form("", pattern="^([0-9a-f]{32})?$", description="a stored glossary "
                                                         "(POST /v1/glossaries) for the file's direction"),
                          state: ServiceState = Depends(get_state)) -> JobStatus:
    """A document (one text per paragraph, its formatting kept) or a .txt file (one text per line) as a job; its
    result is the file translated."""
    name = file.filename or "file"
    if extension_of(name) not in FORMATS:
        raise bad_request(f"file format not supported ({extension_of(name) or 'no extension'}); supported: {', '.join(FORMATS)}", "file")
    data = await file.read()
    data = await asyncio.to_thread(utf8_file, state, name, data, source)  # a text format in its legacy encoding
    try:
        texts, format = await asyncio.to_thread(read_texts, name, data)
    except ValueError as exc:
        raise bad_request(f"the file cannot be read as {extension_of(name)}: {exc}", "file") from None
    state.limits.check_job_texts(texts, "file")  # before the language of all of its text is told
    state.require_ready()
    await stored_glossary(state, glossary_id, seen_owner(state, request), source, target)  # refused now
    if source == AUTO and any(t.strip() for t in texts):  # one language for the whole file, from all of its text
        model, detected = await asyncio.to_thread(resolve_model, state, AUTO, state.language(target), "\n".join(texts), "file")
        source = model.source if model is not None else detected.language
    record = await submit_file(state, runner_of(request), name=name, data=data, texts=texts, format=format, source=source,
                               target=target, idempotency_key=client_key(request, state, idempotency_key),
                               owner=job_owner(state, request), glossary_id=glossary_id or None)
    return submitted(record, response)


async def job(job_id: JobId, request: Request, state: ServiceState = Depends(get_state)) -> JobStatus:
    """GET: the job's state and progress. DELETE: cancel a queued or running job (its chunks in the engine are
    dropped); remove a finished one with its results (from then on 404)."""
    runner = runner_of(request)
    record = await read_job(runner, job_id, job_owner(state, request))
    if request.method == "DELETE":
        if record["state"] in FINISHED:
            removed = await runner.remove(job_id)
            return JobStatus.of(removed or record)
        return JobStatus.of(await runner.cancel(job_id))
    return JobStatus.of(record)


router.add_api_route("/jobs/{job_id:hex_id}", job, methods=["GET"], response_model=JobStatus, responses=NOT_FOUND, name="job_status",
                     summary="Job Status", description="The job's state and progress.")
router.add_api_route("/jobs/{job_id:hex_id}", job, methods=["DELETE"], response_model=JobStatus, responses={**NOT_FOUND, **STORAGE},
                     name="cancel_job",
                     summary="Cancel or Delete Job", description="Cancel a queued or running job (its chunks in the engine are "
                                                                 "dropped; it is kept, cancelled, until it expires after "
                                                                 "job_ttl_s); remove a finished one (done, failed or "
                                                                 "cancelled) and its results now: its expires_at is the "
                                                                 "time of removal, and from then on it is 404.")


@router.get("/jobs/{job_id:hex_id}/result", response_model=JobResult | PartialJobResult, response_model_exclude_none=True,
            responses={**NOT_FOUND, 409: documented_error("the job is not done (queued, running, failed or cancelled; with partial=true: "
                                               "cancelled)", "job_not_done", "the job is running", "id"),
                       200: {"description": "the translations (with partial=true, of a job not done: PartialJobResult); "
                                            "for a file job, the file translated",
                             "content": FILE_CONTENT}})
async def job_result(job_id: JobId, request: Request,
                     partial: Annotated[bool, Query(description="a job that is not done yet (queued, running, failed): what it "
                                                                "has so far, null for each text not translated yet (a file "
                                                                "job: the file, its paragraphs not translated yet as they "
                                                                "are)")] = False,
                     state: ServiceState = Depends(get_state)) -> JobResult | PartialJobResult:
    runner = runner_of(request)
    record = await read_job(runner, job_id, job_owner(state, request))
    so_far = partial and record["state"] in (QUEUED, RUNNING, FAILED)
    if record["state"] != DONE and not so_far:
        hint = "; ?partial=true gives what it has so far" if record["state"] in (QUEUED, RUNNING, FAILED) else ""
        raise APIError(409, "job_not_done", f"the job is {record['state']}" + (f": {record['error']}" if record["error"] else "") + hint,
                       "id")
    try:  # its files, read while DELETE may remove them
        if record.get("file_name"):
            out, translated = await asyncio.to_thread(translated_file, runner.store, record, so_far)
            return Response(translated, media_type=media_type(out), headers=attachment_headers(out))
        if so_far:
            return await asyncio.to_thread(result_so_far, runner, record)
        chunks = await asyncio.to_thread(runner.store.chunks, record)
    except FileNotFoundError:
        raise APIError(404, "not_found", f"no job {job_id} (it was removed)", "id") from None
    return JobResult(id=job_id, model=",".join(record["models"]),
                     translations=[Translation(**t) for chunk in chunks for t in chunk["translations"]],
                     usage=Usage(source_tokens=record["source_tokens"], generated_tokens=record["generated_tokens"],
                                 sentences=record["sentences"]))


def result_so_far(runner: JobRunner, record: dict) -> PartialJobResult:
    """The chunks written so far (the counts made from them, not from the record, which may lag them)."""
    translations: list[Translation | None] = []
    usage = Usage(source_tokens=0, generated_tokens=0, sentences=0)
    for (start, end), chunk in zip(record["chunks"], runner.store.chunks_so_far(record)):
        if chunk is None:
            translations += [None] * (end - start)
            continue
        translations += [Translation(**t) for t in chunk["translations"]]
        for name in ("source_tokens", "generated_tokens", "sentences"):
            setattr(usage, name, getattr(usage, name) + chunk[name])
    return PartialJobResult(id=record["id"], state=record["state"], done=sum(t is not None for t in translations),
                            total=record["total"], model=",".join(record["models"]), translations=translations, usage=usage)
