"""Jobs (POST /v1/jobs): progress while they run, results in input order, cancel, the size limit, a job
that survives a restart of the API process and a killed engine (every text translated exactly once),
and the engine's priority for interactive calls over a job's chunks (orders and counts, never times).

A job's chunks go through jobs_runner.translate_texts; the tests wrap it to hold a chunk back (a gate)
or to count which texts were translated, and how often."""
from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, shared_engine_dir
from fastapi.testclient import TestClient

from nmt_serve.engine.admission import Admission
from nmt_serve.engine.core import EngineConfig, EngineCore
from nmt_serve.engine.protocol import BACKGROUND, DecodeOptions, Translate
from nmt_serve.inference.translator import Translator
from nmt_serve.service import jobs_runner
from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings

FAST = {"beam_size": 1, "max_length": 6}
TEXTS = (FIXTURES / "val40.de").read_text(encoding="utf-8").splitlines()  # 40 different sentences
real_translate = jobs_runner.translate_texts


def client_for(models_dir: Path, jobs_dir: Path, own_engine: bool = False, **settings) -> TestClient:
    """The app on a jobs directory, in front of the session's shared engine for its configuration
    (conftest.shared_engine_dir), or with own_engine, of an engine of its own (one the test kills)."""
    values = dict(models_dir=str(models_dir), device="cpu", jobs_dir=str(jobs_dir), job_chunk_texts=4)
    values.update(settings)
    if not own_engine:
        values["engine_socket_dir"] = shared_engine_dir(Settings(**values))
    return TestClient(create_app(Settings(**values)), raise_server_exceptions=False)


def ready(client: TestClient) -> TestClient:
    deadline = time.time() + 60
    while client.get("/health/ready").status_code != 200:
        assert time.time() < deadline, "not ready"
        time.sleep(0.02)
    return client


def wait_for(client: TestClient, job: str, condition, timeout: float = 60.0) -> dict:
    deadline = time.time() + timeout
    while True:
        status = client.get(f"/v1/jobs/{job}").json()
        if condition(status):
            return status
        assert time.time() < deadline, f"the job never got there: {status}"
        time.sleep(0.02)


def until(condition, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "never came true"
        time.sleep(0.01)


def reference(client: TestClient, texts: list[str]) -> list[str]:
    """What /v1/translate gives for the texts (a job must give the same, in the same order)."""
    response = client.post("/v1/translate", json={"text": texts, **FAST})
    assert response.status_code == 200, response.text
    return [t["text"] for t in response.json()["translations"]]


class Chunks:
    """jobs_runner.translate_texts, wrapped: which texts each call carried, which came back translated,
    and a gate that holds back the calls `hold` picks (by their number, from 1) until it opens."""

    def __init__(self, hold=lambda n: False):
        self.sent: list[list[str]] = []
        self.translated: Counter = Counter()
        self.hold = hold
        self.gate = threading.Event()

    async def __call__(self, state, request, **kw):
        self.sent.append(list(kw["texts"]))
        if self.hold(len(self.sent)):
            for _ in range(6000):  # polled, not waited on a thread: a held chunk is cancelled like any other
                if self.gate.is_set():
                    break
                await asyncio.sleep(0.01)
        results = await real_translate(state, request, **kw)
        self.translated.update(kw["texts"])
        return results


def test_a_job_reports_progress_while_it_runs_and_gives_its_results_in_input_order(models_dir, tmp_path, monkeypatch):
    chunks = Chunks(hold=lambda n: n == 3)  # the third chunk waits: the others finish around it
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path) as c:
        want = reference(ready(c), TEXTS)
        assert len(set(want)) > 1  # an order mixed up would show
        created = c.post("/v1/jobs", json={"q": TEXTS, **FAST})
        assert created.status_code == 202, created.text
        assert created.json()["state"] == "queued" and created.json()["total"] == 40 and created.json()["done"] == 0
        job = created.json()["id"]
        running = wait_for(c, job, lambda s: s["done"] == 36)
        assert running["state"] == "running" and running["percent"] == 90.0 and running["sentences_done"] >= 36
        assert running["eta_seconds"] is not None and running["eta_seconds"] >= 0 and running["started_at"] is not None
        # while no chunk finishes the record is still written (a client sees the job alive)
        wait_for(c, job, lambda s: s["updated_at"] > running["updated_at"])
        early = c.get(f"/v1/jobs/{job}/result")
        assert early.status_code == 409 and early.json()["error"]["type"] == "job_not_done"
        chunks.gate.set()
        done = wait_for(c, job, lambda s: s["state"] == "done")
        assert done["done"] == 40 and done["percent"] == 100.0 and done["eta_seconds"] is None and done["finished_at"]
        result = c.get(f"/v1/jobs/{job}/result").json()
        assert [t["text"] for t in result["translations"]] == want
        assert result["id"] == job and result["model"] == "de-en" and result["usage"]["sentences"] == done["sentences_done"]
    assert len(chunks.sent) == 10 and all(n == 1 for n in chunks.translated.values()) and set(chunks.translated) == set(TEXTS)


