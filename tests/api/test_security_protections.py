"""The protections an operator exposing the service to the internet relies on, tried as an attacker would:
keys kept out of the logs and compared in constant time, wrong keys rate-limited, no body read for a /v1
request without a key, slow and endless bodies cut off, one rate limit across API workers and a bounded
table of clients, and deeply nested parameters answered 400. The HTTP framing is tried on a real uvicorn
server (httptools, as `python -m nmt_serve.service` runs it) over raw sockets."""
from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import tracemalloc
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import uvicorn
from conftest import free_port, running_server, wait_until_ready
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.server import uvicorn_config
from nmt_serve.service.settings import Settings

KEY = "key-one-0123456789"
FAST = {"beam_size": 1, "max_length": 6}
BODY_LIMIT = 20_000


def make_client(models_dir: Path, **settings) -> TestClient:
    client = TestClient(create_app(Settings(models_dir=str(models_dir), device="cpu", **settings)), raise_server_exceptions=False)
    return client


def ready(client: TestClient) -> TestClient:
    deadline = time.time() + 60
    while client.get("/health/ready").status_code != 200:
        assert time.time() < deadline, "not ready"
        time.sleep(0.05)
    return client


@contextlib.contextmanager
def serving(models_dir: Path, **settings):
    """The app on a real uvicorn server (a thread of this process: its logs reach caplog, and the module's
    constants can be patched); yields its port once ready."""
    values = Settings(models_dir=str(models_dir), device="cpu", **settings)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(create_app(values), values, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", 60, alive=thread.is_alive)
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def server(models_dir):
    # short body timeouts, so that a slow body is cut off within the test's time
    with serving(models_dir, api_keys=KEY, max_body_bytes=BODY_LIMIT, body_timeout_s=2.0, body_min_rate=2000.0) as port:
        yield port


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """One response's status, headers and body (by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of a response"
        body += chunk
    return status, headers, body


def closed_soon(sock: socket.socket, seconds: float, keep_sending: bytes = b"") -> bool:
    """Whether the server closes the connection within `seconds` (while the client goes on sending)."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.05)
    while time.monotonic() < deadline:
        try:
            if keep_sending:
                sock.sendall(keep_sending)
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:  # reset or broken pipe: closed
            return True
    return False


# ---------------------------------------------------------------------------------------- keys


def test_an_api_key_in_the_query_string_stays_out_of_the_access_log(server, caplog):
    """LibreTranslate's clients may send api_key in the query string; uvicorn's access log writes each
    request's path with its query string."""
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    base = f"http://127.0.0.1:{server}"
    for key, expected in ((KEY, 200), ("almost-" + KEY, 403)):
        request = urllib.request.Request(f"{base}/translate?q=Hallo&source=de&api_key={key}&target=en", data=b"", method="POST")
        try:
            status = urllib.request.urlopen(request, timeout=30).status
        except urllib.error.HTTPError as e:
            status = e.code
        assert status == expected
    logged = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access" and "/translate?" in r.getMessage()]
    assert len(logged) == 2, caplog.text
    assert all("api_key=REDACTED" in line and "q=Hallo" in line and "target=en" in line for line in logged), logged
    assert KEY not in caplog.text


def test_the_access_log_follows_the_log_level():
    """uvicorn's loggers take the process's level (--log-level): at warning, no line per request."""
    root, access = logging.getLogger(), logging.getLogger("uvicorn.access")
    before = root.level, access.level
    try:
        for level in (logging.WARNING, logging.INFO):
            root.setLevel(level)
            uvicorn_config(lambda scope, receive, send: None, Settings(), log_config=None)
            assert access.getEffectiveLevel() == level
    finally:
        root.setLevel(before[0])
        access.setLevel(before[1])


def test_the_metrics_token_is_compared_without_telling_its_length(models_dir, monkeypatch):
    import hmac

    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    with make_client(models_dir, metrics_token="scrape-me-0123456789") as c:
        assert c.get("/metrics", headers={"Authorization": "Bearer x"}).status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer scrape-me-0123456789"}).status_code == 200
    assert compared and all(a == b for a, b in compared), compared


def test_wrong_keys_are_rate_limited_per_address(models_dir):
    """Without it, keys can be guessed as fast as the server answers 401."""
    with make_client(models_dir, api_keys=KEY, rate_limit_per_minute=3) as c:
        ready(c)
        for _ in range(3):
            assert c.post("/v1/translate", json={"text": "Hallo", **FAST}, headers={"Authorization": "Bearer guess"}).status_code == 401
        limited = c.post("/v1/translate", json={"text": "Hallo", **FAST}, headers={"Authorization": "Bearer guess"})
        assert limited.status_code == 429, limited.text
        assert set(limited.json()["error"]) == {"type", "message", "param"} and limited.json()["error"]["type"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        # LibreTranslate's routes too, in their shape
        refused = c.post("/translate", json={"q": "Hallo", "source": "de", "target": "en", "api_key": "guess"})
        assert refused.status_code == 429 and isinstance(refused.json()["error"], str)
        # the holder of a valid key, from the same address, has its own budget
        assert c.post("/v1/translate", json={"text": "Hallo", **FAST}, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_v1_refuses_a_request_without_a_key_before_reading_its_body(server):
    """FastAPI reads and parses a body before the route's dependencies run: without a key, 16 MB of JSON
    for /v1/jobs cost seconds of the event loop and hundreds of MB; the 401 must come before the body."""
    for path in ("/v1/jobs", "/v1/translate", "/v1/jobs/file", "/v1/translate_file"):
        for auth in ("", "Authorization: Bearer guess\r\n"):
            with connect(server) as sock:
                # headers announcing a body that never comes: only a refusal before the body answers at all
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
                             f"Content-Length: {BODY_LIMIT}\r\n\r\n".encode())
                status, headers, body = read_response(sock)
            assert status == 401, (path, body)
            assert json.loads(body)["error"]["type"] == "unauthorized" and headers["www-authenticate"] == "Bearer"
    # a body that does come is read past, and the connection serves the next request
    with connect(server) as sock:
        payload = json.dumps({"q": ["Hallo"] * 100, "source": "de", "target": "en"}).encode()
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        assert read_response(sock)[0] == 401
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200


def test_v1_refuses_a_request_past_the_rate_limit_before_reading_its_body(models_dir):
    """Without keys, a rate limit: past it a /v1 request is refused 429 (with Retry-After) before its body is
    read, as a request without a key is where keys are set; the rest of the server is not limited."""
    # one request a minute: the bucket refills in 60 s, which no slow machine takes between these requests
    with serving(models_dir, rate_limit_per_minute=1, body_timeout_s=30.0) as port:
        with connect(port) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock)[0] == 200
        for path in ("/v1/translate", "/v1/jobs"):
            with connect(port) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {BODY_LIMIT}\r\n\r\n".encode())  # a body that never comes
                status, headers, body = read_response(sock)
            assert status == 429, (path, body)
            assert json.loads(body)["error"]["type"] == "rate_limited" and int(headers["retry-after"]) > 0
        with connect(port) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock)[0] == 200


