"""POST /v1/jobs, GET /v1/jobs/{id}, GET /v1/jobs/{id}/result, DELETE /v1/jobs/{id}: many texts translated
in the background with progress (the store and the runner: jobs_store.py, jobs_runner.py)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, File, Form, Request, Response, UploadFile

from nmt_serve.service.dependencies import get_state, require_api_key
from nmt_serve.service.errors import APIError, bad_request
from nmt_serve.service.file_translation import attachment_headers
from nmt_serve.service.jobs_files import (
    FORMATS,
    extension_of,
    media_type,
    read_texts,
    submit_file,
    translated_file,
)
from nmt_serve.service.jobs_runner import JobRunner
from nmt_serve.service.jobs_store import DONE
from nmt_serve.service.pipeline import AUTO, resolve_model, terminology
from nmt_serve.service.schemas import (
    JobRequest,
    JobResult,
    JobStatus,
    Translation,
    Usage,
)
from nmt_serve.service.state import ServiceState

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[Depends(require_api_key)])


def error(description: str, type_: str, message: str, param: str | None = None) -> dict:
    """A documented error response with its example (docs.py gives it the error schema)."""
    return {"description": description, "content": {"application/json": {
        "example": {"error": {"type": type_, "message": message, "param": param}}}}}


NOT_FOUND = {404: error("no such job (or it expired: job_ttl_s)", "not_found", "no job 5f0c9d3e8a7b41c2a1d4e6f8b9c0d1e2", "id")}
SUBMIT = {400: {"description": "no model for the language pair, or a file that cannot be read as its extension says"},
          503: {"description": "the models are still loading or the engine is restarting: retry (see Retry-After)"}}


def runner_of(request: Request) -> JobRunner:
    return request.app.state.jobs


async def read_job(runner: JobRunner, job_id: str) -> dict:
    record = await asyncio.to_thread(runner.store.read, job_id)
    if record is None:
        raise APIError(404, "not_found", f"no job {job_id}", "id")
    return record


@router.post("/jobs", status_code=202, response_model=JobStatus,
             responses={**SUBMIT, 413: {"description": "more than max_job_texts texts, a text over max_chars_per_text, or a body over max_job_bytes"}})
async def create_job(body: JobRequest, request: Request, state: ServiceState = Depends(get_state)) -> JobStatus:
    state.limits.check_job_texts(body.q, "q")
    state.require_ready()
    options = state.limits.decode_options(body.beam_size, body.num_hypotheses, body.max_length, body.length_penalty, body.return_scores)
    terminology(body.glossary, body.avoid)  # refused now, not in every chunk
    glossary = [term.model_dump() for term in body.glossary or ()]
    record = await runner_of(request).submit(dict(source=body.source, target=body.target, format=body.format,
                                                  split_sentences=body.split_sentences, glossary=glossary, avoid=body.avoid or []),
                                             body.q, options)
    return JobStatus.of(record)


@router.post("/jobs/file", status_code=202, response_model=JobStatus,
             responses={**SUBMIT, 413: {"description": "a file over max_job_bytes, more than max_job_texts paragraphs (lines of a .txt), "
                                             "or one over max_chars_per_text"}})
async def create_file_job(request: Request, file: UploadFile = File(description=f"the file: {', '.join(FORMATS)}"),
                          source: str = Form(min_length=1, description='source language code, or "auto" (the whole file is '
                                                                         "taken as one language)"),
                          target: str = Form(min_length=1), state: ServiceState = Depends(get_state)) -> JobStatus:
    """A document (one text per paragraph, its formatting kept) or a .txt file (one text per line) as a job; its
    result is the file translated."""
    name = file.filename or "file"
    if extension_of(name) not in FORMATS:
        raise bad_request(f"file format not supported ({extension_of(name) or 'no extension'}); supported: {', '.join(FORMATS)}", "file")
    data = await file.read()
    try:
        texts, format = await asyncio.to_thread(read_texts, name, data)
    except ValueError as exc:
        raise bad_request(f"the file cannot be read as {extension_of(name)}: {exc}", "file") from None
    state.limits.check_job_texts(texts, "file")  # before the language of all of its text is told
    state.require_ready()
    if source == AUTO and any(t.strip() for t in texts):  # one language for the whole file, from all of its text
        model, detected = await asyncio.to_thread(resolve_model, state, AUTO, state.language(target), "\n".join(texts), "file")
        source = model.source if model is not None else detected.language
    return JobStatus.of(await submit_file(state, runner_of(request), name=name, data=data, texts=texts, format=format,
                                          source=source, target=target))


async def job(job_id: str, request: Request) -> JobStatus:
    """GET: the job's state and progress. DELETE: cancel a queued or running job (its chunks in the engine are
    dropped); a finished job is left as it is (it expires after job_ttl_s)."""
    runner = runner_of(request)
    await read_job(runner, job_id)
    if request.method == "DELETE":
        return JobStatus.of(await asyncio.to_thread(runner.store.cancel, job_id))
    return JobStatus.of(await read_job(runner, job_id))


# One route serves both methods, so that a method the path does not take gets a 405 whose Allow names both
# (with a route per method, the first one's 405 names only its own); the schema lists them one by one, each
# with an operation id of its own (FastAPI gives a route of several methods one id for all)
router.add_api_route("/jobs/{job_id}", job, methods=["GET", "DELETE"], response_model=JobStatus, include_in_schema=False)
router.add_api_route("/jobs/{job_id}", job, methods=["GET"], response_model=JobStatus, responses=NOT_FOUND, name="job_status",
                     summary="Job Status", description="The job's state and progress.")
router.add_api_route("/jobs/{job_id}", job, methods=["DELETE"], response_model=JobStatus, responses=NOT_FOUND, name="cancel_job",
                     summary="Cancel Job", description="Cancel a queued or running job (its chunks in the engine are dropped); "
                                                       "a finished job is left as it is (it expires after job_ttl_s).")


@router.get("/jobs/{job_id}/result", response_model=JobResult, response_model_exclude_none=True,
            responses={**NOT_FOUND, 409: error("the job is not done (queued, running, failed or cancelled)", "job_not_done", "the job is running", "id"),
                       200: {"description": "the translations; for a file job, the file translated",
                             "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def job_result(job_id: str, request: Request) -> JobResult:
    runner = runner_of(request)
    record = await read_job(runner, job_id)
    if record["state"] != DONE:
        raise APIError(409, "job_not_done", f"the job is {record['state']}" + (f": {record['error']}" if record["error"] else ""), "id")
    if record.get("file_name"):
        out, translated = await asyncio.to_thread(translated_file, runner.store, record)
        return Response(translated, media_type=media_type(out), headers=attachment_headers(out))
    chunks = await asyncio.to_thread(runner.store.chunks, job_id)
    return JobResult(id=job_id, model=",".join(record["models"]),
                     translations=[Translation(**t) for chunk in chunks for t in chunk["translations"]],
                     usage=Usage(source_tokens=record["source_tokens"], generated_tokens=record["generated_tokens"],
                                 sentences=record["sentences"]))