def test_cancel_drops_the_job_and_the_runner_goes_on(models_dir, tmp_path, monkeypatch):
    first = TEXTS[:20]
    chunks = Chunks(hold=lambda n: n <= 2)  # the job's first two chunks (all that are in flight) wait
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path) as c:
        job = ready(c).post("/v1/jobs", json={"q": first, **FAST}).json()["id"]
        wait_for(c, job, lambda s: s["state"] == "running")
        until(lambda: len(chunks.sent) == 2)  # "running" comes before the runner hands its chunks over
        cancelled = c.delete(f"/v1/jobs/{job}")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        stopped = wait_for(c, job, lambda s: s["finished_at"] is not None)  # the runner noticed
        assert stopped["state"] == "cancelled" and stopped["done"] == 0
        assert c.get(f"/v1/jobs/{job}/result").json()["error"]["type"] == "job_not_done"
        chunks.gate.set()
        # the runner is free for the next job, and the cancelled one sends nothing more
        other = c.post("/v1/jobs", json={"q": TEXTS[20:24], **FAST}).json()["id"]
        assert wait_for(c, other, lambda s: s["state"] in ("done", "failed", "cancelled"))["state"] == "done"
        assert c.get(f"/v1/jobs/{job}").json()["state"] == "cancelled"
        assert c.delete(f"/v1/jobs/{other}").json()["state"] == "done"  # a finished job is removed (test_jobs_owned)
        assert c.get(f"/v1/jobs/{other}").status_code == 404
        for bad in ("0" * 32, "../../etc"):
            missing = c.get(f"/v1/jobs/{bad}")
            assert missing.status_code == 404 and set(missing.json()["error"]) == {"type", "message", "param"}
        assert c.delete(f"/v1/jobs/{'0' * 32}").status_code == 404
    assert sum(1 for sent in chunks.sent if sent[0] in first) == 2 and not any(t in chunks.translated for t in first)
    assert not (tmp_path / job / "chunks").exists()  # its partial results are gone


def test_a_cancelled_jobs_progress_stays_as_it_was_when_cancelled(models_dir, tmp_path, monkeypatch):
    # the chunks in flight may land before the runner notices; they are dropped, and the count is not moved
    chunks = Chunks(hold=lambda n: n >= 2)
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    with client_for(models_dir, tmp_path) as c:
        job = ready(c).post("/v1/jobs", json={"q": TEXTS[:20], **FAST}).json()["id"]
        wait_for(c, job, lambda s: s["done"] == 4)
        until(lambda: len(chunks.sent) == 3)  # the two chunks that follow are in flight
        cancelled = c.delete(f"/v1/jobs/{job}").json()
        assert cancelled["state"] == "cancelled" and cancelled["done"] == 4
        chunks.gate.set()  # the two chunks in flight finish now, before the runner's next look at the job
        wait_for(c, job, lambda s: len(chunks.translated) >= 12)
        assert c.get(f"/v1/jobs/{job}").json()["done"] == 4
        stopped = wait_for(c, job, lambda s: s["finished_at"] is not None)
        assert stopped["state"] == "cancelled" and stopped["done"] == 4 and stopped["percent"] == 20.0


def test_a_job_past_the_size_limits_is_refused_with_413(models_dir, tmp_path):
    with client_for(models_dir, tmp_path, max_job_texts=10, max_job_bytes=2000, max_chars_per_text=300, max_texts_per_request=4) as c:
        ready(c)
        for body, param in (({"q": ["Hallo."] * 11}, "q"), ({"q": ["Hallo."] * 4 + ["a" * 301]}, "q"), ({"q": ["Hallo. " * 40] * 10}, None)):
            refused = c.post("/v1/jobs", json=body)
            assert refused.status_code == 413, refused.text
            error = refused.json()["error"]
            assert set(error) == {"type", "message", "param"} and error["param"] == param
        # a job's limits are its own: more texts than one request may carry
        assert c.post("/v1/jobs", json={"q": ["Hallo."] * 8, **FAST}).status_code == 202
        assert c.post("/v1/jobs", json={"q": ["Hallo."], "source": "xx"}).status_code == 400
        assert c.post("/v1/jobs", json={"q": []}).status_code == 422
    assert len(list(tmp_path.iterdir())) == 1  # only the accepted job was written


