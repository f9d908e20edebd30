"""What the chart's shared jobs volume (jobs.existingClaim, several replicas on one directory) relies on: the
job store works for separate processes on one directory, as the API workers of one pod already use it. A
job made by one process is read by another; one that a process runs is not taken by another; and one whose
process died (a pod gone) is taken up by the next that looks, from its written chunks.

Here the processes share a local filesystem; on a cluster the volume has to give the same (atomic rename,
flock() across nodes: values.yaml, jobs)."""
from __future__ import annotations

import multiprocessing
import os
import signal

from nmt_serve.service.jobs_store import CANCELLED, QUEUED, JobStore

SPEC = {"source": "de", "target": "en", "format": "text", "split_sentences": True, "options": {}}


def make_job(directory: str, out) -> None:
    """'Pod A': posts a job."""
    out.send(JobStore(directory, ttl_s=60).create(SPEC, ["Ein Hund rennt.", "Zwei Kinder spielen."], chunk_texts=1)["id"])


def run_job(directory: str, out, go) -> None:
    """'Pod A': takes the job, writes its first chunk, then keeps it until it is killed."""
    store = JobStore(directory, ttl_s=60)
    claim = store.claim()
    store.write_chunk(claim.record["id"], 0, {"translations": [{"text": "A dog runs."}], "sentences": 1, "source_tokens": 4,
                                              "generated_tokens": 4})
    out.send(claim.record["id"])
    go.recv()  # held until killed: the kernel drops its lock with it


def test_two_processes_on_one_jobs_directory_share_the_jobs_and_run_each_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    directory = str(tmp_path / "jobs")
    here = JobStore(directory, ttl_s=60)  # 'pod B'

    receive, send = ctx.Pipe(duplex=False)
    maker = ctx.Process(target=make_job, args=(directory, send))
    maker.start()
    job_id = receive.recv()
    maker.join(30)
    assert here.read(job_id)["state"] == QUEUED  # made on A, read on B

    go_receive, go_send = ctx.Pipe(duplex=False)
    runner = ctx.Process(target=run_job, args=(directory, send, go_receive))
    runner.start()
    try:
        assert receive.recv() == job_id
        assert here.claim() is None  # A runs it: B does not take it too
        os.kill(runner.pid, signal.SIGKILL)  # A goes away, holding it
        runner.join(30)
        claim = here.claim()  # B takes it up, from the chunk A wrote
        assert claim is not None and claim.record["id"] == job_id
        assert here.tally(claim.record) == {0}
        claim.release()
        # nobody runs it now: a cancel asked on B ends it at once, for every process that reads it
        assert here.cancel(job_id)["state"] == CANCELLED
        assert JobStore(directory, ttl_s=60)._record(job_id)["state"] == CANCELLED
    finally:
        if runner.is_alive():
            runner.kill()
            runner.join(30)
