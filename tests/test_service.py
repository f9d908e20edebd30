"""The REST service through the real app: endpoints, errors, batching, metrics, readiness."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import service.app as service_app
from service.app import create_app
from service.settings import Settings

from conftest import running_server

ROOT = Path(__file__).resolve().parent.parent
GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.", "Hallo"]
FAST = {"beam_size": 2, "max_length": 8}  # random models: keep outputs short


def wait_ready(client: TestClient, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if client.get("/health/ready").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("service did not become ready")


def make_client(models_dir: Path, **settings) -> TestClient:
    values = dict(models_dir=str(models_dir), device="cpu", max_wait_ms=2.0)
    values.update(settings)
    return TestClient(create_app(Settings(**values)), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def client(models_dir):
    with make_client(models_dir, max_texts_per_request=8, max_chars_per_text=200, max_tokens_per_text=40) as c:
        wait_ready(c)
        yield c


def metric(client: TestClient, name: str, **labels) -> float:
    text = client.get("/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            if key.split("{")[0] == name and all(f'{k}="{v}"' in key for k, v in labels.items()):
                total += float(value)
    return total


def assert_error(response, status: int, type_: str | None = None, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"type", "message", "param"} and error["message"]
    if type_:
        assert error["type"] == type_
    if param:
        assert error["param"] == param
    return error


# ---------------------------------------------------------------------------------------- translate


def test_translate_one_text_and_a_list(client):
    one = client.post("/v1/translate", json={"text": GERMAN[0], "source": "de", "target": "en", **FAST})
    assert one.status_code == 200
    body = one.json()
    assert body["model"] == "de-en" and len(body["translations"]) == 1
    assert body["usage"]["source_tokens"] > 0 and "score" not in body["translations"][0]
    many = client.post("/v1/translate", json={"text": GERMAN, **FAST}).json()
    assert len(many["translations"]) == len(GERMAN)
    assert many["translations"][0]["text"] == body["translations"][0]["text"]


def test_scores_and_hypotheses(client):
    body = client.post("/v1/translate", json={"text": GERMAN[:2], "beam_size": 3, "num_hypotheses": 3, "max_length": 6, "return_scores": True}).json()
    for t in body["translations"]:
        assert len(t["hypotheses"]) == 3 and t["score"] <= 0 and t["hypotheses"][0]["text"] == t["text"]


def test_empty_strings_translate_to_empty_strings(client):
    body = client.post("/v1/translate", json={"text": ["", GERMAN[0], " "], **FAST}).json()
    assert body["translations"][0]["text"] == "" and body["translations"][2]["text"] == ""


def test_other_direction(client):
    body = client.post("/v1/translate", json={"text": "A dog runs.", "source": "en", "target": "de", **FAST}).json()
    assert body["model"] == "en-de"


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "payload, status, type_, param",
    [
        ({"text": [], **FAST}, 400, "invalid_request", "text"),
        ({"text": "Hallo", "source": "fr", "target": "en"}, 400, "invalid_request", "source"),
        ({"text": ["Hallo"] * 9}, 413, "request_too_large", "text"),
        ({"text": "a" * 201}, 413, "request_too_large", "text"),
        ({"text": " ".join(["Hund"] * 45)}, 413, "request_too_large", "text"),
        ({"text": "Hallo", "beam_size": 9}, 422, "validation_error", "beam_size"),
        ({"text": "Hallo", "beam_size": 0}, 422, "validation_error", "beam_size"),
        ({"text": "Hallo", "beam_size": 2, "num_hypotheses": 3}, 422, "validation_error", "num_hypotheses"),
        ({"text": 5}, 422, "validation_error", None),
        ({"text": "Hallo", "bogus": 1}, 422, "validation_error", "bogus"),
    ],
)
def test_errors_have_one_shape(client, payload, status, type_, param):
    assert_error(client.post("/v1/translate", json=payload), status, type_, param)


def test_unknown_pair_names_supported_pairs(client):
    error = assert_error(client.post("/v1/translate", json={"text": "x", "source": "fr", "target": "de"}), 400)
    assert "de-en" in error["message"] and "en-de" in error["message"]


def test_limits_are_stated(client):
    error = assert_error(client.post("/v1/translate", json={"text": ["Hallo"] * 9}), 413)
    assert "8" in error["message"]


def test_malformed_json_is_422(client):
    r = client.post("/v1/translate", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 422, "validation_error")


def test_unknown_route_has_the_error_shape(client):
    assert_error(client.get("/nowhere"), 404, "http_error")


def test_queue_full_is_503_with_retry_after(models_dir, monkeypatch):
    release, started = threading.Event(), threading.Event()
    with make_client(models_dir, max_queue_sentences=1, retry_after_s=3) as c:
        wait_ready(c)
        translator = c.app.state.service.models["de-en"].translator
        original = translator.translate

        def blocking(*args, **kwargs):
            started.set()
            release.wait(10)
            return original(*args, **kwargs)

        monkeypatch.setattr(translator, "translate", blocking)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(c.post, "/v1/translate", json={"text": "Hallo", **FAST})
            assert started.wait(10)  # the worker is busy with the first request
            second = pool.submit(c.post, "/v1/translate", json={"text": "Hallo Welt", **FAST})
            batcher = c.app.state.service.batcher
            deadline = time.time() + 10
            while batcher.queued_sentences < 1 and time.time() < deadline:
                time.sleep(0.01)
            third = c.post("/v1/translate", json={"text": "Guten Tag", **FAST})
            release.set()
            assert first.result().status_code == 200 and second.result().status_code == 200
        assert_error(third, 503, "overloaded")
        assert third.headers["retry-after"] == "3"


def test_request_past_its_deadline_is_504(models_dir, monkeypatch):
    with make_client(models_dir, request_timeout_s=0.2) as c:
        wait_ready(c)
        translator = c.app.state.service.models["de-en"].translator
        original = translator.translate
        monkeypatch.setattr(translator, "translate", lambda *a, **k: (time.sleep(0.6), original(*a, **k))[1])
        assert_error(c.post("/v1/translate", json={"text": "Hallo", **FAST}), 504, "timeout")
        monkeypatch.setattr(translator, "translate", original)
        time.sleep(0.6)
        assert c.post("/v1/translate", json={"text": "Hallo", **FAST}).status_code == 200  # the server goes on


def test_a_failing_input_fails_only_its_own_request(models_dir, monkeypatch):
    with make_client(models_dir, max_wait_ms=200) as c:
        wait_ready(c)
        translator = c.app.state.service.models["de-en"].translator
        original = translator.translate

        def fragile(texts, **kwargs):
            if "KAPUTT" in texts:
                raise RuntimeError("this input breaks the model")
            return original(texts, **kwargs)

        monkeypatch.setattr(translator, "translate", fragile)
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(c.post, "/v1/translate", json={"text": t, **FAST}) for t in ["Hallo", "KAPUTT", "Ein Hund", "Eine Katze"]]
            responses = [f.result() for f in futures]
        assert [r.status_code for r in responses] == [200, 500, 200, 200]
        assert_error(responses[1], 500, "internal_error")


# ---------------------------------------------------------------------------------------- batching


def test_concurrent_requests_share_model_batches(models_dir):
    texts = [f"Ein Hund Nummer {i} rennt über die Wiese." if i % 2 else f"Kind {i} spielt." for i in range(16)]
    with make_client(models_dir, max_wait_ms=100, max_batch_sentences=64) as c:
        wait_ready(c)
        alone = [c.post("/v1/translate", json={"text": t, **FAST, "return_scores": True}).json()["translations"][0] for t in texts]
        batcher = c.app.state.service.batcher
        before = batcher.batches_run
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda t: c.post("/v1/translate", json={"text": t, **FAST, "return_scores": True}), texts))
        batches = batcher.batches_run - before
    assert batches < len(texts), f"{len(texts)} concurrent requests ran in {batches} batches"
    for text, reply, single in zip(texts, replies, alone):
        got = reply.json()["translations"][0]
        assert got["text"] == single["text"]  # each caller gets exactly its own result
        assert got["score"] == pytest.approx(single["score"], abs=1e-4)


def test_batching_can_be_turned_off(models_dir):
    with make_client(models_dir, batching=False, max_wait_ms=100) as c:
        wait_ready(c)
        batcher = c.app.state.service.batcher
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda t: c.post("/v1/translate", json={"text": t, **FAST}), GERMAN + GERMAN[:2]))
        assert batcher.batches_run == 6


# ---------------------------------------------------------------------------------------- attention


def test_attention_maps_shaped_and_normalized(client):
    r = client.post("/v1/attention", json={"text": GERMAN[1], "beam_size": 2, "include": ["cross", "decoder_self", "encoder_self"]})
    assert r.status_code == 200, r.text
    body = r.json()
    S, T = len(body["source_tokens"]), len(body["target_tokens"])
    assert body["num_layers"] == 2 and body["num_heads"] == 4 and body["layers"] == [0, 1] and body["heads"] == [0, 1, 2, 3]
    assert len(body["cross"]) == 2 and len(body["cross"][0]) == 4
    assert len(body["cross"][0][0]) == T and len(body["cross"][0][0][0]) == S
    for kind, cols in (("cross", S), ("decoder_self", T), ("encoder_self", S)):
        for layer in body[kind]:
            for head in layer:
                for row in head:
                    assert len(row) == cols and sum(row) == pytest.approx(1.0, abs=1e-4)
    for layer in body["decoder_self"]:
        for head in layer:
            assert all(v == 0 for t, row in enumerate(head) for v in row[t + 1 :])
    assert len(body["alignment"]) == T and all(0 <= a < S for a in body["alignment"])
    assert body["source_tokens"][-1] == "</s>" and body["target_tokens"][-1] == "</s>"


def test_attention_of_a_given_translation_with_selection(client):
    body = client.post("/v1/attention", json={
        "text": GERMAN[0], "target_text": "A man rides a bike.", "layers": [1], "heads": [0, 2], "average_heads": True,
    }).json()
    assert body["translation"] == "A man rides a bike." and body["layers"] == [1] and "heads" not in body
    assert len(body["cross"]) == 1 and len(body["cross"][0]) == 1  # one layer, heads averaged
    assert "decoder_self" not in body


def test_attention_errors(client):
    assert_error(client.post("/v1/attention", json={"text": "Hallo", "layers": [5]}), 400, param="layers")
    assert_error(client.post("/v1/attention", json={"text": "Hallo", "include": ["bogus"]}), 422)
    assert_error(client.post("/v1/attention", json={"text": ""}), 422)


# ---------------------------------------------------------------------------------------- LibreTranslate


def test_libretranslate_json_and_form(client):
    r = client.post("/translate", json={"q": GERMAN[0], "source": "de", "target": "en", "format": "text"})
    assert r.status_code == 200 and isinstance(r.json()["translatedText"], str)
    r = client.post("/translate", json={"q": GERMAN[:2], "source": "de", "target": "en", "alternatives": 2})
    body = r.json()
    assert len(body["translatedText"]) == 2 and len(body["alternatives"]) == 2 and len(body["alternatives"][0]) == 2
    r = client.post("/translate", data={"q": GERMAN[0], "source": "de", "target": "en"})
    assert r.status_code == 200 and isinstance(r.json()["translatedText"], str)
    assert_error(client.post("/translate", json={"q": "x", "source": "auto", "target": "en"}), 400, param="source")


def test_libretranslate_languages(client):
    langs = client.get("/languages").json()
    assert {"code": "de", "name": "German", "targets": ["en"]} in langs
    assert {"code": "en", "name": "English", "targets": ["de"]} in langs


# ---------------------------------------------------------------------------------------- operations


def test_models_endpoint(client):
    models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
    assert set(models) == {"de-en", "en-de"}
    assert models["de-en"]["parameters"] > 0 and models["de-en"]["device"] == "cpu" and models["de-en"]["dtype"] == "float32" and models["de-en"]["quantization"] == "none"


def test_int8_quantization_is_a_setting(models_dir):
    with make_client(models_dir, quantization="int8") as c:
        wait_ready(c)
        models = {m["id"]: m for m in c.get("/v1/models").json()["models"]}
        assert {m["quantization"] for m in models.values()} == {"int8"}
        r = c.post("/v1/translate", json={"text": ["Ein Hund."], "source": "de", "target": "en", **FAST})
        assert r.status_code == 200, r.text


def test_metrics_change_as_requests_are_served(client):
    before_requests = metric(client, "nmt_requests_total", endpoint="/v1/translate", status="200")
    before_tokens = metric(client, "nmt_source_tokens_total", model="de-en")
    before_batches = metric(client, "nmt_batch_sentences_count")
    client.post("/v1/translate", json={"text": GERMAN[:2], **FAST})
    assert metric(client, "nmt_requests_total", endpoint="/v1/translate", status="200") == before_requests + 1
    assert metric(client, "nmt_source_tokens_total", model="de-en") > before_tokens
    assert metric(client, "nmt_batch_sentences_count") == before_batches + 1
    text = client.get("/metrics").text
    for name in ("nmt_request_latency_seconds_bucket", "nmt_queue_wait_seconds_bucket", "nmt_batch_tokens_bucket",
                 "nmt_generated_tokens_total", "nmt_requests_in_flight", "nmt_queue_depth", "nmt_model_load_seconds"):
        assert name in text


def test_readiness_turns_200_only_after_load(models_dir, monkeypatch):
    gate = threading.Event()
    original = service_app.load_models

    def slow_load(*args):
        gate.wait(10)
        return original(*args)

    monkeypatch.setattr(service_app, "load_models", slow_load)
    with make_client(models_dir) as c:
        assert c.get("/health").status_code == 200
        assert_error(c.get("/health/ready"), 503, "not_ready")
        assert_error(c.post("/v1/translate", json={"text": "Hallo"}), 503, "not_ready")
        gate.set()
        wait_ready(c)
        assert c.get("/health/ready").json()["models"] == ["de-en", "en-de"]


def test_failed_load_is_reported(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    with make_client(tmp_path) as c:
        time.sleep(0.3)
        error = assert_error(c.get("/health/ready"), 503)
        assert "loading failed" in error["message"] and str(tmp_path) not in error["message"]


def test_openapi_docs_have_examples(client):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/translate", "/v1/attention", "/translate", "/languages", "/v1/models", "/health", "/health/ready", "/metrics"):
        assert path in spec["paths"]
    assert "examples" in json.dumps(spec["components"]["schemas"]["TranslateRequest"])
    assert client.get("/docs").status_code == 200


# ---------------------------------------------------------------------------------------- the real server


def test_python_dash_m_service_serves_http(models_dir):
    with running_server(models_dir) as base:
        request = urllib.request.Request(
            base + "/v1/translate", data=json.dumps({"text": ["Hallo", "Ein Hund"], **FAST}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            body = json.loads(r.read())
        assert body["model"] == "de-en" and len(body["translations"]) == 2


def test_service_refuses_a_missing_models_dir(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "service", "--models-dir", str(tmp_path / "none")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_every_endpoint_documents_an_example(client):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            documented = json.dumps(op)
            for ref in re.findall(r'"#/components/schemas/([^"]+)"', documented):
                documented += json.dumps(schemas.get(ref, {}))
            assert "example" in documented, f"{method.upper()} {path} has no example"


def test_models_load_on_the_thread_that_translates(models_dir, monkeypatch):
    """All torch work on one thread: a second thread's OpenMP team made decoding 3x slower (BENCHMARKS.md)."""
    loaded_on = []
    original = service_app.load_models

    def spy(*args, **kwargs):
        loaded_on.append(threading.current_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr(service_app, "load_models", spy)
    with make_client(models_dir) as c:
        wait_ready(c)
        state = c.app.state.service
        translating_on = state.batcher.executor.submit(threading.current_thread).result()
        assert loaded_on == [translating_on] and translating_on is not threading.main_thread()
        assert c.post("/v1/translate", json={"text": "Ein Hund.", "source": "de", "target": "en", **FAST}).status_code == 200