def test_a_job_goes_on_after_the_api_process_restarts_with_nothing_lost_or_translated_twice(models_dir, tmp_path, monkeypatch):
    before = Chunks(hold=lambda n: n > 2)  # the first two chunks finish, then the process "dies" with two in flight
    monkeypatch.setattr(jobs_runner, "translate_texts", before)
    with client_for(models_dir, tmp_path) as c:
        job = ready(c).post("/v1/jobs", json={"q": TEXTS, **FAST}).json()["id"]
        wait_for(c, job, lambda s: s["done"] == 8)
    before.gate.set()
    record = json.loads((tmp_path / job / "job.json").read_text())
    assert record["state"] == "running" and record["done"] == 8
    assert sorted(p.name for p in (tmp_path / job / "chunks").iterdir()) == ["000000.json", "000001.json"]
    after = Chunks()
    monkeypatch.setattr(jobs_runner, "translate_texts", after)
    with client_for(models_dir, tmp_path) as c:  # a new API process on the same jobs directory
        done = wait_for(ready(c), job, lambda s: s["state"] == "done")
        want = reference(c, TEXTS)
        result = c.get(f"/v1/jobs/{job}/result").json()
    assert done["done"] == 40 and [t["text"] for t in result["translations"]] == want
    assert set(after.translated) == set(TEXTS[8:])  # only the chunks without results were sent again
    assert before.translated + after.translated == Counter(TEXTS)  # every text translated exactly once


def test_a_job_survives_a_killed_engine_with_nothing_lost_or_translated_twice(models_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_runner, "CHUNKS_IN_FLIGHT", 1)  # one chunk in the engine when it dies
    attempts: list[str] = []
    translated: Counter = Counter()

    async def kill_the_engine_during_the_third_chunk(state, request, **kw):
        attempts.append(kw["texts"][0])
        if len(attempts) == 3:
            engine = state.supervisor.pid
            os.kill(engine, signal.SIGSTOP)  # it takes the chunk and never answers
            sent = state.engine.engines.pending_ids()
            call = asyncio.ensure_future(real_translate(state, request, **kw))
            for _ in range(1000):
                if state.engine.engines.pending_ids() - sent:
                    break
                await asyncio.sleep(0.01)
            os.kill(engine, signal.SIGKILL)
            results = await call  # 503: the engine was lost with the chunk
        else:
            results = await real_translate(state, request, **kw)
        translated.update(kw["texts"])
        return results

    monkeypatch.setattr(jobs_runner, "translate_texts", kill_the_engine_during_the_third_chunk)
    with client_for(models_dir, tmp_path, own_engine=True) as c:
        job = ready(c).post("/v1/jobs", json={"q": TEXTS, **FAST}).json()["id"]
        done = wait_for(c, job, lambda s: s["state"] in ("done", "failed"), timeout=120)
        restarts = c.app.state.service.supervisor.restarts
        want = reference(c, TEXTS)
        result = c.get(f"/v1/jobs/{job}/result").json()
    assert restarts == 1 and done["state"] == "done" and done["done"] == 40
    assert [t["text"] for t in result["translations"]] == want
    assert translated == Counter(TEXTS)  # none lost, none twice
    third = TEXTS[8]
    assert Counter(attempts)[third] >= 2 and all(n == 1 for t, n in Counter(attempts).items() if t != third)  # only it was sent again