# ---------------------------------------------------------------------------------------- bodies


def test_a_streamed_body_over_the_limit_closes_the_connection(server):
    """A chunked body has no end the server must wait for: past the limit, the 413 closes the connection
    (else uvicorn reads and drops whatever the client goes on sending, for as long as it sends)."""
    chunk = b" " * 4096
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    for path, auth in (("/translate", ""), ("/v1/translate", f"Authorization: Bearer {KEY}\r\n")):
        with connect(server) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
                         "Transfer-Encoding: chunked\r\n\r\n".encode())
            for _ in range(BODY_LIMIT // len(chunk) + 2):
                sock.sendall(framed)
            status, headers, body = read_response(sock)
            assert status == 413, body
            assert headers.get("connection") == "close"
            assert closed_soon(sock, 60, keep_sending=framed), "the server kept reading a body past its limit"
    # without a key, the refusal comes before the body, and closes too
    with connect(server) as sock:
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + framed)
        assert read_response(sock)[0] == 401
        assert closed_soon(sock, 60, keep_sending=framed)


def test_a_slow_body_gets_408_and_the_connection_closes(server):
    """A client that trickles its body (slowloris, R.U.D.Y.) would hold a connection and a request for as
    long as it likes: uvicorn has no timeout on a body. (body_timeout_s is 2 s, body_min_rate 2000 bytes/s here.)
    The bounds in seconds below only end the test on a failure; a busy machine passes them too."""
    for path, auth in (("/v1/translate", f"Authorization: Bearer {KEY}\r\n"), ("/translate", "")):
        with connect(server, timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
                         "Content-Length: 10000\r\n\r\n".encode())
            started = time.monotonic()
            sock.settimeout(0.2)
            answer = b""
            while time.monotonic() - started < 60 and b"\r\n\r\n" not in answer:
                try:
                    sock.sendall(b" ")  # a byte every 0.2 s: never a pause of body_timeout_s, far below 2000 bytes/s
                    answer += sock.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    break
            assert answer.startswith(b"HTTP/1.1 408"), f"{path}: no 408 after {time.monotonic() - started:.1f} s: {answer!r}"
            error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
            if path.startswith("/v1"):
                assert error["type"] == "request_timeout" and set(error) == {"type", "message", "param"}
            else:
                assert isinstance(error, str)
            assert closed_soon(sock, 60, keep_sending=b" ")
    # a body that stops altogether: 408 after body_timeout_s
    with connect(server, timeout=10) as sock:
        sock.sendall(f"POST /v1/translate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
        assert read_response(sock)[0] == 408


def test_a_body_sent_at_a_fair_pace_is_served(server):
    body = json.dumps({"text": "Ein Hund rennt.", **FAST}).encode()
    with connect(server, timeout=30) as sock:
        sock.sendall(f"POST /v1/translate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        time.sleep(0.5)  # a pause shorter than body_timeout_s
        sock.sendall(body[10:])
        status, _, answer = read_response(sock)
        assert status == 200, answer
        # and the connection goes on serving (the body limits leave it open)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200


# ---------------------------------------------------------------------------------------- rate limit


def test_the_rate_limit_table_stays_bounded_under_a_flood_of_clients():
    """Buckets per address (or made-up key): a flood of distinct clients must not grow memory."""
    from nmt_serve.service.security import RateLimiter

    limiter = RateLimiter(2)
    limiter.check("addr:203.0.113.7")  # the table (if any) is set up by the first client
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(50_000):
            limiter.check(f"addr:10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, f"{grown} bytes for 50,000 clients"
    # while the table has room, no client's bucket is given up for another's
    limiter = RateLimiter(2)
    for _ in range(2):
        limiter.check("addr:203.0.113.7")
    for i in range(20_000):
        limiter.check(f"addr:10.0.{i >> 8 & 255}.{i & 255}")
    with pytest.raises(Exception) as refused:
        limiter.check("addr:203.0.113.7")
    assert getattr(refused.value, "status", None) == 429


def test_an_ipv6_client_is_counted_by_its_network():
    """One IPv6 host holds a /64: counted per full address, it would never be limited."""
    from starlette.requests import Request

    from nmt_serve.service.security import client_id

    def request(host: str) -> Request:
        return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "client": (host, 1234)})

    assert client_id(request("2001:db8:1:2::1"), None) == client_id(request("2001:db8:1:2:ffff::9"), None)
    assert client_id(request("2001:db8:1:2::1"), None) != client_id(request("2001:db8:1:3::1"), None)
    assert client_id(request("::ffff:192.0.2.1"), None) == client_id(request("192.0.2.1"), None) == "addr:192.0.2.1"
    assert client_id(request("192.0.2.1"), None) != client_id(request("192.0.2.2"), None)


def test_api_workers_share_one_rate_limit(tmp_path):
    """Each API worker its own limiter would grant rate_limit_per_minute once per worker."""
    from nmt_serve.service.dependencies import rate_limiter
    from nmt_serve.service.state import ServiceState

    workers = [ServiceState(Settings(rate_limit_per_minute=3, engine_socket_dir=str(tmp_path))) for _ in range(3)]
    allowed = 0
    for i in range(12):
        try:
            rate_limiter(workers[i % 3]).check("addr:198.51.100.1")
            allowed += 1
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "status", None) == 429
    assert allowed == 3
    # a single process (no parent's directory) keeps its table in its own memory
    alone = ServiceState(Settings(rate_limit_per_minute=3))
    assert rate_limiter(alone).path is None


