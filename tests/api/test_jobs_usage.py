"""Jobs as their users meet them: jobs posted together take turns (a short job does not wait for a long one
to end), a full or unwritable jobs directory is said so (507/503) and does not stop the jobs for good (the
runner goes on, and the job once there is room), a finished job says when it expires, and is gone then, an
Idempotency-Key makes a POST safe to send again, and the results so far are there before the job is done.

The machinery of test_jobs: client_for serves the shipped models, Chunks wraps the runner's
translate_texts to count the texts sent and to hold chunks back."""
from __future__ import annotations

import asyncio
import errno
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from test_jobs import FAST, TEXTS, Chunks, client_for, ready, real_translate, reference, wait_for

from nmt_serve.service import jobs_runner, jobs_store
from nmt_serve.service.errors import APIError

ENDED = ("done", "failed", "cancelled")


class Gates(Chunks):
    """Chunks, with a gate of its own for each call that `gates` names (by its number, from 1)."""

    def __init__(self, gates: dict[int, threading.Event]):
        super().__init__()
        self.gates = gates

    async def __call__(self, state, request, **kw):
        self.sent.append(list(kw["texts"]))
        gate = self.gates.get(len(self.sent))
        while gate is not None and not gate.is_set():
            await asyncio.sleep(0.01)
        results = await real_translate(state, request, **kw)
        self.translated.update(kw["texts"])
        return results


def test_a_short_job_posted_behind_a_long_one_runs_before_the_long_one_ends(models_dir, tmp_path, monkeypatch):
    """One runner, two jobs: the long one gives its turn up after a slice (0 s here) while the short one
    waits, so the short one ends first; the long one then goes on from where it was, nothing lost or twice."""
    monkeypatch.setattr(jobs_runner, "SLICE_S", 0.0, raising=False)  # (raising: the test runs on the code before it too)
    posted, short_ran = threading.Event(), threading.Event()
    # the long job's first two chunks wait until the short job is posted; the third chunk sent waits too
    chunks = Gates({1: posted, 2: posted, 3: short_ran})
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path) as c:
        want = reference(ready(c), TEXTS)
        long = c.post("/v1/jobs", json={"q": TEXTS, **FAST}).json()["id"]  # 10 chunks of 4
        wait_for(c, long, lambda s: s["state"] == "running")
        short = c.post("/v1/jobs", json={"q": TEXTS[:4], **FAST}).json()["id"]
        posted.set()
        running = wait_for(c, short, lambda s: s["state"] != "queued", timeout=30)
        assert running["state"] == "running" and chunks.sent[2] == TEXTS[:4]  # the short job's chunk is the third sent
        # the long job waits for its next turn: queued again, its progress and started_at kept
        waiting = c.get(f"/v1/jobs/{long}").json()
        assert waiting["state"] == "queued" and waiting["done"] == 8 and waiting["started_at"] is not None, waiting
        short_ran.set()
        ended = wait_for(c, short, lambda s: s["state"] in ENDED, timeout=30)
        assert ended["state"] == "done", ended
        done = wait_for(c, long, lambda s: s["state"] in ENDED)
        assert done["finished_at"] > ended["finished_at"]
        assert done["state"] == "done" and done["done"] == 40
        assert [t["text"] for t in c.get(f"/v1/jobs/{long}/result").json()["translations"]] == want
        assert [t["text"] for t in c.get(f"/v1/jobs/{short}/result").json()["translations"]] == want[:4]
    # the long job's texts each sent once: the turn given up lost nothing and sent nothing twice
    assert chunks.translated == Counter(TEXTS) + Counter(TEXTS[:4])


