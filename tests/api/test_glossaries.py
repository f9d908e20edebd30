"""Stored glossaries: made once, named by glossary_id in translations and jobs, a key's own."""
from __future__ import annotations

import time

from conftest import distinct
from test_jobs import client_for, ready

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]


def wait_done(client, job_id: str) -> dict:
    deadline = time.time() + 60
    while (status := client.get(f"/v1/jobs/{job_id}").json())["state"] not in ("done", "failed", "cancelled"):
        assert time.time() < deadline
        time.sleep(0.05)
    return status


def test_a_stored_glossary_applies_by_id_in_translations_and_jobs_until_it_is_deleted(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs") as c:
        ready(c)
        made = c.post("/v1/glossaries", json={"name": "Tiere", "source": "de", "target": "en",
                                              "entries_tsv": "hund\tcanine\nKatze\tfeline\nhund\tcanine\n\n"})
        assert made.status_code == 201, made.text
        info = made.json()
        assert (info["name"], info["source"], info["target"], info["entry_count"]) == ("Tiere", "de", "en", 2)  # the repeat kept once
        gid = info["id"]
        assert c.get("/v1/glossaries").json()["glossaries"] == [info]
        assert c.get(f"/v1/glossaries/{gid}").json() == info
        assert c.get(f"/v1/glossaries/{gid}/entries").json()["entries"] == [{"source": "hund", "target": "canine"},
                                                                             {"source": "Katze", "target": "feline"}]
        tsv = c.get(f"/v1/glossaries/{gid}/entries", params={"format": "tsv"})
        assert tsv.headers["content-type"].startswith("text/tab-separated-values") and tsv.text == "hund\tcanine\nKatze\tfeline\n"
        body = {"text": GERMAN, "source": "de", "target": "en", "beam_size": 1, "max_length": 12}
        by_id = c.post("/v1/translate", json={**body, "glossary_id": gid})
        inline = c.post("/v1/translate", json={**body, "glossary": [{"source": "hund", "target": "canine"}]})
        assert by_id.status_code == 200, by_id.text
        # what the same entries give inline: "Hunde" takes the term, the first text has none
        assert by_id.json()["translations"] == inline.json()["translations"]
        assert "canine" in by_id.json()["translations"][1]["text"]
        job = c.post("/v1/jobs", json={"q": GERMAN, "source": "de", "target": "en", "beam_size": 1, "max_length": 12, "glossary_id": gid})
        assert job.status_code == 202, job.text
        assert wait_done(c, job.json()["id"])["state"] == "done"
        result = c.get(f"/v1/jobs/{job.json()['id']}/result").json()
        assert [t["text"] for t in result["translations"]] == [t["text"] for t in by_id.json()["translations"]]
        # refusals: another direction, auto, both kinds of glossary
        for wrong, param in (({"source": "en", "target": "de", "text": "Two dogs."}, "glossary_id"),
                             ({"source": "auto"}, "source"), ({"glossary": [{"source": "Mann", "target": "guy"}]}, "glossary_id")):
            r = c.post("/v1/translate", json={**body, "glossary_id": gid, **wrong})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert c.delete(f"/v1/glossaries/{gid}").status_code == 204
        assert c.get(f"/v1/glossaries/{gid}").status_code == 404 and c.delete(f"/v1/glossaries/{gid}").status_code == 404
        gone = c.post("/v1/translate", json={**body, "glossary_id": gid})
        assert gone.status_code == 400 and gone.json()["error"]["param"] == "glossary_id"
        assert c.get("/v1/glossaries").json()["glossaries"] == []


def test_glossary_entries_are_checked_and_limited(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs", max_glossary_entries=3, max_glossaries=1) as c:
        ready(c)
        base = {"name": "x", "source": "de", "target": "en"}
        for extra, status, param in (
            ({}, 400, "entries"),  # neither
            ({"entries": [{"source": "a", "target": "b"}], "entries_tsv": "a\tb"}, 400, "entries"),  # both
            ({"entries_tsv": "Hund dog"}, 400, "entries_tsv"),  # no tab
            ({"entries_tsv": "Hund\tdog\nHund\tcanine"}, 400, "entries"),  # one source, two targets
            ({"entries_tsv": "a\tb\nc\td\ne\tf\ng\th"}, 413, "entries"),  # past max_glossary_entries
            ({"entries_tsv": "Hund\tdog", "source": "xx"}, 400, None),  # a direction not served
        ):
            r = c.post("/v1/glossaries", json={**base, **extra})
            assert r.status_code == status and (param is None or r.json()["error"]["param"] == param), (extra, r.text)
        assert c.post("/v1/glossaries", json={**base, "entries_tsv": "Hund\tdog"}).status_code == 201
        too_many = c.post("/v1/glossaries", json={**base, "entries_tsv": "Katze\tcat"})
        assert too_many.status_code == 409 and too_many.json()["error"]["type"] == "too_many_glossaries"


def test_a_glossary_is_its_keys_own(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs", api_keys="alice,bob") as c:
        ready(c)
        alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
        gid = c.post("/v1/glossaries", headers=alice, json={"name": "a", "source": "de", "target": "en",
                                                            "entries": [{"source": "Hund", "target": "canine"}]}).json()["id"]
        assert c.get("/v1/glossaries", headers=bob).json()["glossaries"] == []
        assert c.get(f"/v1/glossaries/{gid}", headers=bob).status_code == 404
        assert c.delete(f"/v1/glossaries/{gid}", headers=bob).status_code == 404
        r = c.post("/v1/translate", headers=bob, json={"text": "Ein Hund.", "source": "de", "target": "en", "glossary_id": gid})
        assert r.status_code == 400 and r.json()["error"]["param"] == "glossary_id"
        assert c.get(f"/v1/glossaries/{gid}", headers=alice).status_code == 200


def test_a_job_whose_glossary_is_deleted_fails_saying_why(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs") as c:
        ready(c)
        gid = c.post("/v1/glossaries", json={"name": "a", "source": "de", "target": "en", "entries_tsv": "hund\tcanine"}).json()["id"]
        # a worker runs one job at a time: the glossary's job waits behind this one until it is cancelled
        ahead = c.post("/v1/jobs", json={"q": distinct("Ein Mann fährt Fahrrad.", 1000), "source": "de", "target": "en",
                                         "beam_size": 1, "max_length": 12}).json()
        job = c.post("/v1/jobs", json={"q": GERMAN, "source": "de", "target": "en", "beam_size": 1, "max_length": 12,
                                       "glossary_id": gid}).json()
        assert c.delete(f"/v1/glossaries/{gid}").status_code == 204
        c.delete(f"/v1/jobs/{ahead['id']}")
        status = wait_done(c, job["id"])
        # not its texts given back untranslated: the job itself cannot be done as asked
        assert status["state"] == "failed" and gid in status["error"] and status["done"] == 0, status


def test_libretranslates_translate_takes_a_glossary_id_too(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs") as c:
        ready(c)
        gid = c.post("/v1/glossaries", json={"name": "a", "source": "de", "target": "en", "entries_tsv": "hund\tcanine"}).json()["id"]
        form = c.post("/translate", data={"q": GERMAN[1], "source": "de", "target": "en", "glossary_id": gid})
        assert form.status_code == 200 and "canine" in form.json()["translatedText"], form.text
        bad = c.post("/translate", json={"q": GERMAN[1], "source": "de", "target": "en", "glossary_id": "nope"})
        assert bad.status_code == 400 and "glossary_id" in bad.json()["error"], bad.text


def test_a_document_and_a_file_job_take_a_glossary_id(models_dir, tmp_path):
    with client_for(models_dir, tmp_path / "jobs") as c:
        ready(c)
        gid = c.post("/v1/glossaries", json={"name": "a", "source": "de", "target": "en", "entries_tsv": "hund\tcanine"}).json()["id"]
        data = ("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n").encode()
        form = {"source": "de", "target": "en", "glossary_id": gid}
        r = c.post("/v1/translate_file", data=form, files={"file": ("tiere.txt", data)})
        assert r.status_code == 200 and "canine" in r.text, r.text
        job = c.post("/v1/jobs/file", data=form, files={"file": ("tiere.txt", data)})
        assert job.status_code == 202, job.text
        assert wait_done(c, job.json()["id"])["state"] == "done"
        result = c.get(f"/v1/jobs/{job.json()['id']}/result")
        assert "canine" in result.text, result.text
        for path in ("/v1/translate_file", "/v1/jobs/file"):  # a glossary is for a named source
            r = c.post(path, data={**form, "source": "auto"}, files={"file": ("tiere.txt", data)})
            assert r.status_code == 400 and r.json()["error"]["param"] == "source", r.text


def test_a_full_disk_is_507_and_an_unwritable_directory_503(models_dir, tmp_path, monkeypatch):
    import errno

    from nmt_serve.service.glossary_store import GlossaryStore

    with client_for(models_dir, tmp_path / "jobs") as c:
        ready(c)
        body = {"name": "a", "source": "de", "target": "en", "entries_tsv": "hund\tcanine"}
        for number, status, type_ in ((errno.ENOSPC, 507, "insufficient_storage"), (errno.EROFS, 503, "glossaries_unavailable")):
            def failing(self, *args, number=number):
                raise OSError(number, "no")
            monkeypatch.setattr(GlossaryStore, "create", failing)
            r = c.post("/v1/glossaries", json=body)
            assert r.status_code == status and r.json()["error"]["type"] == type_ and r.headers["retry-after"], r.text