def test_a_server_of_two_workers_grants_the_limit_once(models_dir):
    per_minute = 4
    with running_server(models_dir, "--workers", "2", "--rate-limit-per-minute", str(per_minute), timeout=120) as base:
        def status(_):
            # a connection of its own each: the kernel hands them to either worker
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(status, range(24)))
    assert statuses.count(200) == per_minute and statuses.count(429) == 24 - per_minute, statuses


# ---------------------------------------------------------------------------------------- parameters


def test_deeply_nested_libretranslate_parameters_are_400_not_500(models_dir):
    with make_client(models_dir) as c:
        ready(c)
        depth = 900  # within what json.loads takes
        body = '{"q": ' + "[" * depth + '"Hallo"' + "]" * depth + ', "source": "de", "target": "en"}'
        for path in ("/translate", "/detect"):
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
            assert isinstance(r.json()["error"], str)


def test_unpaired_surrogates_are_found_at_any_depth():
    from nmt_serve.service.limits import unpaired_surrogate

    deep: list = ["Hund \udc00"]
    for _ in range(100_000):
        deep = [deep]
    assert "U+DC00" in unpaired_surrogate({"q": deep})
    assert unpaired_surrogate([[["ok"]], {"a": ["b", {"c": "d"}]}]) is None
    assert "U+D83D" in unpaired_surrogate(["ok", {"x": ["\ud83d", "\udc00"]}])  # the first one, in order


