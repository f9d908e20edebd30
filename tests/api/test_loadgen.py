"""bench.loadgen against a tiny threaded HTTP server in this process: every request answered once,
statuses and Retry-After as sent, closed mode bounded by its concurrency, burst mode all at once."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from bench.loadgen import LoadResult, Outcome, run_load  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HOLD_S = 30.0  # the longest a held request waits for the others (only a failing run waits it out)


class EchoServer(ThreadingHTTPServer):
    """Answers a JSON body {"i": index, "status": s, "retry_after": r, "sleep": seconds, "hold": n} with that
    status (200 by default, the body echoed), after that sleep; with "hold", not before n requests are in
    flight at once (or HOLD_S passed); records what it received and the most requests it was handling at once."""

    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 would drop the connections of a burst

    def __init__(self):
        super().__init__(("127.0.0.1", 0), EchoHandler)
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.held_out = False  # a held request waited HOLD_S in vain
        self.in_flight = 0
        self.max_in_flight = 0
        self.received: list[int] = []
        self.content_types: set[str] = set()
        self.extra_headers: set[str | None] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/translate"

    def reset(self) -> None:
        with self.lock:
            self.max_in_flight = 0
            self.held_out = False
            self.received.clear()


class EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the load generator expects
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms wait for a delayed ACK between them

    def do_POST(self):
        server: EchoServer = self.server
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        with server.lock:
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            server.received.append(body.get("i"))
            server.content_types.add(self.headers["Content-Type"])
            server.extra_headers.add(self.headers.get("X-Test"))
            server.arrived.notify_all()
            if "hold" in body:  # requests sent at once are all here together, however slowly each arrives
                if not server.arrived.wait_for(lambda: server.max_in_flight >= body["hold"] or server.held_out, timeout=HOLD_S):
                    server.held_out = True  # they were not sent at once: the others are not held
        time.sleep(body.get("sleep", 0))
        with server.lock:  # before answering, so that a client's next request never overlaps this one here
            server.in_flight -= 1
        status = body.get("status", 200)
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if "retry_after" in body:
            self.send_header("Retry-After", body["retry_after"])
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def check_every_request_once(result: LoadResult, server: EchoServer | None, n: int) -> None:
    assert [o.index for o in result.outcomes] == list(range(n))
    if server is not None:
        assert sorted(server.received) == list(range(n))
    assert all(o.started >= 0 and o.latency >= 0 for o in result.outcomes)
    assert result.elapsed == pytest.approx(max(o.started + o.latency for o in result.outcomes))


def test_closed_mode_answers_every_request_once_within_its_concurrency(server):
    server.reset()
    n, concurrency, sleep = 40, 4, 0.02
    bodies = [{"i": i, "sleep": sleep} for i in range(n)]
    result = run_load(server.url, bodies, concurrency=concurrency, processes=2, headers={"X-Test": "yes"})
    check_every_request_once(result, server, n)
    assert result.counts() == {200: n}
    assert server.max_in_flight == concurrency
    assert server.content_types == {"application/json"} and server.extra_headers == {"yes"}
    # n / concurrency rounds of at least `sleep` each, one after another.
    assert result.elapsed >= n / concurrency * sleep
    assert result.throughput() == pytest.approx(n / result.elapsed)
    assert result.throughput(503) == 0
    assert all(o.latency >= sleep for o in result.outcomes)
    assert 0 < result.client_cpu_seconds < result.elapsed * 2


def test_statuses_and_retry_after_are_outcomes(server):
    server.reset()
    n = 30
    bodies = [{"i": i, "status": 503, "retry_after": "7"} if i % 3 == 0 else {"i": i} for i in range(n)]
    result = run_load(server.url, bodies, concurrency=5, processes=2)
    check_every_request_once(result, server, n)
    assert result.counts() == {200: 20, 503: 10}
    for o in result.outcomes:
        assert (o.status, o.retry_after, o.error) == ((503, "7", None) if o.index % 3 == 0 else (200, None, None))
    assert len(result.latencies(503)) == 10 and len(result.latencies(None)) == n
    assert result.latencies(200, indices=[1, 2, 3]) == [result.outcomes[1].latency, result.outcomes[2].latency]
    assert result.throughput(None) == pytest.approx(n / result.elapsed)


def test_burst_mode_sends_everything_at_once(server):
    """Each request is held until all n are in flight: sent one after another (closed mode at concurrency 1),
    the first would wait HOLD_S for the others, none after it, and the most in flight would be 1."""
    server.reset()
    n, sleep = 20, 0.3
    result = run_load(server.url, [{"i": i, "sleep": sleep, "hold": n} for i in range(n)], concurrency=1, mode="burst",
                      processes=2)
    check_every_request_once(result, server, n)
    assert result.counts() == {200: n}
    assert server.max_in_flight == n
    assert sleep <= result.elapsed < HOLD_S  # one round of the sleep once all were in, not a held request's timeout


def test_one_process_and_more_workers_than_requests(server):
    server.reset()
    result = run_load(server.url, [{"i": i} for i in range(5)], concurrency=16, processes=1)
    check_every_request_once(result, server, 5)
    assert result.counts() == {200: 5}


def test_connection_errors_and_timeouts_are_status_0(server):
    with socket.socket() as s:  # a port that nobody listens on
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    refused = run_load(f"http://127.0.0.1:{closed_port}/", [{"i": i} for i in range(4)], concurrency=2)
    check_every_request_once(refused, None, 4)
    assert refused.counts() == {0: 4} and all(o.error for o in refused.outcomes)

    server.reset()
    slow = run_load(server.url, [{"i": 0, "sleep": 1.0}, {"i": 1}], concurrency=2, processes=1, timeout=0.3)
    assert [(o.status, bool(o.error)) for o in slow.outcomes] == [(0, True), (200, False)]
    assert 0.25 < slow.outcomes[0].latency < 1.0  # its timeout, not the 1-s answer


def test_no_bodies_and_bad_arguments():
    assert run_load("http://127.0.0.1:9/", [], concurrency=1) == LoadResult([], 0.0, 0.0)
    with pytest.raises(ValueError):
        run_load("http://127.0.0.1:9/", [{}], concurrency=1, mode="open")
    with pytest.raises(ValueError):
        run_load("http://127.0.0.1:9/", [{}], concurrency=0)
    assert Outcome(0, 200, 0.0, 0.1, None).error is None


def test_clients_import_neither_torch_nor_the_parents_main(tmp_path):
    """A parent script whose main module is heavy: its client processes must not import it again."""
    marker = tmp_path / "imports"
    script = tmp_path / "heavy_main.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        with open({str(marker)!r}, "a") as f:
            f.write(__name__ + "\\n")
        from bench.loadgen import run_load
        if __name__ == "__main__":
            result = run_load("http://127.0.0.1:9/", [{{}}] * 4, concurrency=2, processes=2)
            assert result.counts() == {{0: 4}}, result.counts()
            assert "torch" not in sys.modules
    """))
    subprocess.run([sys.executable, str(script)], cwd=ROOT, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert marker.read_text().split() == ["__main__"]  # not once more per client as __mp_main__


def test_command_line(server):
    server.reset()
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--url", server.url, "--body", '{"text": "Hallo"}',
         "--requests", "20", "--concurrency", "4", "--processes", "2"],
        cwd=ROOT, check=True, timeout=120, capture_output=True, text=True,
    ).stdout
    assert "statuses: 200: 20" in out and "p99" in out and "client CPU" in out
    assert len(server.received) == 20


def test_load_split_over_servers():
    from bench.server_load import run_replicas

    servers = [EchoServer(), EchoServer()]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        n = 40
        result = run_replicas([s.url for s in servers], [{"i": i, "sleep": 0.01} for i in range(n)], concurrency=8, processes=2)
        # each server its half of the bodies, at its half of the concurrency; one result with every answer
        assert sorted(servers[0].received) == list(range(0, n, 2)) and sorted(servers[1].received) == list(range(1, n, 2))
        assert all(s.max_in_flight <= 4 for s in servers)
        assert result.counts() == {200: n} and len(result.outcomes) == n
        assert result.elapsed >= max(o.latency for o in result.outcomes)  # the longer of the two runs
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
