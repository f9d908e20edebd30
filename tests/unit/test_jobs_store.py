"""The job store's files (service/jobs_store.py): a job is whole or absent."""
from __future__ import annotations

import pytest

def test_a_job_that_cannot_be_written_leaves_no_directory(tmp_path, monkeypatch):
    import nmt_serve.service.jobs_store as jobs_store

    store = jobs_store.JobStore(tmp_path, ttl_s=60)
    real_write = jobs_store.write_json

    def disk_full(path, value, durable=True):
        if path.name == "job.json":
            raise OSError(28, "No space left on device")
        real_write(path, value, durable)

    monkeypatch.setattr(jobs_store, "write_json", disk_full)
    with pytest.raises(OSError):
        store.create({"source": "de", "target": "en"}, ["Hallo."], chunk_texts=4)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(jobs_store, "write_json", real_write)
    record = store.create({"source": "de", "target": "en"}, ["Hallo."], chunk_texts=4)
    assert [p.name for p in tmp_path.iterdir()] == [record["id"]] and store.read(record["id"])["state"] == "queued"


def test_a_scan_reads_a_finished_jobs_record_once_and_sees_every_worker_remove_it(tmp_path, monkeypatch):
    import time

    from nmt_serve.service.jobs_store import DONE, JobStore

    store, other_worker = JobStore(tmp_path, ttl_s=3600), JobStore(tmp_path, ttl_s=3600)
    made = [store.create({"source": "de", "target": "en", "owner": ""}, ["Hallo."], chunk_texts=4) for _ in range(4)]
    for record in made[:3]:
        store.finish(record, DONE)
    assert store.counts()["done"] == 3 and store.counts()["queued"] == 1
    reads = []
    real_record = JobStore._record
    monkeypatch.setattr(JobStore, "_record", lambda self, job_id: reads.append(job_id) or real_record(self, job_id))
    # a finished record never changes: the scans (an idle runner's claim, the list, the metrics) read the
    # unfinished job's only
    claim = store.claim()
    assert claim.record["id"] == made[3]["id"]
    claim.release()
    assert store.counts() == {"queued": 1, "running": 0, "done": 3, "failed": 0, "cancelled": 0}
    assert [r["id"] for r in store.jobs(None, state="done", limit=10)[0]] == [r["id"] for r in reversed(made[:3])]
    assert set(reads) == {made[3]["id"]}
    # removed by another worker (DELETE): gone from this worker's scans too
    assert other_worker.remove(made[0]["id"]) is not None
    assert store.counts()["done"] == 2 and made[0]["id"] not in {r["id"] for r in store.jobs(None)[0]}
    # expiry goes by the record kept in memory: a job past its time is removed by the scan
    late = JobStore(tmp_path, ttl_s=0.05)
    late.counts()
    time.sleep(0.1)
    late.claim()  # (it takes the unfinished job; what matters here is the scan on its way)
    assert sorted(p.name for p in tmp_path.iterdir() if len(p.name) == 32) == [made[3]["id"]]