def test_json_nested_past_what_the_parser_takes_is_400_not_500(models_dir):
    """json.loads raises RecursionError (not a ValueError) for lists nested some thousand deep."""
    from test_service import make_client, wait_ready

    with make_client(models_dir) as client:
        wait_ready(client)
        body = '{"q": ' + "[" * 100_000 + "]" * 100_000 + ', "source": "de", "target": "en"}'
        r = client.post("/translate", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        r = client.post("/translate", data={"q": "Hallo", "source": "de", "target": "en", "glossary": "[" * 100_000 + "]" * 100_000})
        assert r.status_code == 400, r.text


def test_idle_connections_are_closed_and_connections_past_the_limit_refused(models_dir):
    """keep_alive_s: an idle connection is closed after it (not held open for ever); max_connections: a
    request on a connection past the limit is refused with 503 at once, and served again once others closed.
    The bounds in seconds only end the test on a failure."""
    with serving(models_dir, keep_alive_s=1.0, max_connections=2) as port:
        first, second = connect(port, timeout=30), connect(port, timeout=30)
        try:
            for sock in (first, second):
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(sock)[0] == 200
            with connect(port) as third:
                third.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(third)[0] == 503
            assert closed_soon(first, 30) and closed_soon(second, 30)  # idle past keep_alive_s
        finally:
            first.close()
            second.close()
        deadline = time.monotonic() + 30
        while True:  # served again once the server has let the idle ones go
            with connect(port) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                if read_response(sock)[0] == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_request_head_too_large_or_too_slow_is_cut_off(models_dir):
    """uvicorn takes a head of any size and waits for it for ever: past max_header_bytes 431 and the
    connection closed; a connection that sends nothing, or trickles its head, closed after header_timeout_s;
    a head within both is served as before. The bounds in seconds only end the test on a failure."""
    with serving(models_dir, header_timeout_s=2.0, max_header_bytes=4096) as port:
        with connect(port) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 8192 + b"\r\n\r\n")
            status, headers, _ = read_response(sock)
            assert status == 431 and headers.get("connection") == "close"
            assert closed_soon(sock, 30)
        with connect(port) as sock:
            sock.sendall(b"GET /health?" + b"q" * 8192 + b" HTTP/1.1\r\nHost: x\r\n\r\n")  # a long URL counts too
            assert read_response(sock)[0] == 431
        with connect(port, timeout=30) as silent, connect(port, timeout=30) as trickling:
            trickling.sendall(b"GET /health HTTP/1.1\r\n")
            assert closed_soon(silent, 30)
            assert closed_soon(trickling, 30, keep_sending=b"X: y\r\n")  # a header every 50 ms, never the end
        with connect(port, timeout=30) as sock:
            for _ in range(2):  # within the bounds, on one kept-alive connection, with a pause between
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 2000 + b"\r\n\r\n")
                assert read_response(sock)[0] == 200
                time.sleep(0.5)


@pytest.mark.parametrize("drain", [False, True])
def test_a_connection_accepted_before_a_shutdown_gets_an_answer(models_dir, drain):
    """A client whose connection was accepted just before a graceful shutdown sends its request a moment later.
    A worker retired by its parent (SIGHUP, SIGTTOU: the server goes on) translates it; a whole server draining
    (SIGTERM, which refuses new work) answers 503 with Retry-After. Either way with `connection: close`, and the
    server ends after it. uvicorn closed such a connection at once: the client's request was reset."""
    values = Settings(models_dir=str(models_dir), device="cpu")
    port = free_port()
    app = create_app(values)
    server = uvicorn.Server(uvicorn_config(app, values, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", 60, alive=thread.is_alive)
        connections = server.server_state.connections  # uvicorn's, one per accepted connection
        deadline = time.monotonic() + 30
        while connections:  # the readiness probes' gone
            assert time.monotonic() < deadline, connections
            time.sleep(0.01)
        with connect(port, timeout=30) as sock:
            while not connections:  # accepted (the kernel's handshake alone is not)
                assert time.monotonic() < deadline, "the connection was not accepted"
                time.sleep(0.01)
            app.state.service.draining = drain  # (what server.py's SIGTERM handler sets)
            server.should_exit = True
            # uvicorn stops listening and goes over the open connections in one step: once a new connection is
            # refused, this one has been through the shutdown
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except ConnectionRefusedError:
                    break
                assert time.monotonic() < deadline, "the server did not stop listening"
                time.sleep(0.02)
            body = json.dumps({"text": "Ein Hund rennt.", "source": "de", "target": "en", "max_length": 8}).encode()
            sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            status, headers, answer = read_response(sock)
            assert headers.get("connection") == "close", (status, answer)
            if drain:
                assert status == 503 and headers.get("retry-after"), (status, answer)
            else:
                assert status == 200 and json.loads(answer)["translations"][0]["text"], (status, answer)
        thread.join(30)
        assert not thread.is_alive()
    finally:
        server.should_exit = True
        thread.join(30)
