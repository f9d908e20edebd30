"""The job store's files (service/jobs_store.py): a job is whole or absent."""
from __future__ import annotations

import pytest

def test_a_job_that_cannot_be_written_leaves_no_directory(tmp_path, monkeypatch):
    import nmt_serve.service.jobs_store as jobs_store

    store = jobs_store.JobStore(tmp_path, ttl_s=60)
    real_write = jobs_store._write

    def disk_full(path, value, durable=True):
        if path.name == "job.json":
            raise OSError(28, "No space left on device")
        real_write(path, value, durable)

    monkeypatch.setattr(jobs_store, "_write", disk_full)
    with pytest.raises(OSError):
        store.create({"source": "de", "target": "en"}, ["Hallo."], chunk_texts=4)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(jobs_store, "_write", real_write)
    record = store.create({"source": "de", "target": "en"}, ["Hallo."], chunk_texts=4)
    assert [p.name for p in tmp_path.iterdir()] == [record["id"]] and store.read(record["id"])["state"] == "queued"