def test_a_job_that_cannot_be_written_is_refused_with_the_reason(models_dir, tmp_path, monkeypatch):
    """Not a 500 without a word: a full disk is 507, a jobs directory that cannot be written 503, both with
    Retry-After and the reason (not the server's paths); a cancel that cannot be written too."""
    (tmp_path / "a-file").write_text("not a directory")
    with client_for(models_dir, tmp_path / "a-file" / "jobs") as c:
        refused = ready(c).post("/v1/jobs", json={"q": TEXTS[:2], **FAST})
        assert refused.status_code == 503 and refused.headers["retry-after"], refused.text
        error = refused.json()["error"]
        assert error["type"] == "jobs_unavailable" and "cannot be written" in error["message"], error
        assert str(tmp_path) not in error["message"]
        refused = c.post("/v1/jobs/file", files={"file": ("a.txt", b"Ein Hund rennt.")}, data={"source": "de", "target": "en"})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "jobs_unavailable", refused.text
    real_write = jobs_store.write_json
    full = {"on": False}

    def write(path, value, durable=True):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, value, durable)

    monkeypatch.setattr(jobs_store, "write_json", write)
    chunks = Chunks(hold=lambda n: True)
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path / "jobs") as c:
        job = ready(c).post("/v1/jobs", json={"q": TEXTS[:8], **FAST}).json()["id"]
        full["on"] = True
        refused = c.post("/v1/jobs", json={"q": TEXTS[:2], **FAST})
        assert refused.status_code == 507 and refused.headers["retry-after"], refused.text
        error = refused.json()["error"]
        assert error["type"] == "insufficient_storage" and "full" in error["message"] and "No space left" in error["message"]
        cancel = c.delete(f"/v1/jobs/{job}")
        assert cancel.status_code == 507 and cancel.json()["error"]["type"] == "insufficient_storage", cancel.text
        assert len([p for p in (tmp_path / "jobs").iterdir() if p.name != job]) == 0  # nothing half written left
        full["on"] = False
        chunks.gate.set()


def test_a_full_disk_pauses_a_running_job_and_it_goes_on_once_there_is_room(models_dir, tmp_path, monkeypatch):
    """A chunk whose results cannot be written (ENOSPC) neither fails the job nor stops the runner: the job
    stops where it is, is taken up again after DISK_RETRY_S, and ends done once the disk has room; the
    runner serves the next job as before."""
    monkeypatch.setattr(jobs_runner, "DISK_RETRY_S", 0.2, raising=False)
    real_write = jobs_store.write_json
    full = {"on": False, "refused": 0}

    def write(path, value, durable=True):
        if full["on"]:
            full["refused"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, value, durable)

    monkeypatch.setattr(jobs_store, "write_json", write)
    chunks = Chunks(hold=lambda n: n >= 3)  # two chunks land; the next two wait until the disk is full
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path) as c:
        want = reference(ready(c), TEXTS)
        job = c.post("/v1/jobs", json={"q": TEXTS, **FAST}).json()["id"]
        wait_for(c, job, lambda s: s["done"] == 8)
        full["on"] = True
        chunks.gate.set()  # the chunks in flight are translated; their results cannot be written
        deadline = time.time() + 30
        while full["refused"] < 6:  # the runner keeps trying (the chunk, the record, each time it takes the job up)
            assert time.time() < deadline, full
            time.sleep(0.05)
        status = c.get(f"/v1/jobs/{job}").json()
        assert status["state"] in ("running", "queued") and status["error"] is None, status  # not failed
        full["on"] = False
        done = wait_for(c, job, lambda s: s["state"] in ENDED, timeout=30)
        assert done["state"] == "done" and done["done"] == 40, done
        assert [t["text"] for t in c.get(f"/v1/jobs/{job}/result").json()["translations"]] == want
        other = c.post("/v1/jobs", json={"q": TEXTS[:4], **FAST}).json()["id"]  # the runner still serves
        assert wait_for(c, other, lambda s: s["state"] in ENDED, timeout=30)["state"] == "done"
    assert set(chunks.translated) == set(TEXTS)
    assert not list(tmp_path.glob(f"{job}/**/.*.partial"))  # the failed writes left nothing behind


