"""LibreTranslate's /translate_file past sync_file_chars: the file becomes a job (the machinery of /v1/jobs/file,
at background priority) and the answer comes at once, still {"translatedFileUrl"} (with jobId and jobUrl beside
it); the download answers 202 with the job's progress and Retry-After until the file is ready. Under the
threshold nothing changes. A tiny threshold set through the settings makes a few lines a job.

A job's chunks go through jobs_runner.translate_texts, wrapped by test_jobs.Chunks to hold one back (a gate)
and to count which texts were translated."""
from __future__ import annotations

import io
import json
import time
from collections import Counter

import pytest
from test_jobs import TEXTS, Chunks, client_for, ready, wait_for

from nmt_serve.service import jobs_runner
from nmt_serve.service.errors import APIError

THRESHOLD = 200  # characters: a few lines of TEXTS pass it
LINES = TEXTS[:12]  # 12 texts: 3 chunks of 4 (test_jobs.client_for sets job_chunk_texts=4)


def lt_client(models_dir, tmp_path, **settings):
    # the download answers at once unless a test asks it to wait for the job (file_download_wait_s)
    return client_for(models_dir, tmp_path / "jobs", **{"sync_file_chars": THRESHOLD, "file_download_wait_s": 0, **settings})


def upload(client, name: str, data: bytes, source: str = "de", target: str = "en"):
    return client.post("/translate_file", data={"source": source, "target": target}, files={"file": (name, data)})


def path_of(url: str) -> str:
    return url[url.index("/", len("http://")):]


def error_of(response, status: int) -> str:
    """LibreTranslate's error shape: {"error": "message"} and nothing else."""
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and response.json()["error"], response.json()
    return response.json()["error"]


def download(client, url: str, timeout: float = 120.0, **kw):
    """GET the download until it is no longer 202 (each 202 with a Retry-After), as a polling client does."""
    deadline = time.time() + timeout
    while True:
        r = client.get(path_of(url), **kw)
        if r.status_code != 202:
            return r
        assert 1 <= int(r.headers["retry-after"]) <= 10 and r.headers["cache-control"] == "no-store"
        assert time.time() < deadline, r.text
        time.sleep(0.05)


def translated_lines(client, lines: list[str]) -> list[str]:
    """What /v1/translate gives for the non-empty lines, with the options a file job uses (beam 4)."""
    r = client.post("/v1/translate", json={"text": [x for x in lines if x], "source": "de", "target": "en"})
    assert r.status_code == 200, r.text
    return [t["text"] for t in r.json()["translations"]]


def test_a_file_under_the_threshold_is_translated_in_the_request_as_before(models_dir, tmp_path):
    with lt_client(models_dir, tmp_path) as c:
        ready(c)
        small = "\n".join(TEXTS[:2]).encode()
        assert len(small) < THRESHOLD
        r = upload(c, "kurz.txt", small)
        assert r.status_code == 200 and set(r.json()) == {"translatedFileUrl"}, r.text
        got = c.get(path_of(r.json()["translatedFileUrl"]))
        assert got.status_code == 200 and 'filename="kurz_en.txt"' in got.headers["content-disposition"] and got.text.strip()
        # an HTML page is one text, so never a job: past the threshold it is still translated in the request
        page = f"<html><body><p>{' '.join(TEXTS[:4])}</p></body></html>".encode()
        assert THRESHOLD < len(page) <= 20000
        r = upload(c, "seite.html", page)
        assert r.status_code == 200 and set(r.json()) == {"translatedFileUrl"}, r.text
        assert c.get(path_of(r.json()["translatedFileUrl"])).text.startswith("<html><body><p>")
        # the same language: nothing to translate, given back at once whatever its size
        r = upload(c, "lang.txt", "\n".join(LINES).encode(), source="en", target="en")
        assert set(r.json()) == {"translatedFileUrl"} and c.get(path_of(r.json()["translatedFileUrl"])).text == "\n".join(LINES)
    assert not (tmp_path / "jobs").exists() or [p.name for p in (tmp_path / "jobs").iterdir()] == ["files"]  # no job was made


