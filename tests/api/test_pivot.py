"""A direction no model serves, translated through the pivot language (Settings.pivot_language): de->fr as
de->en by one model, then en->fr by another, as Argos Translate (LibreTranslate's engine) does."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import make_checkpoint
from fastapi.testclient import TestClient
from test_jobs import client_for, ready

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee. Eine Frau liest.", ""]
FAST = {"beam_size": 2, "max_length": 8}  # random models: keep outputs short


@pytest.fixture(scope="module")
def pivot_models(tmp_path_factory, spm_model) -> Path:
    """de-en and en-fr: nothing translates de->fr itself."""
    root = tmp_path_factory.mktemp("pivot-models")
    make_checkpoint(root / "de-en", spm_model, "de", "en", seed=3)
    make_checkpoint(root / "en-fr", spm_model, "en", "fr", seed=6)
    return root


@pytest.fixture(scope="module")
def client(pivot_models, tmp_path_factory):
    with client_for(pivot_models, tmp_path_factory.mktemp("jobs")) as c:
        yield ready(c)


def translate(client: TestClient, source: str, target: str, text, **extra) -> dict:
    response = client.post("/v1/translate", json={"text": text, "source": source, "target": target, **FAST, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_direction_no_model_serves_is_the_two_translations_through_the_pivot(client):
    """de->fr is exactly de->en, then en->fr of what that wrote; the scores add up as the chain's."""
    through = translate(client, "de", "fr", GERMAN, return_scores=True, num_hypotheses=2)
    english = translate(client, "de", "en", GERMAN, return_scores=True)
    french = translate(client, "en", "fr", [t["text"] for t in english["translations"]], return_scores=True, num_hypotheses=2)
    assert through["model"] == "de-en+en-fr"
    assert [t["text"] for t in through["translations"]] == [t["text"] for t in french["translations"]]
    for chained, first, second in zip(through["translations"], english["translations"], french["translations"]):
        assert chained["score"] == pytest.approx(first["score"] + second["score"])
        assert [h["text"] for h in chained["hypotheses"]] == [h["text"] for h in second["hypotheses"]]
        assert [h["score"] for h in chained["hypotheses"]] == pytest.approx([first["score"] + h["score"] for h in second["hypotheses"]])
    usage = through["usage"]
    assert usage["source_tokens"] == english["usage"]["source_tokens"]
    assert usage["generated_tokens"] == english["usage"]["generated_tokens"] + french["usage"]["generated_tokens"]
    # a detected source takes the pivot as a named one does
    found = translate(client, "auto", "fr", GERMAN[1])
    assert found["model"] == "de-en+en-fr" and found["translations"][0]["detected_language"]["language"] == "de"
    assert found["translations"][0]["text"] == through["translations"][1]["text"]
    # markup is kept through both hops
    html = translate(client, "de", "fr", "<p>Ein <b>Mann</b> fährt Fahrrad.</p>", format="html")
    assert html["translations"][0]["text"].startswith("<p>") and "<b>" in html["translations"][0]["text"]


def test_the_pivot_directions_are_listed_and_what_needs_one_model_says_why_not(client):
    models = client.get("/v1/models").json()
    assert sorted(m["id"] for m in models["models"]) == ["de-en", "en-fr"]
    assert models["pivots"] == [{"id": "de-fr", "source": "de", "target": "fr", "through": "en", "models": ["de-en", "en-fr"]}]
    languages = {entry["code"]: entry["targets"] for entry in client.get("/languages").json()}
    assert languages == {"de": ["en", "fr"], "en": ["fr"]}
    # a glossary's target terms would be translated again by the second model; attention maps are one model's
    for path, body in (("/v1/translate", {"text": "Ein Mann.", "glossary": [{"source": "Mann", "target": "homme"}]}),
                       ("/v1/attention", {"text": "Ein Mann."}),
                       ("/v1/glossaries", {"name": "Leute", "entries": [{"source": "Mann", "target": "homme"}]})):
        response = client.post(path, json={"source": "de", "target": "fr", **body})
        assert response.status_code == 400, response.text
        assert "through en" in response.json()["error"]["message"]
    # terms to avoid are the target's: the second translation keeps them out
    assert translate(client, "de", "fr", "Ein Mann fährt Fahrrad.", avoid=["xyz"])["model"] == "de-en+en-fr"
    refused = client.post("/v1/translate", json={"text": "A man.", "source": "fr", "target": "de"})
    assert refused.status_code == 400 and "through en: de-fr" in refused.json()["error"]["message"]