def test_a_finished_job_says_when_it_expires_and_is_gone_then(models_dir, tmp_path, monkeypatch):
    """expires_at: finished_at + job_ttl_s (null before the job ends); past it the job and its result are
    404 at once, even while the runner is busy with another job and has not removed it yet."""
    TTL = 5  # seconds: room for a busy machine between the job's end and the first reads
    chunks = Chunks(hold=lambda n: n >= 2)  # the first job's chunk goes through; the second job's wait
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path, job_ttl_s=TTL) as c:
        created = ready(c).post("/v1/jobs", json={"q": TEXTS[:4], **FAST}).json()
        job = created["id"]
        done = wait_for(c, job, lambda s: s["state"] in ENDED)
        assert c.get(f"/v1/jobs/{job}/result").status_code == 200
        busy = c.post("/v1/jobs", json={"q": TEXTS[4:12], **FAST}).json()["id"]
        running = wait_for(c, busy, lambda s: s["state"] == "running")
        time.sleep(max(0.0, done["finished_at"] + TTL - time.time()) + 0.2)
        for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/result"):
            gone = c.get(path)
            assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found", (path, gone.text)
        assert created.get("expires_at", "absent") is None and running.get("expires_at", "absent") is None
        assert done["state"] == "done" and done.get("expires_at") == done["finished_at"] + TTL
        cancelled = c.delete(f"/v1/jobs/{busy}").json()
        assert cancelled["state"] == "cancelled"
        chunks.gate.set()
        stopped = wait_for(c, busy, lambda s: s["finished_at"] is not None)
        assert stopped.get("expires_at") == stopped["finished_at"] + TTL


def test_an_idempotency_key_makes_one_job_however_often_it_is_sent(models_dir, tmp_path):
    """A client that lost the answer to its POST (a timeout) sends it again with the same Idempotency-Key
    and gets the job it made, not a second one; at once from several threads too. The same key with
    another request is 409; a key is the client's own (tied to its API key), and free again once its job
    has expired."""
    body = {"q": TEXTS[:6], **FAST}
    with client_for(models_dir, tmp_path / "open") as c:
        first = ready(c).post("/v1/jobs", json=body, headers={"Idempotency-Key": "batch-0001"})
        assert first.status_code == 202 and "idempotent-replayed" not in first.headers, first.text
        job = first.json()["id"]
        again = c.post("/v1/jobs", json=body, headers={"Idempotency-Key": "batch-0001"})
        assert again.status_code == 202 and again.json()["id"] == job and again.headers["idempotent-replayed"] == "true"
        with ThreadPoolExecutor(4) as pool:  # sent at once: one of them makes the job, the others get it
            ids = set(pool.map(lambda _: c.post("/v1/jobs", json=body, headers={"Idempotency-Key": "batch-0002"}).json()["id"],
                               range(4)))
        assert len(ids) == 1 and ids != {job}
        other = c.post("/v1/jobs", json={**body, "q": TEXTS[6:12]}, headers={"Idempotency-Key": "batch-0001"})
        assert other.status_code == 409, other.text
        assert other.json()["error"]["type"] == "idempotency_key_reused" and other.json()["error"]["param"] == "Idempotency-Key"
        assert c.post("/v1/jobs", json=body).json()["id"] not in ids | {job}  # without a key: a new job each time
        assert c.post("/v1/jobs", json=body, headers={"Idempotency-Key": "with space"}).status_code == 422
        file = {"file": ("story.txt", "\n".join(TEXTS[:3]).encode())}
        made = {c.post("/v1/jobs/file", files=file, data={"source": "de", "target": "en"}, headers={"Idempotency-Key": "file-1"}).json()["id"]
                for _ in range(2)}
        assert len(made) == 1
        wait_for(c, job, lambda s: s["state"] == "done")
        assert c.post("/v1/jobs", json=body, headers={"Idempotency-Key": "batch-0001"}).json()["state"] == "done"  # still that job
    jobs = [p for p in (tmp_path / "open").iterdir() if p.name != "keys"]
    assert len(jobs) == 4  # batch-0001, batch-0002, the one without a key, file-1
    with client_for(models_dir, tmp_path / "keyed", api_keys="alice-key,bob-key", job_ttl_s=5) as c:  # 5 s: a busy machine too
        ready(c)
        alice, bob = ({"Authorization": f"Bearer {k}", "Idempotency-Key": "nightly"} for k in ("alice-key", "bob-key"))
        mine = c.post("/v1/jobs", json=body, headers=alice).json()["id"]
        assert c.post("/v1/jobs", json=body, headers=bob).json()["id"] != mine  # bob's key is not alice's
        assert c.post("/v1/jobs", json=body, headers=alice).json()["id"] == mine
        c.headers["Authorization"] = "Bearer alice-key"  # (for wait_for)
        done = wait_for(c, mine, lambda s: s["state"] == "done")
        time.sleep(max(0.0, done["finished_at"] + 5 - time.time()) + 0.2)
        fresh = c.post("/v1/jobs", json=body, headers=alice)  # its job has expired: the key makes a new one
        assert fresh.status_code == 202 and fresh.json()["id"] != mine and "idempotent-replayed" not in fresh.headers