def test_a_file_as_a_job_comes_back_translated(models_dir, tmp_path):
    """A .txt file: one text per line, empty lines kept; an office document: every paragraph translated in
    place (its formats are tested in tests/unit with the documents themselves)."""
    lines = TEXTS[:5] + [""] + TEXTS[5:8]
    with client_for(models_dir, tmp_path) as c:
        want = [t["text"] for t in ready(c).post("/v1/translate", json={"text": [x for x in lines if x]}).json()["translations"]]
        created = c.post("/v1/jobs/file", files={"file": ("story.txt", "\n".join(lines).encode(), "text/plain")},
                         data={"source": "de", "target": "en"})
        assert created.status_code == 202 and created.json()["total"] == len(lines)
        wait_for(c, created.json()["id"], lambda s: s["state"] == "done")
        result = c.get(f"/v1/jobs/{created.json()['id']}/result")
        assert result.status_code == 200 and "story_en.txt" in result.headers["content-disposition"]
        back = result.content.decode().split("\n")
        assert back[5] == "" and [x for i, x in enumerate(back) if i != 5] == want
        assert c.post("/v1/jobs/file", files={"file": ("a.pdf", b"%PDF", "application/pdf")}, data={"source": "de", "target": "en"}).status_code == 400
        docx = pytest.importorskip("docx")
        document = docx.Document()
        for text in TEXTS[10:13]:
            document.add_paragraph(text)
        w = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
        lang = document.paragraphs[0].runs[0]._r.get_or_add_rPr().makeelement(f"{w}lang", {f"{w}val": "de-DE"})
        document.paragraphs[0].runs[0]._r.get_or_add_rPr().append(lang)
        data = io.BytesIO()
        document.save(data)
        created = c.post("/v1/jobs/file", files={"file": ("brief.docx", data.getvalue(), "application/octet-stream")},
                         data={"source": "de", "target": "en"}).json()
        assert created["total"] == 3
        wait_for(c, created["id"], lambda s: s["state"] == "done")
        back = docx.Document(io.BytesIO(c.get(f"/v1/jobs/{created['id']}/result").content))
        assert len(back.paragraphs) == 3 and all(p.text != t for p, t in zip(back.paragraphs, TEXTS[10:13]))
        # the document says it is in English now (text/documents/language_marks.py)
        assert [el.get(f"{w}val") for el in back.paragraphs[0].runs[0]._r.iter(f"{w}lang")] == ["en"]


def test_a_text_at_fault_comes_back_as_it_is_and_the_job_goes_on(models_dir, tmp_path):
    """With source auto, a text in no served language is given back with its error (one with no letters,
    nothing to translate, is given back without one); the other texts of its chunk and of the job are
    translated; the status counts it."""
    texts = TEXTS[:5] + ["12345", "El perro corre por el parque mientras los niños juegan con la pelota."] + TEXTS[5:9]
    with client_for(models_dir, tmp_path) as c:
        want = reference(ready(c), TEXTS[:9])
        created = c.post("/v1/jobs", json={"q": texts, "source": "auto", "target": "en", **FAST})
        assert created.status_code == 202, created.text
        done = wait_for(c, created.json()["id"], lambda s: s["state"] in ("done", "failed"))
        assert done["state"] == "done" and done["done"] == len(texts) and done["not_translated"] == 1, done
        result = c.get(f"/v1/jobs/{created.json()['id']}/result").json()["translations"]
        assert [t["text"] for i, t in enumerate(result) if i not in (5, 6)] == want
        assert [t["text"] for t in result[5:7]] == texts[5:7]
        assert "Spanish" in result[6]["error"]
        assert not any("error" in t for i, t in enumerate(result) if i != 6)


def test_a_job_takes_a_glossary_as_translate_does(models_dir, tmp_path):
    with client_for(models_dir, tmp_path) as c:
        glossary = [{"source": "Hund", "target": "hound"}]
        body = {"q": ["Ein Hund rennt.", "Eine Katze schläft."], "source": "de", "target": "en", "glossary": glossary, **FAST}
        want = ready(c).post("/v1/translate", json={**{k: v for k, v in body.items() if k != "q"}, "text": body["q"]}).json()
        created = c.post("/v1/jobs", json=body)
        assert created.status_code == 202, created.text
        wait_for(c, created.json()["id"], lambda s: s["state"] == "done")
        result = c.get(f"/v1/jobs/{created.json()['id']}/result").json()["translations"]
        assert [t["text"] for t in result] == [t["text"] for t in want["translations"]] and "hound" in result[0]["text"]
        refused = c.post("/v1/jobs", json={**body, "avoid": ["  "]})  # at submission, as /v1/translate refuses it
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "avoid", refused.text


