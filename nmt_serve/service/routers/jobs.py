"""POST /v1/jobs, GET /v1/jobs/{id}, GET /v1/jobs/{id}/result, DELETE /v1/jobs/{id}: many texts translated
in the background with progress (the store and the runner: jobs_store.py, jobs_runner.py)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from nmt_serve.service.dependencies import get_state, require_api_key
from nmt_serve.service.errors import APIError, too_large
from nmt_serve.service.jobs_runner import JobRunner
from nmt_serve.service.jobs_store import DONE, RUNNING
from nmt_serve.service.schemas import JobRequest, JobResult, JobStatus, Translation, Usage
from nmt_serve.service.state import ServiceState

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[Depends(require_api_key)])
NOT_FOUND = {404: {"description": "no such job (or it expired: job_ttl_s)"}}


def runner_of(request: Request) -> JobRunner:
    return request.app.state.jobs


def status_of(record: dict) -> JobStatus:
    done, total = record["done"], record["total"]
    eta = None
    if record["state"] == RUNNING and record["resumed_at"]:
        rate = (done - record["done_at_resume"]) / max(record["updated_at"] - record["resumed_at"], 1e-9)
        eta = round((total - done) / rate, 1) if rate > 0 else None
    return JobStatus(id=record["id"], state=record["state"], done=done, total=total, sentences_done=record["sentences"],
                     percent=round(100.0 * done / total, 2) if total else 100.0, eta_seconds=eta, created_at=record["created_at"],
                     started_at=record["started_at"], updated_at=record["updated_at"], finished_at=record["finished_at"],
                     error=record["error"])


async def read_job(runner: JobRunner, job_id: str) -> dict:
    record = await asyncio.to_thread(runner.store.read, job_id)
    if record is None:
        raise APIError(404, "not_found", f"no job {job_id}", "id")
    return record


@router.post("/jobs", status_code=202, response_model=JobStatus,
             responses={413: {"description": "more than max_job_texts texts, a text over max_chars_per_text, or a body over max_job_bytes"}})
async def create_job(body: JobRequest, request: Request, state: ServiceState = Depends(get_state)) -> JobStatus:
    s = state.settings
    if len(body.q) > s.max_job_texts:
        raise too_large(f"{len(body.q)} texts in one job; the limit is {s.max_job_texts} (max_job_texts)", "q")
    for i, text in enumerate(body.q):
        if len(text) > s.max_chars_per_text:
            raise too_large(f"text {i} has {len(text)} characters; the limit is {s.max_chars_per_text}", "q")
    state.require_ready()
    if body.source != "auto":  # a wrong pair is refused now, not when the job runs
        state.model_for(body.source, body.target)
    options = state.limits.decode_options(body.beam_size, body.num_hypotheses, body.max_length, body.length_penalty, body.return_scores)
    spec = dict(source=body.source, target=body.target, format=body.format, split_sentences=body.split_sentences,
                options=dict(beam_size=options.beam_size, num_hypotheses=options.num_hypotheses, max_length=options.max_length,
                             length_penalty=options.length_penalty, return_scores=options.return_scores))
    runner = runner_of(request)
    record = await asyncio.to_thread(runner.store.create, spec, body.q, s.job_chunk_texts)
    runner.wake()
    return status_of(record)


@router.get("/jobs/{job_id}", response_model=JobStatus, responses=NOT_FOUND)
async def job_status(job_id: str, request: Request) -> JobStatus:
    return status_of(await read_job(runner_of(request), job_id))


@router.get("/jobs/{job_id}/result", response_model=JobResult, response_model_exclude_none=True,
            responses={**NOT_FOUND, 409: {"description": "the job is not done (queued, running, failed or cancelled)"}})
async def job_result(job_id: str, request: Request) -> JobResult:
    runner = runner_of(request)
    record = await read_job(runner, job_id)
    if record["state"] != DONE:
        raise APIError(409, "job_not_done", f"the job is {record['state']}" + (f": {record['error']}" if record["error"] else ""), "id")
    chunks = await asyncio.to_thread(runner.store.chunks, job_id)
    return JobResult(id=job_id, model=",".join(record["models"]),
                     translations=[Translation(**t) for chunk in chunks for t in chunk["translations"]],
                     usage=Usage(source_tokens=record["source_tokens"], generated_tokens=record["generated_tokens"],
                                 sentences=record["sentences"]))


@router.delete("/jobs/{job_id}", response_model=JobStatus, responses=NOT_FOUND)
async def cancel_job(job_id: str, request: Request) -> JobStatus:
    """Cancel a queued or running job (its chunks in the engine are dropped); a finished job is left as it is."""
    runner = runner_of(request)
    await read_job(runner, job_id)
    record = await asyncio.to_thread(runner.store.cancel, job_id)
    return status_of(record)