def test_a_file_translated_in_the_request_downloads_from_another_api_process_on_the_jobs_directory(models_dir, tmp_path):
    """Replicas share jobs_dir (the chart's jobs.existingClaim): a file translated within the request is kept
    there too, so a download that reaches another replica finds it, as a job's does."""
    with lt_client(models_dir, tmp_path) as c:
        r = upload(ready(c), "kurz.txt", "\n".join(TEXTS[:2]).encode())
        assert r.status_code == 200 and set(r.json()) == {"translatedFileUrl"}, r.text
        page = upload(c, "seite.html", f"<html><body><p>{TEXTS[0]}</p></body></html>".encode()).json()["translatedFileUrl"]
        first = c.get(path_of(r.json()["translatedFileUrl"])).content
    with lt_client(models_dir, tmp_path) as other:  # another API process (a replica) on the same jobs directory
        got = ready(other).get(path_of(r.json()["translatedFileUrl"]))
        assert got.status_code == 200 and got.content == first and 'filename="kurz_en.txt"' in got.headers["content-disposition"]
        assert other.get(path_of(page)).text.startswith("<html><body><p>")


def test_a_larger_file_becomes_a_job_whose_download_waits_for_it(models_dir, tmp_path, monkeypatch):
    chunks = Chunks(hold=lambda n: n == 2)  # the second chunk waits: the download sees the job half done
    monkeypatch.setattr(jobs_runner, "translate_texts", chunks)
    lines = LINES[:6] + [""] + LINES[6:]
    with lt_client(models_dir, tmp_path) as c:
        want = translated_lines(ready(c), lines)
        r = upload(c, "geschichte.txt", "\n".join(lines).encode())
        assert r.status_code == 200, r.text
        answer = r.json()
        assert set(answer) == {"translatedFileUrl", "jobId", "jobUrl"}
        job = answer["jobId"]
        assert answer["translatedFileUrl"].endswith(f"/download_file/{job}.geschichte_en.txt")
        status = c.get(path_of(answer["jobUrl"]))  # the job as /v1/jobs shows it
        assert status.status_code == 200 and status.json()["id"] == job and status.json()["total"] == 13
        wait_for(c, job, lambda s: s["done"] == 9)  # chunks 1 and 3 done, chunk 2 held
        pending = c.get(path_of(answer["translatedFileUrl"]))
        assert pending.status_code == 202 and 1 <= int(pending.headers["retry-after"]) <= 10
        progress = pending.json()
        assert progress["id"] == job and progress["state"] == "running" and (progress["done"], progress["total"]) == (9, 13)
        assert progress["percent"] == pytest.approx(69.23) and progress["sentences_done"] >= 8
        # LibreTranslate's page opens the URL in a tab: the browser gets a page that reloads itself
        page = c.get(path_of(answer["translatedFileUrl"]), headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        assert page.status_code == 202 and page.headers["content-type"].startswith("text/html")
        assert '<meta http-equiv="refresh"' in page.text and "9 of 13 paragraphs" in page.text and "geschichte.txt" in page.text
        chunks.gate.set()
        done = download(c, answer["translatedFileUrl"])
        assert done.status_code == 200, done.text
        assert 'filename="geschichte_en.txt"' in done.headers["content-disposition"] and done.headers["content-type"].startswith("text/plain")
        back = done.content.decode().split("\n")
        assert back[6] == "" and [x for i, x in enumerate(back) if i != 6] == want
        assert c.get(f"/v1/jobs/{job}").json()["state"] == "done"
        assert c.get(f"/v1/jobs/{job}/result").content == done.content  # the same file through our own endpoint
        assert download(c, answer["translatedFileUrl"]).content == done.content  # not single-use
    assert Counter(chunks.translated) == Counter(lines)  # every line once (the empty one too), at background priority
    assert json.loads((tmp_path / "jobs" / job / "job.json").read_text())["source"] == "de"


def test_a_document_as_a_job_comes_back_translated_with_auto_detection(models_dir, tmp_path):
    docx = pytest.importorskip("docx")
    document = docx.Document()
    for text in LINES[:6]:
        document.add_paragraph(text)
    data = io.BytesIO()
    document.save(data)
    with lt_client(models_dir, tmp_path) as c:
        r = upload(ready(c), "brief.docx", data.getvalue(), source="auto")
        assert r.status_code == 200 and "jobId" in r.json(), r.text
        assert json.loads((tmp_path / "jobs" / r.json()["jobId"] / "job.json").read_text())["source"] == "de"  # told once, for the file
        done = download(c, r.json()["translatedFileUrl"])
        assert done.status_code == 200 and 'filename="brief_en.docx"' in done.headers["content-disposition"]
        back = docx.Document(io.BytesIO(done.content))
        assert len(back.paragraphs) == 6 and all(p.text and p.text != t for p, t in zip(back.paragraphs, LINES))


def test_past_the_job_limits_413_in_libretranslates_shape(models_dir, tmp_path):
    with lt_client(models_dir, tmp_path, max_job_texts=10, max_job_bytes=1500, max_chars_per_text=300) as c:
        ready(c)
        assert "max_job_texts" in error_of(upload(c, "viele.txt", "\n".join(LINES).encode()), 413)
        assert "max_job_bytes" in error_of(upload(c, "gross.txt", "\n".join([" ".join(LINES[:4])] * 8).encode()), 413)
        long_line = ("Hallo. " * 50).encode()  # past max_chars_per_text: once a job, a line that long is refused
        assert "max_chars_per_text" in error_of(upload(c, "zeile.txt", long_line), 413)
        assert "jobId" in upload(c, "genug.txt", "\n".join(LINES[:8]).encode()).json()  # within them: a job
    assert len(list((tmp_path / "jobs").iterdir())) == 1  # only the accepted one was written


def test_a_failed_or_cancelled_job_and_an_unknown_or_expired_file(models_dir, tmp_path, monkeypatch):
    held = Chunks(hold=lambda n: n <= 2)
    monkeypatch.setattr(jobs_runner, "translate_texts", held)
    with lt_client(models_dir, tmp_path, job_ttl_s=1.0) as c:
        answer = upload(ready(c), "abbruch.txt", "\n".join(LINES).encode()).json()
        wait_for(c, answer["jobId"], lambda s: s["state"] == "running")
        assert c.delete(path_of(answer["jobUrl"])).json()["state"] == "cancelled"
        assert error_of(c.get(path_of(answer["translatedFileUrl"])), 410) == "the translation of abbruch.txt was cancelled"
        held.gate.set()

        async def broken(state, request, **kw):  # not one text's fault (that text would come back as it is)
            raise APIError(500, "internal_error", "the engine failed: out of memory")
        monkeypatch.setattr(jobs_runner, "translate_texts", broken)
        failing = upload(c, "kaputt.txt", "\n".join(LINES).encode()).json()
        wait_for(c, failing["jobId"], lambda s: s["state"] == "failed")
        assert error_of(c.get(path_of(failing["translatedFileUrl"])), 500) == \
            "the translation of kaputt.txt failed: the engine failed: out of memory"

        assert "no such file" in error_of(c.get("/download_file/0123456789abcdef0123456789abcdef.a.txt"), 404)
        # a job of our own /v1/jobs/file is read there (with its key where keys are on), not as a LibreTranslate download
        own = c.post("/v1/jobs/file", files={"file": ("eigen.txt", "\n".join(LINES[:2]).encode())}, data={"source": "de", "target": "en"})
        assert error_of(c.get(f"/download_file/{own.json()['id']}.eigen_en.txt"), 404)
        # a finished job is removed job_ttl_s after it ended (the runner clears it as it looks for work): then 404
        deadline = time.time() + 60
        while (tmp_path / "jobs" / failing["jobId"]).exists():
            assert time.time() < deadline, "the expired job was never removed"
            time.sleep(0.1)
        assert "has expired" in error_of(c.get(path_of(failing["translatedFileUrl"])), 404)


def test_the_job_goes_on_after_the_api_process_restarts_and_its_download_still_works(models_dir, tmp_path, monkeypatch):
    before = Chunks(hold=lambda n: n > 1)  # the first chunk finishes, then the process stops with two in flight
    monkeypatch.setattr(jobs_runner, "translate_texts", before)
    with lt_client(models_dir, tmp_path) as c:
        answer = upload(ready(c), "neustart.txt", "\n".join(LINES).encode()).json()
        wait_for(c, answer["jobId"], lambda s: s["done"] == 4)
        assert c.get(path_of(answer["translatedFileUrl"])).status_code == 202
    before.gate.set()
    after = Chunks()
    monkeypatch.setattr(jobs_runner, "translate_texts", after)
    with lt_client(models_dir, tmp_path) as c:  # a new API process on the same jobs directory
        done = download(ready(c), answer["translatedFileUrl"])
        assert done.status_code == 200 and done.content.decode().split("\n") == translated_lines(c, LINES)
    assert set(after.translated) == set(LINES[4:]) and before.translated + after.translated == Counter(LINES)


def test_libretranslate_aio_gets_the_url_and_a_polling_download_gets_the_file(models_dir, tmp_path):
    """libretranslate-aio's translate_file returns translatedFileUrl, which it does not fetch; a polling client
    gets the file once the job is done."""
    from libretranslate_aio.client import LibreTranslate

    path = tmp_path / "notiz.txt"
    path.write_text("\n".join(LINES), encoding="utf-8")
    with lt_client(models_dir, tmp_path) as c:
        with LibreTranslate("http://testserver", client=ready(c)) as lt:
            url = lt.translate_file(path, "de", "en").translated_file_url
        assert url.endswith("notiz_en.txt")
        done = download(c, url)
        assert done.status_code == 200 and len(done.content.decode().split("\n")) == len(LINES)


def test_a_client_that_fetches_the_url_once_gets_the_file_of_a_job_that_ends_within_the_wait(models_dir, tmp_path, monkeypatch):
    """libretranslate-aio's CLI (`translate-file --output`) fetches the URL once and saves whatever comes
    back: the download waits up to file_download_wait_s for the job, so the CLI saves the translation. A
    job held back past the wait still answers 202 (after the wait asked for), `?wait=0` answers without
    waiting, and a browser gets the progress page without waiting."""
    from libretranslate_aio import cli
    from libretranslate_aio.client import LibreTranslate

    path, out = tmp_path / "notiz.txt", tmp_path / "notiz_en.txt"
    path.write_text("\n".join(LINES), encoding="utf-8")
    with lt_client(models_dir, tmp_path, file_download_wait_s=300) as c:  # as long as the job takes, here
        monkeypatch.setattr(cli, "LibreTranslate", lambda **kw: LibreTranslate("http://testserver", client=ready(c)))
        assert cli.main(["translate-file", str(path), "-s", "de", "-t", "en", "-o", str(out)]) == 0
        assert out.read_text(encoding="utf-8").split("\n") == translated_lines(c, LINES)

    held = Chunks(hold=lambda n: True)
    monkeypatch.setattr(jobs_runner, "translate_texts", held)
    # the server would wait 60 s: a call that answers before that did not wait (however slow the machine)
    with lt_client(models_dir, tmp_path / "held", file_download_wait_s=60) as c:
        full = upload(ready(c), "notiz.txt", "\n".join(LINES).encode()).json()["translatedFileUrl"]
        url = path_of(full)
        start = time.monotonic()
        assert c.get(url, params={"wait": 0.5}).status_code == 202 and time.monotonic() - start >= 0.5
        start = time.monotonic()
        assert c.get(url, params={"wait": 0}).status_code == 202 and time.monotonic() - start < 60
        page = c.get(url, headers={"accept": "text/html"})
        assert page.status_code == 202 and "reloads itself" in page.text and time.monotonic() - start < 60
        held.gate.set()
        assert download(c, full).status_code == 200