def test_libretranslate_and_a_job_take_the_pivot_direction(client):
    direct = translate(client, "de", "fr", GERMAN[:2])
    upstream = client.post("/translate", json={"q": GERMAN[:2], "source": "de", "target": "fr"})
    assert upstream.status_code == 200, upstream.text
    assert len(upstream.json()["translatedText"]) == 2
    job = client.post("/v1/jobs", json={"q": GERMAN[:2], "source": "de", "target": "fr", **FAST})
    assert job.status_code == 202, job.text
    deadline = time.time() + 60
    while client.get(f"/v1/jobs/{job.json()['id']}").json()["state"] != "done":
        assert time.time() < deadline
        time.sleep(0.05)
    result = client.get(f"/v1/jobs/{job.json()['id']}/result").json()
    assert [t["text"] for t in result["translations"]] == [t["text"] for t in direct["translations"]]
    # a glossary is refused when the job is made, not in every chunk
    refused = client.post("/v1/jobs", json={"q": ["Ein Mann."], "source": "de", "target": "fr",
                                            "glossary": [{"source": "Mann", "target": "homme"}]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "glossary"


def test_no_pivot_language_no_pivot(pivot_models, tmp_path):
    with client_for(pivot_models, tmp_path, pivot_language="") as c:
        ready(c)
        refused = c.post("/v1/translate", json={"text": "Ein Mann.", "source": "de", "target": "fr"})
        assert refused.status_code == 400 and "no model for de->fr" in refused.json()["error"]["message"]
        assert c.get("/v1/models").json()["pivots"] == []
    with client_for(pivot_models, tmp_path, pivot_language="EN") as c:  # named as a request may name it
        assert [p["id"] for p in ready(c).get("/v1/models").json()["pivots"]] == ["de-fr"]


def test_the_second_translation_is_not_held_to_the_token_limit_of_what_users_send(client, pivot_models, tmp_path, spm_model):
    """max_tokens_per_text limits the texts a request sends; the pivot's English is the server's own."""
    from nmt_serve.network.tokenizer import Tokenizer

    count = lambda text: len(Tokenizer(spm_model).encode(text))  # noqa: E731
    text = "Hund."
    english = translate(client, "de", "en", text, max_length=16)["translations"][0]["text"]
    assert count(english) > count(text)  # what the first translation writes is over the limit below
    french = translate(client, "en", "fr", english, max_length=16)["translations"][0]["text"]
    with client_for(pivot_models, tmp_path, max_tokens_per_text=count(text)) as c:
        assert translate(ready(c), "de", "fr", text, max_length=16)["translations"][0]["text"] == french


def test_both_translations_share_the_request_deadline(client, monkeypatch):
    """The second translation gets what the first left of the deadline: none left, 504."""
    import types

    from nmt_serve.service import pipeline

    calls = []

    # 12 s later at every look: the first hop is left 18 of 30 s (of the real clock too: a busy machine's
    # translation ends within them), the second finds none
    def monotonic() -> float:
        calls.append(1)
        return 12.0 * len(calls)

    monkeypatch.setattr(pipeline, "time", types.SimpleNamespace(monotonic=monotonic))
    late = client.post("/v1/translate", json={"text": "Ein Mann.", "source": "de", "target": "fr"},
                       headers={"X-Request-Timeout": "30"})
    assert late.status_code == 504 and late.json()["error"]["type"] == "timeout", late.text
    assert len(calls) == 4  # the request's start, the first hop's (and its own start), the second's


def test_the_models_listing_is_kept_narrowed_on_request_and_gzipped_for_who_takes_it(client):
    """/v1/models is built once per set of served models (NLLB-200's is 27 MB); ?source, ?target and ?model narrow
    it; a client that takes gzip gets it gzipped."""
    import gzip
    import json

    whole = client.get("/v1/models", headers={"accept-encoding": "identity"})
    assert "content-encoding" not in whole.headers
    raw = client.stream("GET", "/v1/models", headers={"accept-encoding": "gzip"})
    with raw as response:
        body = b"".join(response.iter_raw())
        assert response.headers["content-encoding"] == "gzip" and len(body) < len(whole.content)
    assert json.loads(gzip.decompress(body)) == whole.json()
    listed = lambda **q: [m["id"] for m in client.get("/v1/models", params=q).json()["models"]]  # noqa: E731
    pivots = lambda **q: [m["id"] for m in client.get("/v1/models", params=q).json()["pivots"]]  # noqa: E731
    assert listed(source="de") == ["de-en"] and pivots(source="DE") == ["de-fr"]
    assert listed(target="fr") == ["en-fr"] and pivots(target="fr") == ["de-fr"]
    assert listed(model="en-fr") == ["en-fr"] and pivots(model="en-fr") == ["de-fr"] and listed(source="fr") == []
    # other models served (an engine restarted with other checkpoints): the listing follows
    state = client.app.state.service
    served, kept = state.models, state.pivots
    try:
        state.models, state.pivots = {"de-en": served["de-en"]}, {}
        assert [m["id"] for m in client.get("/v1/models").json()["models"]] == ["de-en"]
    finally:
        state.models, state.pivots = served, kept
    assert client.get("/v1/models").json() == whole.json()


def test_what_requests_read_of_the_served_models_follows_them_and_messages_stay_short(client):
    """The served languages and directions, and /health's body, are made once per set of models (NLLB-200 serves
    40,602 directions); a message naming them lists 24 and the count."""
    from nmt_serve.service.state import capped

    state = client.app.state.service
    assert state.sources == {"de", "en"} and state.targets == {"en", "fr"} and state.directions == ["de-en", "en-fr"]
    served = state.models
    health = client.get("/health")
    assert health.json() == {"status": "ok", "models": ["de-en", "en-fr"]} and health.headers["content-type"] == "application/json"
    assert client.get("/health/ready").json() == {"status": "ready", "models": ["de-en", "en-fr"]}
    assert state.health_body("ok") is state.health_body("ok")  # made once (655 kB for NLLB-200)
    try:
        state.models = {"de-en": served["de-en"]}
        assert state.targets == {"en"} and state.directions == ["de-en"]
        assert client.get("/health").json()["models"] == ["de-en"]
    finally:
        state.models = served
    assert state.targets == {"en", "fr"} and client.get("/health/ready").json()["models"] == ["de-en", "en-fr"]
    names = [f"l{i}-m{i}" for i in range(40)]
    assert capped(names) == ", ".join(names[:24]) + ", ... (40 in all)" and capped(names[:3]) == "l0-m0, l1-m1, l2-m2"


def test_a_pivoted_texts_flags_name_their_hop_and_an_error_names_the_text_as_the_request_has_it(client, pivot_models, tmp_path, spm_model):
    from nmt_serve.network.tokenizer import Tokenizer

    german = "Zwei Hunde spielen im Schnee. Eine Frau liest."
    flags = translate(client, "de", "fr", german)["translations"][0]["flags"]
    # max_length 8: the random models' translations are cut short in both hops
    assert {f["direction"] for f in flags} == {"de-en", "en-fr"}
    assert all((f["source"] in german) == (f["direction"] == "de-en") for f in flags)  # the second hop's sources are English
    assert all("direction" not in f for f in translate(client, "de", "en", german)["translations"][0]["flags"])
    # text 1 is the only one translated through English, and it is over the token limit: named as the request's text 1
    english, long_german = "A man is riding a bike.", "Ein Mann fährt Fahrrad. Zwei Hunde spielen im Schnee. Eine Frau liest ein Buch."
    limit = len(Tokenizer(spm_model).encode(english))
    assert len(Tokenizer(spm_model).encode(long_german)) > limit
    with client_for(pivot_models, tmp_path, max_tokens_per_text=limit) as c:
        refused = ready(c).post("/v1/translate", json={"text": [english, long_german], "source": "auto", "target": "fr", **FAST})
    assert refused.status_code == 413 and refused.json()["error"]["message"].startswith("text 1 has "), refused.text
