"""Whose jobs are whose: GET /v1/jobs lists the jobs of the caller's API key (every job on a server without
keys), the newest first, a page at a time; another key's job is 404 to read, to fetch the result of or to
delete; DELETE of a finished job removes it and its results at once (its Idempotency-Key is free again);
/metrics counts the jobs kept by state and the texts jobs translated.

The machinery of test_jobs: client_for serves the test models, wait_for polls a job."""
from __future__ import annotations

from test_jobs import FAST, TEXTS, client_for, ready, wait_for

ENDED = ("done", "failed", "cancelled")
ALICE, BOB = ({"Authorization": f"Bearer {k}"} for k in ("alice-key", "bob-key"))


def post(c, texts, headers, **extra):
    r = c.post("/v1/jobs", json={"q": texts, **FAST}, headers={**headers, **extra})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def ended(c, job, headers):
    c.headers.update(headers)
    try:
        return wait_for(c, job, lambda s: s["state"] in ENDED)
    finally:
        c.headers.pop("Authorization", None)


def listed(c, headers, **params) -> tuple[list[str], bool]:
    r = c.get("/v1/jobs", params=params, headers=headers)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["jobs"]], r.json()["has_more"]


def metrics(c) -> tuple[dict[str, int], float]:
    """/metrics: the jobs kept by state (nmt_jobs), and the texts jobs translated (nmt_job_texts_total)."""
    page = c.get("/metrics").text
    jobs = {line.split('"')[1]: int(float(line.rsplit(" ", 1)[1])) for line in page.splitlines() if line.startswith("nmt_jobs{")}
    texts = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith("nmt_job_texts_total ")]
    return jobs, texts[0] if texts else 0.0


def test_a_key_lists_reads_and_deletes_its_own_jobs_only(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs", api_keys="alice-key,bob-key", sync_file_chars=200) as c:
        ready(c)
        first, second = post(c, TEXTS[:2], ALICE), post(c, TEXTS[2:4], ALICE)
        # a file through LibreTranslate's /translate_file (past sync_file_chars: a job) with the key in the form
        upload = c.post("/translate_file", data={"source": "de", "target": "en", "api_key": "alice-key"},
                        files={"file": ("story.txt", "\n".join(TEXTS[4:12]).encode())})
        assert upload.status_code == 200, upload.text
        third = upload.json()["jobId"]
        theirs = post(c, TEXTS[12:14], BOB)
        for job in (first, second, third):
            ended(c, job, ALICE)
        ended(c, theirs, BOB)

        mine, more = listed(c, ALICE)
        assert mine == [third, second, first] and not more  # the newest first, bob's not among them
        page = c.get("/v1/jobs", headers=ALICE).json()["jobs"]
        assert [(j["source"], j["target"], j["state"]) for j in page] == [("de", "en", "done")] * 3
        assert page[0]["file_name"] == "story.txt" and page[1]["file_name"] is None
        assert page[0]["expires_at"] == page[0]["finished_at"] + c.app.state.service.settings.job_ttl_s
        assert listed(c, BOB) == ([theirs], False)
        # a page at a time: before=<the last id of the page before>
        assert listed(c, ALICE, limit=2) == ([third, second], True)
        assert listed(c, ALICE, limit=2, before=second) == ([first], False)
        assert listed(c, ALICE, state="running") == ([], False)
        assert c.get("/v1/jobs", params={"limit": 0}, headers=ALICE).status_code == 422
        assert c.get("/v1/jobs", params={"before": "../x"}, headers=ALICE).status_code == 422
        assert c.get("/v1/jobs").status_code == 401

        # bob cannot tell alice's job from none, and changes nothing of it
        for method, path in (("GET", f"/v1/jobs/{first}"), ("GET", f"/v1/jobs/{first}/result"), ("DELETE", f"/v1/jobs/{first}")):
            r = c.request(method, path, headers=BOB)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found", (method, path, r.text)
        assert c.get(f"/v1/jobs/{first}/result", headers=ALICE).status_code == 200
        assert listed(c, ALICE)[0] == [third, second, first]


def test_deleting_a_finished_job_removes_it_and_its_results(models_dir, tmp_path):
    jobs_dir = tmp_path / "jobs"
    with client_for(models_dir, jobs_dir) as c:
        ready(c)
        job = post(c, TEXTS[:2], {}, **{"Idempotency-Key": "nightly"})
        done = ended(c, job, {})
        assert done["state"] == "done" and (jobs_dir / job).is_dir()
        assert metrics(c) == ({"queued": 0, "running": 0, "done": 1, "failed": 0, "cancelled": 0}, 2.0)
        deleted = c.delete(f"/v1/jobs/{job}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["state"] == "done" and done["finished_at"] <= deleted.json()["expires_at"]
        for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/result"):
            assert c.get(path).status_code == 404
        assert c.delete(f"/v1/jobs/{job}").status_code == 404
        assert not (jobs_dir / job).exists() and not [p for p in jobs_dir.iterdir() if p.name.startswith(".removed")]
        assert metrics(c)[0]["done"] == 0
        # a result asked for while DELETE removes the job: its record read before, its files gone after
        stale = dict(done, chunks=[[0, 2]], owner="", file_name=None, models=[], source_tokens=0, generated_tokens=0, sentences=0)
        store = c.app.state.jobs.store
        real_read, store.read = store.read, lambda job_id: dict(stale)
        try:
            late = c.get(f"/v1/jobs/{job}/result")
            assert late.status_code == 404 and late.json()["error"]["type"] == "not_found", late.text
        finally:
            store.read = real_read
        # its Idempotency-Key is free again: the same request makes a new job
        again = post(c, TEXTS[:2], {}, **{"Idempotency-Key": "nightly"})
        assert again != job
        # on a server without keys every client is the same one: the list holds every job
        assert listed(c, {})[0] == [again]
        assert listed(c, ALICE)[0] == [again]


def test_a_method_a_path_does_not_take_is_405_naming_every_method_it_takes(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs") as c:
        for path, methods in (("/v1/jobs", {"GET", "POST"}), (f"/v1/jobs/{'0' * 32}", {"GET", "DELETE"})):
            r = c.put(path, json={})
            assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == methods, (path, r.headers.get("allow"))