class Failing(Gates):
    """Gates, and every call past `fail_from` fails as the engine would not mend by sending it again."""

    def __init__(self, gates, fail_from: int):
        super().__init__(gates)
        self.fail_from = fail_from

    async def __call__(self, state, request, **kw):
        if len(self.sent) + 1 >= self.fail_from:
            self.sent.append(list(kw["texts"]))
            gate = self.gates.get(len(self.sent))
            while gate is not None and not gate.is_set():
                await asyncio.sleep(0.01)
            raise APIError(500, "internal_error", "the model broke")
        return await super().__call__(state, request, **kw)


def test_the_results_so_far_are_there_while_a_job_runs_and_after_it_failed(models_dir, tmp_path, monkeypatch):
    """?partial=true: the texts translated so far in their places, null for the others, and the usage of
    those done; a job that failed half way keeps what it did. A file job: the file with the paragraphs
    done translated and the others as they are. Without it (and for a cancelled job) 409 as before."""
    go_on = threading.Event()
    chunks = Failing({3: go_on, 4: go_on}, fail_from=3)  # two chunks land; the next two wait, then fail
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path) as c:
        want = reference(ready(c), TEXTS[:20])
        job = c.post("/v1/jobs", json={"q": TEXTS[:20], **FAST}).json()["id"]
        running = wait_for(c, job, lambda s: s["done"] == 8)
        assert c.get(f"/v1/jobs/{job}/result").status_code == 409
        so_far = c.get(f"/v1/jobs/{job}/result", params={"partial": "true"})
        assert so_far.status_code == 200, so_far.text
        result = so_far.json()
        assert (result["id"], result["state"], result["done"], result["total"]) == (job, "running", 8, 20)
        assert [t["text"] for t in result["translations"][:8]] == want[:8] and result["translations"][8:] == [None] * 12
        assert result["usage"]["sentences"] == running["sentences_done"] and result["model"] == "de-en"
        go_on.set()
        failed = wait_for(c, job, lambda s: s["state"] in ENDED)
        assert failed["state"] == "failed" and "the model broke" in failed["error"]
        kept = c.get(f"/v1/jobs/{job}/result?partial=true").json()
        assert kept["state"] == "failed" and kept["done"] == 8 and [t["text"] for t in kept["translations"][:8]] == want[:8]

        lines = TEXTS[20:28]
        held = Gates({2: threading.Event()})  # the file's second chunk waits
        monkeypatch.setattr(jobs_runner, "translate_texts", held)
        plain = c.post("/v1/translate", json={"text": lines[:4], "source": "de", "target": "en"}).json()["translations"]
        created = c.post("/v1/jobs/file", files={"file": ("brief.txt", "\n".join(lines).encode())}, data={"source": "de", "target": "en"})
        file_job = created.json()["id"]
        wait_for(c, file_job, lambda s: s["done"] == 4)
        half = c.get(f"/v1/jobs/{file_job}/result?partial=true")
        assert half.status_code == 200 and "brief_en.txt" in half.headers["content-disposition"]
        assert half.content.decode().split("\n") == [t["text"] for t in plain] + lines[4:]
        assert c.delete(f"/v1/jobs/{file_job}").json()["state"] == "cancelled"
        gone = c.get(f"/v1/jobs/{file_job}/result?partial=true")
        assert gone.status_code == 409 and gone.json()["error"]["type"] == "job_not_done"
        held.gates[2].set()
