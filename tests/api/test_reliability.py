"""Reliability and security: access control, limits, bad input, fuzzing, deadlines, dropped work,
overload, soak, graceful shutdown and start-up faults. Loopback only, every loop bounded."""
from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, distinct, free_port, post_json, processes, running_server, wait_until_ready
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings

FAST = {"beam_size": 1, "max_length": 6}


def make_client(models_dir: Path, **settings) -> TestClient:
    values = dict(models_dir=str(models_dir), device="cpu")
    values.update(settings)
    return TestClient(create_app(Settings(**values)), raise_server_exceptions=False)


def ready(client: TestClient) -> TestClient:
    deadline = time.time() + 30
    while client.get("/health/ready").status_code != 200:
        assert time.time() < deadline, "not ready"
        time.sleep(0.02)
    return client


def assert_error(response, status: int, type_: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"type", "message", "param"}
    if type_:
        assert error["type"] == type_
    return error


# ---------------------------------------------------------------------------------------- access control


@pytest.fixture(scope="module")
def secured(models_dir):
    with make_client(models_dir, api_keys="key-one,key-two", metrics_token="scrape-me", rate_limit_per_minute=0) as c:
        yield ready(c)


def test_api_keys_are_required_where_it_matters(secured, caplog):
    caplog.set_level(logging.DEBUG)
    error = assert_error(secured.post("/v1/translate", json={"text": "Hallo", **FAST}), 401, "unauthorized")
    assert "Bearer" in error["message"]
    assert secured.post("/v1/translate", json={"text": "Hallo", **FAST}).headers["www-authenticate"] == "Bearer"
    assert_error(secured.post("/v1/translate", json={"text": "Hallo", **FAST}, headers={"Authorization": "Bearer nope"}), 401)
    assert secured.post("/v1/translate", json={"text": "Hallo", **FAST}, headers={"Authorization": "Bearer key-two"}).status_code == 200
    assert_error(secured.post("/v1/attention", json={"text": "Hallo"}), 401)
    assert_error(secured.get("/v1/models"), 401)
    # LibreTranslate clients send the key in the body, and read upstream's 403 {"error": "message"}
    refused = secured.post("/translate", json={"q": "Hallo", "source": "de", "target": "en"})
    assert refused.status_code == 403 and isinstance(refused.json()["error"], str)
    assert secured.post("/translate", json={"q": "Hallo", "source": "de", "target": "en", "api_key": "key-one"}).status_code == 200
    # open: health, readiness, languages, the viewer page
    for path in ("/health", "/health/ready", "/languages", "/ui/"):
        assert secured.get(path).status_code == 200, path
    # metrics behind their own token
    assert_error(secured.get("/metrics"), 401)
    assert secured.get("/metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 200
    assert "key-one" not in caplog.text and "key-two" not in caplog.text


def test_rate_limit_per_key(models_dir):
    with make_client(models_dir, api_keys="a,b", rate_limit_per_minute=3) as c:
        ready(c)
        as_a = {"Authorization": "Bearer a"}
        for _ in range(3):
            assert c.post("/v1/translate", json={"text": "Hallo", **FAST}, headers=as_a).status_code == 200
        limited = c.post("/v1/translate", json={"text": "Hallo", **FAST}, headers=as_a)
        assert_error(limited, 429, "rate_limited")
        assert int(limited.headers["retry-after"]) >= 1
        assert c.post("/v1/translate", json={"text": "Hallo", **FAST}, headers={"Authorization": "Bearer b"}).status_code == 200


def test_cors_is_closed_by_default_and_opens_per_setting(models_dir, secured):
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in secured.options("/v1/translate", headers=preflight).headers
    with make_client(models_dir, cors_origins="https://app.example") as c:
        allowed = c.options("/v1/translate", headers=preflight)
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        other = c.options("/v1/translate", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        # a job's POST from a browser: its Idempotency-Key may be sent, and Idempotent-Replayed and Retry-After read
        job = c.options("/v1/jobs", headers={**preflight, "Access-Control-Request-Headers": "idempotency-key, content-type"})
        assert job.status_code == 200 and "idempotency-key" in job.headers["access-control-allow-headers"].lower()
        answer = c.get("/health/live", headers={"Origin": "https://app.example"})
        assert {"idempotent-replayed", "retry-after"} <= set(answer.headers["access-control-expose-headers"].lower().split(", "))


# ---------------------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def client(models_dir):
    with make_client(models_dir, max_body_bytes=20_000, max_chars_per_text=500, max_tokens_per_text=60) as c:
        yield ready(c)


def test_huge_bodies_are_413(client):
    huge = json.dumps({"text": "Hallo " * 10_000}).encode()
    assert_error(client.post("/v1/translate", content=huge, headers={"content-type": "application/json"}), 413)

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(100):
            yield b" " * 1000

    assert_error(client.post("/v1/translate", content=chunks(), headers={"content-type": "application/json"}), 413)


BAD_BODIES = {
    "deeply nested JSON": ("[" * 5000 + "]" * 5000).encode(),
    "invalid UTF-8": b'{"text": "\xff\xfe\xfa"}',
    "not JSON": b"text=Hallo",
    "JSON null": b"null",
    "a list instead of an object": b'["Hallo"]',
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_malformed_bodies_get_a_4xx_in_the_error_shape(client, name):
    r = client.post("/v1/translate", content=BAD_BODIES[name], headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    assert_error(r, r.status_code)


def test_wrong_content_type(client):
    r = client.post("/v1/translate", content=b'{"text": "Hallo"}', headers={"content-type": "text/plain"})
    assert 400 <= r.status_code < 500
    assert_error(r, r.status_code)


ODD_TEXTS = {
    "control characters": "Ein\x00 Hund\x07 rennt\x1b.",
    "only whitespace": " \t\n ",
    "only emoji": "🐶🐱🦊",
    "right-to-left": "كلب يجري في الحديقة",
    "mixed direction": "Ein Hund שלום rennt.",
    "zero-width characters": "Ein\u200b Hund\u200d rennt\ufeff.",
}


@pytest.mark.parametrize("name", list(ODD_TEXTS))
def test_odd_texts_translate(client, name):
    r = client.post("/v1/translate", json={"text": ODD_TEXTS[name], **FAST})
    assert r.status_code == 200, r.text
    if not ODD_TEXTS[name].strip():  # nothing to translate: the layout comes back as it was
        assert r.json()["translations"][0]["text"] == ODD_TEXTS[name]


def test_very_long_single_token_hits_a_limit(client):
    assert_error(client.post("/v1/translate", json={"text": "x" * 499}), 413)  # 499 chars, far over 60 tokens
    assert_error(client.post("/v1/translate", json={"text": "y" * 501}), 413)


@pytest.mark.parametrize(
    "field, value",
    [("beam_size", 0), ("beam_size", -1), ("beam_size", 10**9), ("max_length", 0), ("max_length", 10**9),
     ("num_hypotheses", 0), ("length_penalty", -1.0), ("length_penalty", 1e9)],
)
def test_out_of_range_options_are_422(client, field, value):
    assert_error(client.post("/v1/translate", json={"text": "Hallo", field: value}), 422)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinite_penalties_are_422(client, literal):
    body = b'{"text": "Hallo", "length_penalty": ' + literal + b"}"
    assert_error(client.post("/v1/translate", content=body, headers={"content-type": "application/json"}), 422)


def test_unknown_fields_rejected_by_v1_and_ignored_by_libretranslate(client):
    assert_error(client.post("/v1/translate", json={"text": "Hallo", "temperature": 0.7}), 422)
    r = client.post("/translate", json={"q": "Hallo", "source": "de", "target": "en", "temperature": 0.7})
    assert r.status_code == 200


def test_bad_deadline_header_is_422(client):
    assert_error(client.post("/v1/translate", json={"text": "Hallo"}, headers={"X-Request-Timeout": "soon"}), 422)
    assert_error(client.post("/v1/translate", json={"text": "Hallo"}, headers={"X-Request-Timeout": "-1"}), 422)
    for spelling in ("1_0", "nan", "1e400", "0x10", "inf"):  # float() reads each of these
        assert_error(client.post("/v1/translate", json={"text": "Hallo"}, headers={"X-Request-Timeout": spelling}), 422)
    for spelling in ("10", "2.5", ".5", " 3 "):
        assert client.post("/v1/translate", json={"text": "Hallo"}, headers={"X-Request-Timeout": spelling}).status_code == 200


def test_fuzz_the_api_from_its_openapi_schema(client):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from schemathesis.core import NOT_SET

    document = client.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document)
    schema = schema.exclude(path_regex="^/metrics$")  # not JSON
    # LibreTranslate's routes answer in its shape, {"error": "message"}
    plain = {(method.upper(), path) for path, item in document["paths"].items() for method, op in item.items()
             if "LibreTranslate compatible" in op.get("tags", ())}
    failures = []

    for operation in schema.get_all_operations():
        op = operation.ok()

        @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case):
            body = {} if case.body is NOT_SET else {"json": case.body}
            query = case.query if case.query is not NOT_SET else None
            response = client.request(case.method, case.formatted_path, params=query, headers=dict(case.headers or {}), **body)
            if response.status_code >= 500:
                failures.append((case.method, case.formatted_path, case.body, response.status_code, response.text))
            elif response.status_code >= 400:
                error = response.json().get("error", {})
                if (case.method.upper(), case.path) in plain:
                    if not isinstance(error, str) or not error:
                        failures.append((case.method, case.formatted_path, case.body, response.status_code, response.text))
                elif set(error) != {"type", "message", "param"}:
                    failures.append((case.method, case.formatted_path, case.body, response.status_code, response.text))

        given(case=op.as_strategy())(check)()
    assert not failures, failures[:3]


# ---------------------------------------------------------------------------------------- deadlines and dropped work


def engine_settles(client: TestClient, condition, timeout: float = 2.0) -> bool:
    """Wait until the engine's published statistics meet `condition`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition(client.app.state.service.metrics.engine.stats):
            return True
        time.sleep(0.05)
    return False


def test_deadline_header_gives_504_and_the_dropped_job_is_dropped(models_dir):
    with make_client(models_dir) as c:
        ready(c)
        slow = {"text": distinct("Ein Hund rennt über die Wiese.", 64), "beam_size": 8, "max_length": 250}  # seconds of work
        # the API keeps the deadline itself: the 504 comes while the engine can answer nothing
        engine = c.app.state.service.supervisor.pid
        os.kill(engine, signal.SIGSTOP)
        try:
            assert_error(c.post("/v1/translate", json=slow, headers={"X-Request-Timeout": "0.2"}), 504, "timeout")
        finally:
            os.kill(engine, signal.SIGCONT)
        assert engine_settles(c, lambda stats: stats["calls_in_flight"] == 0 and stats["running_sentences"] == 0)
        assert_error(c.post("/v1/translate", json=slow, headers={"X-Request-Timeout": "0.2"}), 504, "timeout")
        # the engine dropped the call: nothing of it is in flight long before it could have finished
        assert engine_settles(c, lambda stats: stats["calls_in_flight"] == 0 and stats["running_sentences"] == 0)
        assert 'nmt_dropped_requests_total{reason="timeout"} 2.0' in c.get("/metrics").text


def test_disconnected_client_work_is_dropped(models_dir):
    import uvicorn

    app = create_app(Settings(models_dir=str(models_dir), device="cpu"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_ready(base, 30)
        stats = app.state.service.metrics.engine
        # seconds of work: the random model writes 250 tokens for 56 of these 64 texts (8 end after 22-34)
        body = json.dumps({"text": distinct("Verschwunden Verschwunden", 64), "beam_size": 8, "max_length": 250}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.time() + 10
            while stats.stats.get("running_sentences", 0) < 48:  # it runs ... then the client goes away
                assert time.time() < deadline
                time.sleep(0.02)
        deadline = time.time() + 2
        while stats.stats.get("calls_in_flight", 1) or stats.stats.get("running_sentences", 1):
            assert time.time() < deadline, "the engine kept working for a client that left"
            time.sleep(0.05)
        with urllib.request.urlopen(base + "/metrics") as r:
            assert 'nmt_dropped_requests_total{reason="disconnect"} 1.0' in r.read().decode()
    finally:
        server.should_exit = True
        thread.join(10)


# ---------------------------------------------------------------------------------------- load, soak, shutdown


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def server_pid(port: int) -> int:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "-m nmt_serve.service" in line and f"--port {port}" in line:
            return int(line.split()[0])
    raise AssertionError("server process not found")


def test_overload_refuses_fast_accepted_requests_complete_and_health_stays_responsive(models_dir):
    slow = {"text": distinct("Ein Hund rennt über die Wiese.", 4), "beam_size": 4, "max_length": 40}
    port = free_port()
    with running_server(models_dir, "--max-queue-sentences", "16", "--max-batch-sentences", "8", "--retry-after-s", "2",
                        port=port) as base:
        [engine] = processes(b"nmt_serve.engine.process", parent=server_pid(port))
        # the engine stopped while the burst reaches the API: the probes below answer while every request waits
        # on an engine that cannot move, so none of them can have waited for the engine's work
        os.kill(engine, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(24) as pool:
                futures = [pool.submit(post_json, base + "/v1/translate", slow) for _ in range(48)]
                hang = time.monotonic() + 120  # (a guard against a hang, not a pace)
                while metric(scrape(base), "nmt_requests_in_flight") < 25:  # 24 translations and this scrape
                    assert not any(f.done() for f in futures), next(f.result() for f in futures if f.done())
                    assert time.monotonic() < hang, "the burst never reached the API"
                    time.sleep(0.02)
                for _ in range(5):
                    with urllib.request.urlopen(base + "/health", timeout=10) as r:  # (the timeout: a hang, not a pace)
                        assert r.status == 200
                assert not any(f.done() for f in futures)
                os.kill(engine, signal.SIGCONT)
                results = [f.result(timeout=120) for f in futures]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGCONT)
        statuses = [r[0] for r in results]
        assert set(statuses) <= {200, 503}
        assert statuses.count(503) > 0 and statuses.count(200) > 0
        for status, headers, body in results:
            if status == 503:  # queue full (the setting's Retry-After) or predicted past the deadline (admission's)
                assert int(headers.get("retry-after")) >= 1 and body["error"]["type"] == "overloaded"
            else:
                assert len(body["translations"]) == 4  # every accepted request got its full answer
        print(f"\noverload: {statuses.count(200)} served, {statuses.count(503)} refused")


def test_soak_resident_memory_levels_off(models_dir):
    port = free_port()
    with running_server(models_dir, port=port) as base:
        pid = server_pid(port)
        texts = ["Ein Hund rennt.", "Zwei Kinder spielen im Schnee.", "Eine Frau liest ein Buch.", "Hallo"]

        def one(i):
            status, _, _ = post_json(base + "/v1/translate", {"text": [texts[i % 4], texts[(i + 1) % 4]], "beam_size": 2, "max_length": 8})
            return status

        samples = []
        with ThreadPoolExecutor(8) as pool:
            for round_ in range(6):
                statuses = list(pool.map(one, range(round_ * 400, (round_ + 1) * 400)))
                assert statuses == [200] * 400
                samples.append(rss_kb(pid))
        growth_after_warmup = samples[-1] - samples[1]
        print(f"\nsoak: 2400 requests, RSS MiB after each 400: {[round(s / 1024, 1) for s in samples]}")
        assert growth_after_warmup < 15 * 1024, f"RSS grew {growth_after_warmup / 1024:.1f} MiB after warm-up"


def test_graceful_shutdown_finishes_in_flight_requests(models_dir):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_serve.service", "--port", str(port), "--models-dir", str(models_dir), "--device", "cpu"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, 60, alive=lambda: proc.poll() is None)
        slow = {"text": distinct("Ein Hund rennt über die Wiese.", 32), "beam_size": 4, "max_length": 60}
        [engine] = processes(b"nmt_serve.engine.process", parent=proc.pid)
        # the engine stopped until the request is in the API's hands: in flight however fast this machine translates
        os.kill(engine, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(1) as pool:
                in_flight = pool.submit(post_json, base + "/v1/translate", slow)
                while True:  # the scrape is one request in flight, the translation the other
                    scraped = urllib.request.urlopen(base + "/metrics").read().decode()
                    if float(re.search(r"^nmt_requests_in_flight (\S+)", scraped, re.M)[1]) >= 2:
                        break
                    assert not in_flight.done(), in_flight.result()
                    time.sleep(0.02)
                proc.send_signal(signal.SIGTERM)
                os.kill(engine, signal.SIGCONT)
                status, _, body = in_flight.result(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # gone with the server, where all went well
                os.kill(engine, signal.SIGCONT)
        assert status == 200 and len(body["translations"]) == 32
        # uvicorn ends by re-raising the SIGTERM it handled, after the graceful part is done
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        with pytest.raises(OSError):
            urllib.request.urlopen(base + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def metric(scraped: str, name: str) -> float | None:
    """The value of the sample `name` (with its labels, as Prometheus writes them) in a scrape."""
    for line in scraped.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def scrape(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        return r.read().decode()


def start_workers(models_dir: Path, log_path: Path, *args: str, workers: int = 2) -> tuple[subprocess.Popen, int]:
    """`--workers N` as a real process, its output in log_path; returns once every worker is ready and the port
    takes connections. Each worker logs `ready` (in the service's format) when it has its models: one worker's
    readiness says nothing of the others, which take connections from the engine's first status on and answer
    503 until their models are in. The parent's socket listens from the start (test_workers_socket_listens_...)."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nmt_serve.service", "--port", str(port), "--models-dir", str(models_dir), "--device", "cpu",
             "--workers", str(workers), *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    ready = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ INFO service: ready: de-en, en-de$", re.M)
    deadline = time.time() + 180
    while len(ready.findall(log_path.read_text())) < workers:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"the workers did not all become ready: {log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=30).close()
            return proc, port
        except ConnectionRefusedError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"the port took no connection: {log_path.read_text()[-3000:]}") from None
            time.sleep(0.05)


def test_workers_socket_listens_before_any_worker_accepts():
    """The parent's socket listens from the start: a client that connects while the workers start waits in the
    backlog for the first of them instead of being refused."""
    from nmt_serve.service.workers import listening_socket

    settings = Settings(host="127.0.0.1", port=free_port(), workers=2)
    sock = listening_socket(settings)
    try:
        client = socket.create_connection(("127.0.0.1", settings.port), timeout=5)  # no worker yet
        conn, _ = sock.accept()  # as the first worker's server will
        client.sendall(b"GET")
        assert conn.recv(3) == b"GET"
        conn.close()
        client.close()
    finally:
        sock.close()


def test_with_several_workers_a_drain_is_the_drain_of_one_api_process(models_dir, tmp_path):
    """SIGTERM to the parent of two API workers while one request waits on the engine (stopped with
    SIGSTOP before it was sent, so that it stays in flight for as long as the test wants) and another's
    body is half sent. As with one API process: every connection made after the SIGTERM is answered
    or refused, none accepted and left hanging; the listening socket closes in every process (the
    parent's copy too) while the request in flight is held, so the workers drain together, not one
    after another; the half-sent request, complete only once the socket is closed, gets 503 as a new
    request would (its worker's readiness went down at the SIGTERM); the request in flight gets 200
    once the engine runs again; the parent exits 0 once the workers and then the engine have stopped;
    each worker logs as one API process does."""
    log_path = tmp_path / "server.log"
    proc, port = start_workers(models_dir, log_path, "--graceful-shutdown-s", "300", "--request-timeout-s", "600",
                               "--engine-heartbeat-timeout-s", "600")
    base = f"http://127.0.0.1:{port}"
    children: list[int] = []
    engine = None
    pool = ThreadPoolExecutor(1)
    try:
        children = processes(parent=proc.pid)
        [engine] = processes(b"nmt_serve.engine.process", parent=proc.pid)
        os.kill(engine, signal.SIGSTOP)  # the API still takes it for ready: no status is overdue before 600 s
        body = json.dumps({"text": "Hallo", "max_length": 5}).encode()
        half_sent = socket.create_connection(("127.0.0.1", port), timeout=60)
        half_sent.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        running = pool.submit(post_json, base + "/v1/translate", {"text": "Hallo", "max_length": 5}, None, 600)
        deadline = time.time() + 120
        # the half-sent request (its app runs once its headers are in), the one running and this scrape,
        # whichever workers hold them
        while (metric(scrape(base), "nmt_requests_in_flight") or 0) < 3:
            assert not running.done(), f"the request ended with the engine stopped: {running.result()}"
            assert time.time() < deadline, "the requests never reached the workers"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 60
        while True:  # until the listening socket is closed everywhere; each connection on the way must be answered
            assert time.time() < deadline, "connections were still accepted a minute after SIGTERM"
            try:
                probe = socket.create_connection(("127.0.0.1", port), timeout=30)
            except ConnectionRefusedError:
                break
            with probe:
                probe.sendall(b"GET /health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                try:
                    probe.recv(1)  # a status line, or the connection closed
                except TimeoutError:
                    pytest.fail("a connection made during the drain was accepted and never answered")
                except ConnectionResetError:
                    pass
            time.sleep(0.05)
        assert not running.done(), "the drain did not wait for the request in flight"
        half_sent.sendall(body[5:])
        answer = b""
        try:
            while chunk := half_sent.recv(65536):  # the answer, then the close (the server is going away)
                answer += chunk
        except TimeoutError:
            pytest.fail("a request completed after the drain began was taken in (it waits on the stopped engine), not refused")
        answer = answer.decode()
        assert answer.startswith("HTTP/1.1 503"), answer[:300]
        assert '"type":"not_ready"' in answer.replace(" ", ""), answer[:300]
        os.kill(engine, signal.SIGCONT)
        status, _, translated = running.result(timeout=600)
        assert status == 200 and len(translated["translations"]) == 1, translated
        assert proc.wait(timeout=300) == 0
        logged = log_path.read_text()
        # each worker logs as one API process does: its own lines in the service's format
        assert len(re.findall(r"^\d{4}-\d\d-\d\d [\d:,]+ INFO service: ready: de-en, en-de$", logged, re.M)) == 2, logged[-3000:]
    finally:
        if engine is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGCONT)
        if proc.poll() is None:  # failed half way: the parent and what it started go
            proc.kill()
            proc.wait()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        pool.shutdown()  # after the kill: the request it runs, if any, has failed


def test_with_several_workers_a_killed_parent_takes_its_processes_along(models_dir, tmp_path):
    """SIGKILL of the parent of two API workers (the OOM killer): its workers and its engine exit too,
    so that none keeps the port (a new server could not bind it) or answers 503 for want of an engine."""
    proc, port = start_workers(models_dir, tmp_path / "server.log")
    children = processes(parent=proc.pid)
    assert len(children) >= 3  # the engine and the two workers

    def running(pid: int) -> bool:
        try:  # an exited child of a dead parent may stay a zombie until its new parent reaps it
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    try:
        proc.kill()
        proc.wait()
        deadline = time.time() + 120
        while left := [pid for pid in children if running(pid)]:
            assert time.time() < deadline, f"still running two minutes after their parent was killed: {left}"
            time.sleep(0.1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=30).close()
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_with_several_workers_sighup_replaces_them_and_ttin_ttou_change_how_many(models_dir, tmp_path):
    """As uvicorn's and gunicorn's supervisors take them: SIGHUP replaces every worker, one after another,
    each old one draining once its replacement is ready, while requests go on being answered 200;
    SIGTTIN adds a worker, SIGTTOU retires one (never the last); SIGTERM then stops all as before.
    Before, SIGHUP's default action ended the parent on the spot, and TTIN/TTOU stopped it."""
    log_path = tmp_path / "server.log"
    proc, port = start_workers(models_dir, log_path)
    base = f"http://127.0.0.1:{port}"

    def workers() -> list[int]:
        return sorted(processes(b"spawn_main", b"--multiprocessing-fork", parent=proc.pid))

    def until(check, what: str) -> None:
        deadline = time.time() + 120
        while not check():
            assert proc.poll() is None, f"the server exited: {log_path.read_text()[-3000:]}"
            assert time.time() < deadline, f"{what}: {log_path.read_text()[-3000:]}"
            time.sleep(0.1)

    statuses: list[int] = []
    done = threading.Event()

    def requests() -> None:
        while not done.is_set():
            statuses.append(post_json(base + "/v1/translate", {"text": "Hallo", "max_length": 5}, None, 120)[0])

    try:
        before = workers()
        assert len(before) == 2
        load = threading.Thread(target=requests)
        load.start()
        until(lambda: len(statuses) >= 2, "no request answered")
        proc.send_signal(signal.SIGHUP)
        until(lambda: "API workers replaced" in log_path.read_text() and len(workers()) == 2 and not set(workers()) & set(before),
              "the workers were not replaced")
        answered = len(statuses)
        until(lambda: len(statuses) >= answered + 2, "no request answered by the new workers")
        done.set()
        load.join()
        assert set(statuses) == {200}, statuses
        proc.send_signal(signal.SIGTTIN)
        until(lambda: len(workers()) == 3, "SIGTTIN added no worker")
        for left in (2, 1):  # one at a time: signals sent together may arrive as one
            proc.send_signal(signal.SIGTTOU)
            until(lambda: len(workers()) == left, "SIGTTOU did not retire a worker")
        proc.send_signal(signal.SIGTTOU)
        until(lambda: "SIGTTOU ignored: the last API worker stays" in log_path.read_text(), "the last worker was not kept")
        assert len(workers()) == 1
        assert post_json(base + "/v1/translate", {"text": "Hallo", "max_length": 5}, None, 120)[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def accepted_by(conn: socket.socket, pids: list[int], timeout: float = 120) -> int:
    """Which of `pids` accepted the connection `conn`: the one holding its server end (found through
    Linux's /proc: the socket whose remote port is conn's local port, among the processes' files)."""
    client, server = conn.getsockname()[1], conn.getpeername()[1]
    deadline = time.time() + timeout
    while time.time() < deadline:  # it waits in the listening socket's queue until a worker accepts it
        ends = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == server and int(fields[2].rsplit(":", 1)[1], 16) == client:
                ends.add(f"socket:[{fields[9]}]")
        for pid in pids:
            with contextlib.suppress(OSError):  # a process or descriptor gone meanwhile
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}") in ends:
                            return pid
        time.sleep(0.05)
    raise AssertionError(f"none of {pids} accepted the connection from port {client}")


def test_several_workers_serve_one_set_of_metrics(models_dir, tmp_path):
    """/metrics of `--workers 2`, whichever worker answers: the requests of both workers summed, never
    going back from one scrape to the next, and the engine's families once."""
    proc, port = start_workers(models_dir, tmp_path / "server.log")
    base = f"http://127.0.0.1:{port}"
    try:
        # requests on connections each worker is known to hold, so that both count some whatever the
        # kernel's choice of acceptor (one worker may well take every connection for a while)
        children = processes(parent=proc.pid)
        taken: dict[int, int] = {}
        requests = 0
        deadline = time.time() + 120
        while len(taken) < 2 or min(taken.values()) < 3:
            assert time.time() < deadline, f"connections reached only {taken} (pid: requests)"
            with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
                worker = accepted_by(conn, children)
                if taken.get(worker, 0) >= 3:
                    continue
                client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                client.sock = conn  # this very connection, not a new one
                client.request("POST", "/v1/translate", json.dumps({"text": "Hallo", "max_length": 5}),
                               {"Content-Type": "application/json", "Connection": "close"})
                assert client.getresponse().status == 200
            taken[worker] = taken.get(worker, 0) + 1
            requests += 1
        translated = 'nmt_requests_total{endpoint="/v1/translate",status="200"}'
        scraped = 'nmt_requests_total{endpoint="/metrics",status="200"}'
        last = {translated: 0.0, scraped: 0.0}
        done = 0
        deadline = time.time() + 60
        while done < 12:  # a request is counted once its response is sent: the last ones may come a little later
            assert time.time() < deadline, f"the requests were not all counted: {last}"
            text = scrape(base)
            values = {name: metric(text, name) or 0.0 for name in last}
            assert all(values[name] >= last[name] for name in last), f"a counter went back: {last} -> {values}"
            assert values[translated] <= requests
            last = values
            done += values[translated] == requests
            # one sample each: the engine's families from the worker that answers, the workers' gauges
            # combined (in flight summed over the live workers, a model's load time the largest), no pid labels
            for sample in ("nmt_engine_up", "nmt_engine_restarts_total", "nmt_queue_depth", 'nmt_sentences_total{model="de-en"}',
                           "nmt_requests_in_flight", 'nmt_model_load_seconds{model="de-en"}'):
                assert len(re.findall(f"^{re.escape(sample)} ", text, re.M)) == 1, (sample, text)
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def test_several_workers_metrics_are_summed_over_the_workers(tmp_path):
    """Each worker counts in files of the shared directory; a scrape, whoever serves it, reads them all,
    and the engine's figures (the same in every worker) once."""
    script = (
        "import sys\n"
        "from nmt_serve.service.metrics import Metrics\n"
        "m = Metrics()\n"
        "for _ in range(int(sys.argv[1])): m.requests.labels('/v1/translate', '200').inc()\n"
        "m.in_flight.inc()\n"
        "m.engine.stats = {'steps': 7.0}\n"
        "from prometheus_client import generate_latest\n"
        "sys.stdout.write(generate_latest(m.registry).decode())\n"
    )
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    run = [subprocess.run([sys.executable, "-c", script, str(n)], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
           for n in (3, 4)]
    scraped = run[-1].stdout
    assert 'nmt_requests_total{endpoint="/v1/translate",status="200"} 7.0' in scraped
    assert "nmt_requests_in_flight 2.0" in scraped  # neither process marked dead: both still count
    assert scraped.count("\nnmt_engine_steps_total ") == 1 and "nmt_engine_steps_total 7.0" in scraped


@pytest.mark.parametrize("damage", ["truncated weights", "mismatched tokenizer", "garbage config"])
def test_broken_checkpoint_fails_start_up_naming_the_file(tmp_path, models_dir, damage):
    bad = tmp_path / "models"
    shutil.copytree(models_dir, bad)
    target = bad / "en-de"
    if damage == "truncated weights":
        data = (target / "model.safetensors").read_bytes()
        (target / "model.safetensors").write_bytes(data[: len(data) // 2])
        expected = "model.safetensors"
    elif damage == "mismatched tokenizer":
        config = json.loads((target / "config.json").read_text())
        config["model"]["src_vocab_size"] = config["model"]["tgt_vocab_size"] = 999
        (target / "config.json").write_text(json.dumps(config))
        expected = "spm.model"
    else:
        (target / "config.json").write_text("{oops")
        expected = "config.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nmt_serve.service", "--port", str(free_port()), "--models-dir", str(bad), "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "model loading failed" in proc.stderr and expected in proc.stderr and "en-de" in proc.stderr


def test_a_memory_budget_too_small_refuses_the_start_before_any_model_loads(models_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "nmt_serve.service", "--port", str(free_port()), "--models-dir", str(models_dir), "--device", "cpu",
         "--memory-budget-gb", "0.0001"], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "do not fit the memory budget" in proc.stderr and "--memory-budget-gb" in proc.stderr and "NMT_MEMORY_BUDGET_GB" in proc.stderr
    assert "loaded de-en" not in proc.stderr


def test_a_restarted_engine_starts_from_the_rate_its_predecessor_learned(models_dir):
    """The engine calibrates once; killed, its replacement starts from the rate the first one kept in the socket
    directory, without a calibration (seconds before it serves again, measured while the machine may be busy)."""
    with make_client(models_dir, admission_rate=0) as c:  # calibrated, whatever NMT_ADMISSION_RATE says
        state = ready(c).app.state.service
        kept = Path(state.supervisor.socket_dir) / "admission_rate.json"
        deadline = time.time() + 60
        while not kept.exists():  # written with the first statuses once it serves
            assert time.time() < deadline, "no rate kept"
            time.sleep(0.02)
        rate = json.loads(kept.read_text())["rate"]
        first = state.engine.engines.status
        assert first.stats["rate_units_per_second"] == pytest.approx(rate, rel=0.02)
        os.kill(state.supervisor.pid, signal.SIGKILL)
        while not (state.ready and state.engine.engines.status.incarnation != first.incarnation):
            assert time.time() < deadline, "the engine did not come back"
            time.sleep(0.02)
        # exactly the kept one: a calibration measures its own
        assert state.engine.engines.status.stats["rate_units_per_second"] == pytest.approx(rate, rel=1e-9)
