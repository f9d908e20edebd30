"""The REST service through the real app: endpoints, errors, batching, metrics, readiness."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import distinct, running_server
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
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
    values = dict(models_dir=str(models_dir), device="cpu")
    values.update(settings)
    return TestClient(create_app(Settings(**values)), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def client(models_dir):
    with make_client(models_dir, max_texts_per_request=8, max_chars_per_text=200, max_tokens_per_text=40) as c:
        wait_ready(c)
        yield c


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(0.05)


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


def test_urls_placeholders_and_code_come_back_as_written(client):
    """A model rewrites them as words; here they go round it (text/protected_spans.py), in both APIs and
    in every hypothesis, while a text without any is translated as it always was."""
    protected = ["https://example.com/a?b=1&c=2", "max@example.com", "{name}", "%s", "`ls -l`"]
    text = f"Ein Hund {protected[0]} rennt, {protected[1]} schreibt {protected[2]} und %s mit {protected[4]}."
    body = client.post("/v1/translate", json={"text": text, "num_hypotheses": 2, **FAST}).json()
    for hypothesis in body["translations"][0]["hypotheses"]:
        assert all(hypothesis["text"].count(p) == 1 for p in protected), hypothesis["text"]
    libre = client.post("/translate", json={"q": text, "source": "de", "target": "en"}).json()["translatedText"]
    assert all(libre.count(p) == 1 for p in protected), libre
    plain = client.post("/v1/translate", json={"text": GERMAN[0], **FAST}).json()["translations"][0]["text"]
    assert plain == client.post("/v1/translate", json={"text": GERMAN[0], "format": "text", **FAST}).json()["translations"][0]["text"]


def test_auto_gives_back_what_has_no_letters_and_names_the_text_it_cannot_place(client):
    body = client.post("/v1/translate", json={"text": ["", "12345", " !!! ", GERMAN[0]], "source": "auto", **FAST})
    assert body.status_code == 200, body.text
    assert [t["text"] for t in body.json()["translations"][:3]] == ["", "12345", " !!! "]
    refused = client.post("/v1/translate", json={"text": [GERMAN[0], "Esto es una frase en español, sin duda alguna."],
                                                 "source": "auto", **FAST})
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("text 1: "), refused.text


def test_detecting_many_texts_languages_runs_off_the_event_loop(client, monkeypatch):
    """lingua holds the GIL for a text's whole detection (1.4 ms among de/en, 6.8 ms among NLLB-200's 75):
    a request whose detection would take more than a few milliseconds is prepared on a thread."""
    import asyncio

    from nmt_serve.service import pipeline

    on_threads = []
    to_thread = asyncio.to_thread

    async def recorded(function, *args, **kwargs):
        on_threads.append(getattr(function, "__name__", ""))
        return await to_thread(function, *args, **kwargs)

    monkeypatch.setattr(pipeline.asyncio, "to_thread", recorded)
    for texts, source, threaded in (([GERMAN[0]], "auto", False), (GERMAN[:2] * 4, "auto", True), (GERMAN[:2] * 4, "de", False)):
        on_threads.clear()
        response = client.post("/v1/translate", json={"text": texts, "source": source, **FAST})
        assert response.status_code == 200, response.text
        assert ("<lambda>" in on_threads) == threaded, (len(texts), source)
    assert pipeline.detection_ms(1, 75) > pipeline.INLINE_DETECTION_MS > pipeline.detection_ms(1, 2)


def test_scores_and_hypotheses(client):
    body = client.post("/v1/translate", json={"text": GERMAN[:2], "beam_size": 3, "num_hypotheses": 3, "max_length": 6, "return_scores": True}).json()
    for t in body["translations"]:
        assert len(t["hypotheses"]) == 3 and t["score"] <= 0 and t["hypotheses"][0]["text"] == t["text"]


def test_empty_strings_translate_to_empty_strings(client):
    body = client.post("/v1/translate", json={"text": ["", GERMAN[0], " "], **FAST}).json()
    # nothing to translate: the text (its whitespace) comes back as it was
    assert body["translations"][0]["text"] == "" and body["translations"][2]["text"] == " "


def test_other_direction(client):
    body = client.post("/v1/translate", json={"text": "A dog runs.", "source": "en", "target": "de", **FAST}).json()
    assert body["model"] == "en-de"


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "payload, status, type_, param",
    [
        ({"text": [], **FAST}, 400, "invalid_request", "text"),
        ({"text": "Hallo", "source": "fr", "target": "en"}, 400, "invalid_request", "source"),
        ({"text": "Hallo", "source": "de", "target": "fr"}, 400, "invalid_request", "target"),
        ({"text": ["Hallo"] * 9}, 413, "request_too_large", "text"),
        ({"text": "a" * 201}, 413, "request_too_large", "text"),
        ({"text": " ".join(["Hund"] * 45)}, 413, "request_too_large", "text"),
        ({"text": "Hallo", "beam_size": 9}, 422, "validation_error", "beam_size"),
        ({"text": "Hallo", "beam_size": 0}, 422, "validation_error", "beam_size"),
        ({"text": "Hallo", "beam_size": 2, "num_hypotheses": 9}, 422, "validation_error", "num_hypotheses"),
        ({"text": 5}, 422, "validation_error", None),
        ({"text": "Hallo", "bogus": 1}, 422, "validation_error", "bogus"),
    ],
)
def test_errors_have_one_shape(client, payload, status, type_, param):
    assert_error(client.post("/v1/translate", json=payload), status, type_, param)


def test_text_that_is_not_valid_unicode_is_422_not_500(client):
    # half a surrogate pair, as JSON's escapes carry it (json.dumps writes ASCII escapes)
    for path, body, param in (("/v1/translate", {"text": "Ein Hund \ud83d rennt."}, "text"),
                              ("/v1/translate", {"text": ["Hallo", "\udc00"], "source": "auto"}, "text"),
                              ("/v1/translate", {"text": "Hallo", "source": "\ud83d"}, "source"),
                              ("/v1/translate", {"text": "Hallo", "glossary": [{"source": "Hallo", "target": "\udc00"}]},
                               "glossary.0.target"),
                              ("/v1/jobs", {"q": ["Hallo", "\ud83d"]}, "q"),
                              ("/v1/attention", {"text": "Hallo", "target_text": "\ud83d"}, "target_text")):
        r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
        assert "unicode" in assert_error(r, 422, "validation_error", param)["message"].lower(), body
    r = client.post("/v1/translate", content=json.dumps({"text": "Hallo", "\ud83d": 1}), headers={"content-type": "application/json"})
    assert "unicode" in assert_error(r, 422, "validation_error")["message"].lower()


def test_unknown_pair_names_supported_pairs(client):
    error = assert_error(client.post("/v1/translate", json={"text": "x", "source": "fr", "target": "de"}), 400)
    assert "de-en" in error["message"] and "en-de" in error["message"]


def test_limits_are_stated(client):
    error = assert_error(client.post("/v1/translate", json={"text": ["Hallo"] * 9}), 413)
    assert "8" in error["message"]


def test_malformed_json_is_422(client):
    r = client.post("/v1/translate", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 422, "validation_error")
    # a body that is not JSON: where it breaks is in the message, not taken for a parameter's name
    broken = assert_error(client.post("/v1/translate", content=b'{"text": "a",, }', headers={"content-type": "application/json"}),
                          422, "validation_error")
    assert broken["param"] is None and "not valid JSON" in broken["message"] and "character 13" in broken["message"]
    # a union's branch ("str", "list[str]") is not part of the parameter's name
    assert assert_error(client.post("/v1/translate", json={"text": ["a", 5]}), 422, "validation_error")["param"] in ("text", "text.1")


def test_unknown_route_has_the_error_shape(client):
    assert_error(client.get("/nowhere"), 404, "http_error")


def test_queue_full_is_503_with_retry_after(models_dir):
    with make_client(models_dir, max_queue_sentences=1, retry_after_s=3) as c:
        wait_ready(c)
        error = assert_error(c.post("/v1/translate", json={"text": ["Hallo", "Guten Tag"], **FAST}), 503, "overloaded")
        assert "queue" in error["message"]
        assert c.post("/v1/translate", json={"text": ["Hallo", "Guten Tag"], **FAST}).headers["retry-after"] == "3"
        assert c.post("/v1/translate", json={"text": "Hallo", **FAST}).status_code == 200


def test_overload_seen_in_the_engine_status_is_refused_before_the_engine(models_dir, monkeypatch):
    """The engine's last status says its admitted work takes 100 s: a request with a 30 s deadline
    is refused by the API process itself (no tokenizing, no round trip); with admission off it is not."""
    from nmt_serve.service.engine_client import EngineClient

    monkeypatch.setattr(EngineClient, "backlog_seconds", lambda self: 100.0)
    with make_client(models_dir) as c:
        wait_ready(c)
        r = c.post("/v1/translate", json={"text": "Hallo", **FAST})
        assert assert_error(r, 503, "overloaded") and r.headers["retry-after"] == "100"
        assert c.post("/translate", json={"q": "Hallo", "source": "de", "target": "en"}).status_code == 503  # LibreTranslate too
        metrics = c.get("/metrics").text
        assert "nmt_refused_early_requests_total 2.0" in metrics and "nmt_engine_refused_calls_total 0.0" in metrics
    with make_client(models_dir, admission=False) as c:
        wait_ready(c)
        assert c.post("/v1/translate", json={"text": "Hallo", **FAST}).status_code == 200


def test_admission_rate_is_the_engine_rate_admission_starts_from(models_dir):
    """The setting reaches the engine process, which starts admission from it instead of calibrating."""
    with make_client(models_dir, admission_rate=4321) as c:
        wait_ready(c)
        assert "nmt_engine_rate_units_per_second 4321.0" in c.get("/metrics").text


def test_backlog_is_read_from_the_engine_status():
    from types import SimpleNamespace

    from nmt_serve.service.engine_client import EngineClient
    from nmt_serve.service.engine_pool import EnginePool

    first, second = SimpleNamespace(status=None, ready=False), SimpleNamespace(status=None, ready=False)
    engine = EngineClient(EnginePool([first]))
    assert engine.backlog_seconds() == 0.0 and engine.refusal(30.0, 0.8) is None
    first.status, first.ready = SimpleNamespace(stats={"pending_units": 2500.0, "rate_units_per_second": 100.0}), True
    assert engine.backlog_seconds() == 25.0
    assert engine.refusal(30.0, 0.8).status == 503 and engine.refusal(30.0, 0.9) is None  # 25 s > 24 s, not > 27 s
    # with several engines, what a call would wait for: the least busy ready engine's backlog
    engine = EngineClient(EnginePool([first, second]))
    second.status = SimpleNamespace(stats={"pending_units": 500.0, "rate_units_per_second": 100.0})
    assert engine.backlog_seconds() == 25.0  # the second is not ready: its backlog says nothing
    second.ready = True
    assert engine.backlog_seconds() == 5.0 and engine.refusal(30.0, 0.8) is None


def test_request_past_its_deadline_is_504(models_dir):
    with make_client(models_dir, request_timeout_s=0.001) as c:
        wait_ready(c)
        assert_error(c.post("/v1/translate", json={"text": "Hallo", **FAST}), 504, "timeout")
    with make_client(models_dir) as c:
        wait_ready(c)
        slow = {"text": distinct("Ein Hund rennt über die Wiese.", 64), "beam_size": 8, "max_length": 250}
        assert_error(c.post("/v1/translate", json=slow, headers={"X-Request-Timeout": "0.3"}), 504, "timeout")
        assert c.post("/v1/translate", json={"text": "Hallo", **FAST}).status_code == 200  # the server goes on
        wait_for(lambda: metric(c, "nmt_engine_calls_in_flight") == 0)  # the timed-out work was dropped


# ---------------------------------------------------------------------------------------- batching


def test_concurrent_requests_share_model_batches(models_dir):
    texts = [f"Ein Hund Nummer {i} rennt über die Wiese." if i % 2 else f"Kind {i} spielt." for i in range(16)]
    with make_client(models_dir, max_batch_sentences=64) as c:
        wait_ready(c)
        alone = [c.post("/v1/translate", json={"text": t, **FAST, "return_scores": True}).json()["translations"][0] for t in texts]
        wait_for(lambda: metric(c, "nmt_engine_sentences_joined_total") == len(texts))
        before = metric(c, "nmt_engine_steps_total")
        # the engine stopped until every call is sent: whether 16 threads' requests overlap must not depend on
        # how fast this machine answers one of them
        state = c.app.state.service
        os.kill(state.supervisor.pid, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(16) as pool:
                sent = [pool.submit(c.post, "/v1/translate", json={"text": t, **FAST, "return_scores": True}) for t in texts]
                wait_for(lambda: state.engine.engines.in_flight() == len(texts))
                os.kill(state.supervisor.pid, signal.SIGCONT)
                replies = [future.result() for future in sent]
        finally:
            os.kill(state.supervisor.pid, signal.SIGCONT)
        wait_for(lambda: metric(c, "nmt_engine_sentences_joined_total") == 2 * len(texts))
        steps = metric(c, "nmt_engine_steps_total") - before
    # alone, each took up to max_length steps; together they shared steps
    assert steps < len(texts) * FAST["max_length"] / 2, f"{len(texts)} concurrent requests took {steps} steps"
    for text, reply, single in zip(texts, replies, alone):
        got = reply.json()["translations"][0]
        assert got["text"] == single["text"]  # each caller gets exactly its own result
        assert got["score"] == pytest.approx(single["score"], abs=1e-4)


def test_batching_can_be_turned_off(models_dir):
    with make_client(models_dir, batching=False) as c:
        wait_ready(c)
        before = metric(c, "nmt_engine_joins_total")
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda t: c.post("/v1/translate", json={"text": t, **FAST}), GERMAN + GERMAN[:2]))
        wait_for(lambda: metric(c, "nmt_engine_joins_total") - before == 6)  # one request at a time


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
    assert 0.0 <= body["source_entropy"] <= 1.0  # what the detached quality flag reads


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


# ---------------------------------------------------------------------------------------- operations


def test_models_endpoint(client):
    models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
    assert set(models) == {"de-en", "en-de"}
    assert models["de-en"]["parameters"] > 0 and models["de-en"]["device"] == "cpu" and models["de-en"]["dtype"] == "float32" and models["de-en"]["quantization"] == "none"
    # what it costs: its load time and the memory plan it was loaded under
    memory = models["de-en"]["memory"]
    assert models["de-en"]["load_seconds"] > 0
    assert memory["weights_bytes"] >= models["de-en"]["parameters"] * 4 and memory["running_sentences"] >= 1  # float32, and the runner's copies
    assert memory["beams"]["4"]["rows"] == 4 * memory["running_sentences"] and 0 < memory["planned_bytes_all_models"] <= memory["budget_bytes"]


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
    before_joined = metric(client, "nmt_engine_sentences_joined_total")
    client.post("/v1/translate", json={"text": GERMAN[:2], **FAST})
    assert metric(client, "nmt_requests_total", endpoint="/v1/translate", status="200") == before_requests + 1
    # the engine publishes its statistics every 0.1 s
    wait_for(lambda: metric(client, "nmt_engine_sentences_joined_total") == before_joined + 2)
    wait_for(lambda: metric(client, "nmt_source_tokens_total", model="de-en") > before_tokens)
    text = client.get("/metrics").text
    for name in ("nmt_request_latency_seconds_bucket", "nmt_generated_tokens_total", "nmt_requests_in_flight", "nmt_queue_depth",
                 "nmt_model_load_seconds", "nmt_engine_busy_seconds_total", "nmt_engine_rows_live_total", "nmt_engine_steps_total",
                 "nmt_engine_rate_units_per_second", "nmt_admitted_work_units_total", "nmt_engine_up",
                 "nmt_engine_gc_seconds_total", "nmt_engine_gc_full_collections_total"):
        assert name in text
    # the engine took its start-up heap (the models, the modules) out of the garbage collector's reach
    assert metric(client, "nmt_engine_gc_frozen_objects") > 10_000
    # its start-up as a whole, which holds each model's load
    assert metric(client, "nmt_engine_startup_seconds") > max(metric(client, "nmt_model_load_seconds", model=m) for m in ("de-en", "en-de"))


def test_readiness_turns_200_only_after_load(models_dir):
    with make_client(models_dir) as c:  # the engine process starts and loads in the background
        assert c.get("/health").status_code == 200
        assert_error(c.get("/health/ready"), 503, "not_ready")
        assert_error(c.post("/v1/translate", json={"text": "Hallo"}), 503, "not_ready")
        wait_ready(c)
        assert c.get("/health/ready").json()["models"] == ["de-en", "en-de"]


def test_failed_load_is_reported(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    with make_client(tmp_path) as c:
        wait_for(lambda: "loading failed" in c.get("/health/ready").json()["error"]["message"])
        error = assert_error(c.get("/health/ready"), 503)
        assert str(tmp_path) not in error["message"]


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
    proc = subprocess.run([sys.executable, "-m", "nmt_serve.service", "--models-dir", str(tmp_path / "none")], cwd=ROOT, capture_output=True, text=True, timeout=60)
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


NO_LINGUA = '''
import json, sys, time
from fastapi.testclient import TestClient
from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings

app = create_app(Settings(models_dir=sys.argv[1], device="cpu", language_detection=False))
with TestClient(app, raise_server_exceptions=False) as c:
    deadline = time.time() + 60
    while c.get("/health/ready").status_code != 200:
        assert time.time() < deadline, "not ready"
        time.sleep(0.05)
    named = c.post("/v1/translate", json={"text": "Ein Hund.", "source": "de", "target": "en", "beam_size": 2, "max_length": 8})
    auto = c.post("/v1/translate", json={"text": "Ein Hund.", "source": "auto", "target": "en"})
    detect = c.post("/detect", json={"q": "Ein Hund."})
    languages = c.get("/languages")
    frontend = c.get("/frontend/settings").json()["language"]
    print(json.dumps({"named": named.status_code, "auto": auto.status_code, "message": auto.json()["error"]["message"],
                      "detect": detect.status_code, "languages": languages.status_code,
                      "names": sorted(x["name"] for x in languages.json()), "lingua": "lingua" in sys.modules, "frontend": frontend}))
'''


def test_language_detection_off_needs_no_lingua(models_dir, tmp_path):
    """With language_detection off a request names its source ("auto" and /detect: 400), and neither the
    API process nor the engine loads lingua: here a lingua that fails to import stands first on the path
    of both, as on a machine without the package."""
    (tmp_path / "lingua").mkdir()
    (tmp_path / "lingua" / "__init__.py").write_text('raise ImportError("no lingua here")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", NO_LINGUA, str(models_dir)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["named"], got["auto"], got["detect"], got["languages"]) == (200, 400, 400, 200)
    assert "language detection is off" in got["message"]
    assert got["names"] == ["de", "en"] and not got["lingua"]  # names are the codes without lingua
    assert got["frontend"] == {"source": {"code": "de", "name": "de"}, "target": {"code": "en", "name": "en"}}  # not "auto"