def test_a_job_into_its_own_language_comes_back_as_it_is(models_dir, tmp_path):
    # as /v1/translate and /v1/translate_file answer it; a pair no model serves is still refused when posted
    with client_for(models_dir, tmp_path) as c:
        created = ready(c).post("/v1/jobs", json={"q": TEXTS[:3], "source": "de", "target": "de", **FAST})
        assert created.status_code == 202, created.text
        wait_for(c, created.json()["id"], lambda s: s["state"] == "done")
        assert [t["text"] for t in c.get(f"/v1/jobs/{created.json()['id']}/result").json()["translations"]] == TEXTS[:3]
        english = c.post("/v1/jobs/file", files={"file": ("en.txt", b"Two children are playing in the garden behind the house.")},
                         data={"source": "auto", "target": "en"})
        assert english.status_code == 202, english.text
        wait_for(c, english.json()["id"], lambda s: s["state"] == "done")
        assert c.get(f"/v1/jobs/{english.json()['id']}/result").content == b"Two children are playing in the garden behind the house."
        assert c.post("/v1/jobs", json={"q": TEXTS[:3], "source": "fr", "target": "fr"}).status_code == 400


def test_background_work_waits_for_interactive_work_and_holds_a_bounded_share(tiny_checkpoint):
    """In the engine core: a job's sentences join only while no interactive sentence waits, never hold
    more than background_share of the rows, and an interactive call that arrives during the job
    finishes before it."""
    translator = Translator.load(tiny_checkpoint, device="cpu")
    core = EngineCore({"de-en": translator}, EngineConfig(max_batch_sentences=8, background_share=0.25, lanes=1))
    core.admission.rate = 1e9
    ids = lambda texts: [translator.src_tokenizer.encode(t) for t in texts]
    core.handle(Translate("job", "de-en", ids(TEXTS[:12]), DecodeOptions(beam_size=2, max_length=20), time.monotonic() + 60,
                          priority=BACKGROUND))
    assert core.admission.pending == 0 and core.admission.background > 0  # not counted ahead of interactive calls
    search = lambda: next(iter(core.groups.values())).search
    running = lambda: {k for k in search().keys() if k[0] == "job"}
    finished, seen = [], set()
    for _ in range(2):
        finished += [r.id for r in core.work()]
        assert len(running()) <= 2  # 0.25 of 8 rows
        seen |= running()
    core.handle(Translate("user", "de-en", ids(TEXTS[20:30]), DecodeOptions(beam_size=2, max_length=5), time.monotonic() + 60))
    joined_while_waiting = 0
    while core.busy:
        interactive_waiting = any(g.waiting for g in core.groups.values())
        finished += [r.id for r in core.work()]
        if interactive_waiting:
            joined_while_waiting += len(running() - seen)
        if "user" in core.calls and running() - seen:  # on CPU, while interactive work is about: one job sentence at a time
            assert len(running()) == 1
        assert len(running()) <= 2
        seen |= running()
    assert finished == ["user", "job"] and joined_while_waiting == 0 and len(seen) == 12


def test_on_cpu_lanes_background_work_keeps_to_its_share_of_the_lanes(tiny_checkpoint):
    """Two lanes, a share of 0.25: the job keeps to lane 0, so an interactive sentence runs in a lane of its own."""
    translator = Translator.load(tiny_checkpoint, device="cpu")
    threads = torch.get_num_threads()
    core = EngineCore({"de-en": translator}, EngineConfig(max_batch_sentences=8, background_share=0.25, lanes=2))
    torch.set_num_threads(threads)
    core.admission.rate = 1e9
    ids = lambda texts: [translator.src_tokenizer.encode(t) for t in texts]
    core.handle(Translate("job", "de-en", ids(TEXTS[:6]), DecodeOptions(beam_size=2, max_length=20), time.monotonic() + 60,
                          priority=BACKGROUND))
    core.work()
    core.handle(Translate("user", "de-en", ids(TEXTS[20:21]), DecodeOptions(beam_size=2, max_length=20), time.monotonic() + 60))
    lanes_of = lambda call: {key[3] for key, g in core.groups.items() for k in g.search.keys() if k[0] == call}
    while core.busy:
        core.work()
        assert lanes_of("job") <= {0} and lanes_of("user") <= {1}
        assert sum(1 for g in core.groups.values() for k in g.search.keys() if k[0] == "job") <= 2


def test_admission_does_not_count_background_work_ahead_of_interactive_calls():
    admission = Admission(rate=10.0, margin=0.8)
    assert admission.admit(5.0, timeout=60.0) is None  # interactive: 0.5 s of work
    assert admission.admit(100.0, timeout=60.0, background=True) is None  # a job's chunk: 10 s
    assert admission.admit(2.0, timeout=1.0) is None  # 0.7 s ahead of it, the chunk not counted
    assert admission.admit(2.0, timeout=1.0, background=True) is not None  # a background call waits for everything
    admission.release(100.0, background=True)
    assert admission.background == 0 and admission.pending == pytest.approx(7.0)
