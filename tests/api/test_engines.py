"""Several engine processes behind one server (Settings.engines): which engine a call goes to, what happens to
the calls of an engine that dies, and the engines' statistics as one."""
from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import running_server
from test_service import FAST, GERMAN, make_client, metric, wait_for, wait_ready

from nmt_serve.engine.protocol import REFUSED, Reply
from nmt_serve.service.engine_client import EngineClient
from nmt_serve.service.engine_connection import EngineUnavailable
from nmt_serve.service.engine_pool import EnginePool, merged_stats
from nmt_serve.service.errors import APIError


class FakeConnection:
    """An engine connection that answers every call at once, or loses it (its engine died with it)."""

    def __init__(self, name: str, *, ready: bool = True, work_in_flight: float = 0.0, loses: bool = False,
                 models: tuple[str, ...] = ("de-en",)):
        self.name, self.ready, self.work_in_flight, self.loses = name, ready, work_in_flight, loses
        self.last_status_at = time.monotonic()
        self.status = SimpleNamespace(incarnation=name, models=[{"id": m} for m in models])
        self.calls: list = []
        self.movable: list[bool] = []  # per call, whether a stall may move it (EngineConnection.call)
        self.in_flight = 0
        self._ids = 0

    def new_id(self) -> str:
        self._ids += 1
        return f"{self.name}-{self._ids}"

    async def call(self, message, work: float = 1.0, movable: bool = False) -> Reply:
        self.calls.append((message, work))
        self.movable.append(movable)
        if self.loses:
            raise EngineUnavailable(f"engine {self.name} exited")
        self.work_in_flight += work  # from the call on, as EngineConnection counts it
        try:
            return await self.answer(message)
        finally:
            self.work_in_flight -= work

    async def answer(self, message) -> Reply:
        await asyncio.sleep(0)
        return Reply(message, value=[[(self.name, source)] for source in message.sources])


def test_a_call_goes_to_the_ready_engine_with_the_least_work():
    busy, idle, starting = FakeConnection("busy", work_in_flight=30), FakeConnection("idle", work_in_flight=10), FakeConnection("starting", ready=False)
    pool = EnginePool([busy, starting, idle])
    assert [pool.pick().name for _ in range(4)] == ["idle"] * 4
    assert pool.pick(avoid=idle).name == "busy"
    # of equally busy engines the first: one call at a time keeps to one engine, which may take the idle cores
    a, b = FakeConnection("a"), FakeConnection("b")
    pool = EnginePool([a, b])
    assert [pool.pick().name for _ in range(2)] == ["a", "a"]
    a.work_in_flight = 1
    assert pool.pick().name == "b"
    a.ready = b.ready = False
    with pytest.raises(EngineUnavailable):
        pool.pick()


def test_an_engine_silent_for_a_second_is_passed_over_while_another_speaks():
    from nmt_serve.service.engine_pool import STALE_S

    stalled, speaking = FakeConnection("stalled"), FakeConnection("speaking", work_in_flight=50)
    stalled.last_status_at -= 2 * STALE_S
    pool = EnginePool([stalled, speaking])
    assert [pool.pick().name for _ in range(3)] == ["speaking"] * 3  # busier, but it answers
    speaking.last_status_at -= 2 * STALE_S  # both silent: by work, as when all are
    assert pool.pick().name == "stalled"


def test_a_call_goes_only_to_an_engine_that_serves_its_model():
    both, one = FakeConnection("both", work_in_flight=9, models=("de-en", "en-de")), FakeConnection("one", models=("de-en",))
    pool = EnginePool([one, both])
    assert {pool.pick(model_id="en-de").name for _ in range(3)} == {"both"}
    assert pool.pick(model_id="de-en").name == "one"  # the least busy of those that serve it
    with pytest.raises(EngineUnavailable, match="no ready engine serves fr-de"):
        pool.pick(model_id="fr-de")
    # a restarted engine's models are read anew (its incarnation changed)
    one.status = SimpleNamespace(incarnation="one again", models=[{"id": "en-de"}])
    assert pool.pick(model_id="en-de").name == "one"


def test_a_call_lost_with_its_engine_goes_once_to_another():
    def translate(client):
        return asyncio.run(client.translate("de-en", [[5, 6]], None, 10.0))

    lost, good = FakeConnection("lost", loses=True), FakeConnection("good", work_in_flight=1)
    assert translate(EngineClient(EnginePool([lost, good]))) == [[("good", [5, 6])]]
    assert len(lost.calls) == 1 and len(good.calls) == 1
    # the same call again, on the other engine's ids, with its deadline unchanged; its work: 2 tokens and an eos
    (first, work), (again, work_again) = lost.calls[0], good.calls[0]
    assert again.id.startswith("good-") and again.deadline == first.deadline and work == work_again == 3
    assert lost.movable == [True] and good.movable == [False]  # once sent again, a stall does not move it a third time
    # one engine: nothing to send it to
    with pytest.raises(APIError) as caught:
        translate(EngineClient(EnginePool([FakeConnection("alone", loses=True)])))
    assert caught.value.status == 503 and caught.value.type == "engine_unavailable"
    # lost twice: not sent a third time (a sentence that kills engines would take them all down)
    first, second, third = FakeConnection("1", loses=True), FakeConnection("2", loses=True, work_in_flight=1), FakeConnection("3", work_in_flight=2)
    with pytest.raises(APIError):
        translate(EngineClient(EnginePool([first, second, third])))
    assert (len(first.calls), len(second.calls), len(third.calls)) == (1, 1, 0)


def test_the_calls_of_an_engine_silent_for_stall_s_go_once_to_one_that_speaks(tmp_path):
    """An engine that holds calls and says nothing for stall_s (stopped, starved, stuck in a step) has them taken from
    it: each goes to an engine still speaking that serves its model, and the silent one is told to drop its work. A
    call already sent again stays where it is (one resend at most), and so does one whose model no other engine
    serves."""
    import zmq

    from nmt_serve.engine.protocol import Cancel, EngineStatus, Translate, loads
    from nmt_serve.service.engine_connection import EngineConnection

    async def scenario():
        context = zmq.Context()
        engine_side = context.socket(zmq.ROUTER)  # the stalled engine's calls socket: it reads what it was sent
        engine_side.bind(f"ipc://{tmp_path}/calls")
        stalled = EngineConnection(f"ipc://{tmp_path}/calls", f"ipc://{tmp_path}/status", heartbeat_timeout_s=60)
        speaking = FakeConnection("speaking")
        pool = EnginePool([stalled, speaking], stall_s=2.0)
        client = EngineClient(pool)
        await stalled.start()
        stalled.status = EngineStatus("stalled", True, models=[{"id": "de-en"}, {"id": "fr-en"}])
        stalled.last_status_at = time.monotonic()
        try:
            speaking.ready = False  # the calls go to the engine that stalls next
            first = asyncio.ensure_future(client.translate("de-en", [[5, 6]], None, 30))
            only_there = asyncio.ensure_future(client.translate("fr-en", [[7]], None, 30))
            resent = asyncio.ensure_future(stalled.call(Translate(stalled.new_id(), "de-en", [[8]], None, 0.0, []), 2.0))
            await asyncio.sleep(0.05)
            speaking.ready = True
            stalled.last_status_at = time.monotonic()
            assert stalled.in_flight == 3 and pool.move_stalled() == 0  # not silent long enough yet
            stalled.last_status_at -= 2.5
            assert pool.move_stalled() == 1
            assert (await first) == [[("speaking", [5, 6])]]
            assert not only_there.done() and not resent.done() and stalled.in_flight == 2
            assert stalled.work_in_flight == 2.0 + 2  # the moved call's work left with it
            await asyncio.sleep(0)  # the cancel's flush (due at the next turn of the loop) has gone out
            sent, deadline = [], time.monotonic() + 60  # the calls and the cancel come in the order they were sent
            while not any(isinstance(m, Cancel) for m in sent):
                assert time.monotonic() < deadline, sent
                if engine_side.poll(100):
                    sent += [loads(frame) for frame in engine_side.recv_multipart()[1:]]
            cancels = [m.id for m in sent if isinstance(m, Cancel)]
            moved_id = next(m.id for m in sent if isinstance(m, Translate) and m.sources == [[5, 6]])
            assert cancels == [moved_id]
            only_there.cancel()
            resent.cancel()
            await asyncio.gather(only_there, resent, return_exceptions=True)
        finally:
            await stalled.stop()
            engine_side.close()
            context.term()

    asyncio.run(scenario())


def test_where_the_engines_keep_the_cache_a_call_goes_to_its_content_s_engine():
    """With the engines' translation cache (several API workers), a call goes to the engine its content hashes to, the
    same from every worker, so that a repeat finds the engine that keeps it; other contents spread over the engines;
    that engine is passed over when it has AFFINITY_SLACK more work in flight than the least busy."""
    from nmt_serve.service.engine_pool import AFFINITY_SLACK

    def engine_of(client, sources):
        return asyncio.run(client.translate("de-en", [sources], None, 10.0))[0][0][0]

    workers = [EngineClient(EnginePool([FakeConnection("a"), FakeConnection("b")]), engines_cache=True) for _ in range(2)]
    contents = [[i, i + 1, 7] for i in range(40)]
    homes = [engine_of(workers[0], s) for s in contents]
    assert [engine_of(w, s) for w in workers for s in contents] == homes * 2  # again, and from the other worker
    assert {"a", "b"} == set(homes)  # the contents spread
    # the content's engine busy beyond the slack: the least busy takes it
    pool = EnginePool([FakeConnection("a"), FakeConnection("b")])
    client = EngineClient(pool, engines_cache=True)
    home = engine_of(client, contents[0])
    busy = next(c for c in pool.connections if c.name == home)
    busy.work_in_flight = AFFINITY_SLACK
    assert engine_of(client, contents[0]) == home
    busy.work_in_flight = AFFINITY_SLACK + 10
    assert engine_of(client, contents[0]) != home
    # without the engines' cache, the least busy engine, the first of equals
    plain = EngineClient(EnginePool([FakeConnection("a"), FakeConnection("b", work_in_flight=1)]))
    assert {engine_of(plain, contents[0]) for _ in range(4)} == {"a"}


def test_with_several_engines_a_repeat_finds_the_engine_that_keeps_it(models_dir, monkeypatch):
    """The engines keep the translation cache (the setting of several API workers) and there are two: every repeat is
    answered from an engine's cache (with calls to the least busy engine, about half found the other engine and were
    searched). That every worker picks the same engine for a content is the unit test's."""
    from nmt_serve.service import engine_pool

    # an engine silent for a second on a loaded machine would rightly be passed over, and a repeat searched again
    monkeypatch.setattr(engine_pool, "STALE_S", 3600.0)
    with make_client(models_dir, workers=2, engines=2, lanes=1, translation_cache_entries=100) as c:
        wait_ready(c)
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=60)
        body = lambda t: {"text": t, "max_length": 6}  # noqa: E731
        first = [c.post("/v1/translate", json=body(t)) for t in GERMAN]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda t: c.post("/v1/translate", json=body(t)), GERMAN * 3))
        assert [r.status_code for r in first + results] == [200] * (len(first) + len(results))
        assert [r.json()["translations"] for r in results] == [r.json()["translations"] for r in first] * 3
        # the engines' counters come with their next statuses
        wait_for(lambda: metric(c, "nmt_engine_cache_hits_total") >= 3 * len(GERMAN), timeout=60)
        assert metric(c, "nmt_engine_cache_hits_total") == 3 * len(GERMAN)


def test_a_call_of_many_sentences_is_split_between_the_engines():
    from nmt_serve.service.engine_client import SPLIT_MIN_SENTENCES, balanced_bounds

    assert balanced_bounds([5] * 12, 2) == [(0, 6), (6, 12)]
    assert balanced_bounds([30, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 6)]  # by work, not by count
    assert balanced_bounds([1, 1, 1], 3) == [(0, 1), (1, 2), (2, 3)] and balanced_bounds([9, 9], 1) == [(0, 2)]
    sources = [[i] * (1 + i % 3) for i in range(2 * SPLIT_MIN_SENTENCES + 1)]
    a, b, starting = FakeConnection("a"), FakeConnection("b"), FakeConnection("starting", ready=False)
    client = EngineClient(EnginePool([a, b, starting]))
    out = asyncio.run(client.translate("de-en", sources, None, 10.0, terms=[[str(i)] for i in range(len(sources))]))
    assert [source for (_, source), in out] == sources  # every sentence once, in order
    assert {name for (name, _), in out} == {"a", "b"} and len(a.calls) == len(b.calls) == 1
    (first, _), (second, _) = a.calls[0], b.calls[0]
    assert first.terms + second.terms == [[str(i)] for i in range(len(sources))] or second.terms + first.terms == [[str(i)] for i in range(len(sources))]
    assert first.deadline == second.deadline
    # too few sentences to split, or one engine: one call
    asyncio.run(client.translate("de-en", sources[:2 * SPLIT_MIN_SENTENCES - 1], None, 10.0))
    assert len(a.calls) + len(b.calls) == 3
    # a part that fails fails the call, and the other part is cancelled (its engine told to drop it)
    class Refusing(FakeConnection):
        async def answer(self, message) -> Reply:
            await asyncio.sleep(0.01)
            return Reply(message.id, error=REFUSED, message="busy", retry_after=2.0)

    class Hanging(FakeConnection):
        async def answer(self, message) -> Reply:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled = True
                raise

    refusing, hanging = Refusing("refusing"), Hanging("hanging")
    with pytest.raises(APIError) as caught:
        asyncio.run(EngineClient(EnginePool([refusing, hanging])).translate("de-en", sources, None, 10.0))
    assert caught.value.type == "overloaded" and hanging.cancelled and len(refusing.calls) == len(hanging.calls) == 1


def test_the_engines_statistics_merge_into_one_engines():
    one = {"steps": 10.0, "rate_units_per_second": 100.0, "busy_share": 0.5, "uptime_seconds": 30.0, "startup_seconds": 4.0}
    two = {"steps": 5.0, "rate_units_per_second": 50.0, "busy_share": 0.25, "uptime_seconds": 3.0, "startup_seconds": 6.0}
    assert merged_stats([one]) == one
    assert merged_stats([one, two]) == {"steps": 15.0, "rate_units_per_second": 150.0, "busy_share": 0.375,
                                        "uptime_seconds": 3.0, "startup_seconds": 6.0}
    # the room of the engine with the most: one runs a lone search on 2 threads while the other sees it busy
    rooms = [{"lone_search_threads": 2.0, "other_processes_cores": 0.1}, {"lone_search_threads": 1.0, "other_processes_cores": 1.1}]
    assert merged_stats(rooms) == {"lone_search_threads": 2.0, "other_processes_cores": 0.1}
    pool = EnginePool([SimpleNamespace(status=SimpleNamespace(stats=one, model_stats={"de-en": {"sentences": 2.0}}), ready=True),
                       SimpleNamespace(status=None, ready=False),
                       SimpleNamespace(status=SimpleNamespace(stats=two, model_stats={"de-en": {"sentences": 3.0}, "en-de": {"sentences": 1.0}}),
                                       ready=True)])
    stats, models = pool.stats()
    assert stats["steps"] == 15.0 and models == {"de-en": {"sentences": 5.0}, "en-de": {"sentences": 1.0}}


def test_two_engines_serve_and_a_dead_ones_calls_finish_on_the_other(models_dir, monkeypatch):
    """Both engines take calls; the calls held by an engine that dies (SIGKILL, as the OOM killer) are translated by
    the other, so every request is answered 200; the dead one restarts and takes calls again."""
    from nmt_serve.service import engine_pool

    # the stopped engine stays a candidate however slowly this machine sends the calls (its silence is another test's)
    monkeypatch.setattr(engine_pool, "STALE_S", 3600.0)
    texts = [f"Ein Hund Nummer {i} rennt über die Wiese." for i in range(12)]
    with make_client(models_dir, engines=2, lanes=1, engine_stall_s=0) as c:  # its calls wait for its loss
        wait_ready(c)
        state = c.app.state.service
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=60)
        first, second = state.supervisors
        assert first.pid != second.pid and first.socket_dir != second.socket_dir
        memory = c.get("/v1/models").json()["models"][0]["memory"]
        assert memory["engines"] == 2 and ("a 1/2 share" in memory["budget_source"] or "1/2 of the device" in memory["budget_source"])
        alone = [c.post("/v1/translate", json={"text": t, **FAST}).json()["translations"][0]["text"] for t in texts]
        connections = state.engine.engines.connections
        # the first engine stopped: the calls sent to it wait there, and the others go to the second one. Sent one by
        # one, each once the one before is answered or held: while the first engine holds none, the two are equally
        # idle and take turns, so it holds one of the first two, and then calls only while the second is busy
        os.kill(first.pid, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(len(texts)) as pool:
                sent = []
                for t in texts:
                    sent.append(pool.submit(c.post, "/v1/translate", json={"text": t, **FAST}))
                    wait_for(lambda: connections[0].in_flight + sum(f.done() for f in sent) == len(sent), timeout=60)
                held = connections[0].in_flight
                os.kill(first.pid, signal.SIGKILL)
                replies = [future.result() for future in sent]
        finally:
            if first.process.poll() is None:
                os.kill(first.pid, signal.SIGCONT)
        assert [r.status_code for r in replies] == [200] * len(texts), [r.text for r in replies if r.status_code != 200]
        assert [r.json()["translations"][0]["text"] for r in replies] == alone
        assert 0 < held < len(texts)  # both engines had calls
        assert [c.work_in_flight for c in connections] == [0, 0]  # the lost calls' work left with them
        assert metric(c, "nmt_engine_calls_resent_total") == held
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=60)
        assert metric(c, "nmt_engine_restarts_total") == 1 and first.restarts == 1
        before = connections[0].status.stats.get("calls", 0.0)
        # the restarted engine takes calls again (one after another, the idle engines take turns)
        assert all(c.post("/v1/translate", json={"text": t, **FAST}).status_code == 200 for t in GERMAN)
        wait_for(lambda: connections[0].status.stats.get("calls", 0.0) > before)


def process_state(pid: int) -> str:
    """R, S, T (stopped), ... from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_the_calls_a_stopped_engine_holds_are_answered_by_the_other(models_dir, monkeypatch):
    """One of two engines stopped (SIGSTOP: as one stuck, or starved of CPU) while it holds calls: once it has been
    silent for engine_stall_s, the other translates them, while the stopped one is still stopped and long before its
    heartbeat (30 s) would have it killed. Each is answered 200 with its translation alone; nothing restarts; the
    stopped engine, run again, serves (its partner stopped in turn, a call reaches it)."""
    from nmt_serve.service import engine_pool

    monkeypatch.setattr(engine_pool, "STALE_S", 3600.0)  # the stopped engine stays a candidate for new calls
    texts = [f"Eine Katze Nummer {i} schläft auf dem Sofa." for i in range(12)]
    timeout = {"X-Request-Timeout": "20"}  # below the heartbeat: without the move the held calls end 504
    with make_client(models_dir, engines=2, lanes=1, engine_stall_s=2.0) as c:
        wait_ready(c)
        state = c.app.state.service
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=60)
        first, second = state.supervisors
        connections = state.engine.engines.connections
        alone = [c.post("/v1/translate", json={"text": t, **FAST}).json()["translations"][0]["text"] for t in texts]
        held = 0
        os.kill(first.pid, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(len(texts)) as pool:
                sent = []
                for t in texts:
                    sent.append(pool.submit(c.post, "/v1/translate", json={"text": t, **FAST}, headers=timeout))
                    # until the API holds it (or has answered it): each call is on one engine or answered
                    wait_for(lambda: sum(c.in_flight for c in connections) + sum(f.done() for f in sent) == len(sent), timeout=60)
                    held = max(held, connections[0].in_flight)
                replies = [future.result() for future in sent]
            assert process_state(first.pid) == "T"  # answered while it was still stopped
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert [r.status_code for r in replies] == [200] * len(texts), [r.text for r in replies if r.status_code != 200]
        assert [r.json()["translations"][0]["text"] for r in replies] == alone
        assert held > 0 and metric(c, "nmt_engine_calls_resent_total") >= held
        assert metric(c, "nmt_engine_restarts_total") == 0 and first.restarts == 0
        wait_for(lambda: time.monotonic() - connections[0].last_status_at < 0.5)
        os.kill(second.pid, signal.SIGSTOP)
        try:
            reply = c.post("/v1/translate", json={"text": texts[0], **FAST}, headers=timeout)
            assert process_state(second.pid) == "T"
        finally:
            os.kill(second.pid, signal.SIGCONT)
        assert reply.status_code == 200 and reply.json()["translations"][0]["text"] == alone[0]


def test_requests_one_at_a_time_pass_a_stalled_engine_by(models_dir, monkeypatch):
    """One of two engines stopped (SIGSTOP: as one starved of CPU or inside a long step; not lost, its heartbeat is
    30 s): once it has been silent for a while, requests one after another all go to the other and are answered at
    once; without that, every other one would wait for the stopped engine."""
    from nmt_serve.service import engine_pool

    # longer than the shipped second, so that the engine that runs is never silent that long on a loaded machine
    monkeypatch.setattr(engine_pool, "STALE_S", 5.0)
    STALE_S = engine_pool.STALE_S
    with make_client(models_dir, engines=2, lanes=1) as c:
        wait_ready(c)
        state = c.app.state.service
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=60)
        first = state.supervisors[0]
        connections = state.engine.engines.connections
        os.kill(first.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: time.monotonic() - connections[0].last_status_at > STALE_S)
            replies = [c.post("/v1/translate", json={"text": t, **FAST}, headers={"X-Request-Timeout": "20"}) for t in GERMAN * 2]
            assert [r.status_code for r in replies] == [200] * len(replies)
            assert connections[0].in_flight == 0
            assert metric(c, "nmt_engines_stalled") == 1 and metric(c, "nmt_engines_ready") == 2
        finally:
            os.kill(first.pid, signal.SIGCONT)
        wait_for(lambda: metric(c, "nmt_engines_stalled") == 0)


def test_workers_and_engines_together(models_dir):
    """--workers 2 --engines 2: every worker follows both engines; /metrics says two are ready."""
    with running_server(models_dir, "--workers", "2", "--engines", "2", "--lanes", "1") as url:
        wait_for(lambda: b"nmt_engines_ready 2.0" in urllib.request.urlopen(f"{url}/metrics", timeout=30).read(), timeout=90)
        for text in GERMAN:
            body = f'{{"text": "{text}", "beam_size": 2, "max_length": 8}}'.encode()
            request = urllib.request.Request(f"{url}/v1/translate", data=body, headers={"content-type": "application/json"})
            assert urllib.request.urlopen(request, timeout=60).status == 200


def test_the_server_settles_with_its_first_engine_and_says_how_the_ready_one_stands():
    """A worker waits for some engine to serve, not all (a second may still be capturing its programs); the status
    readiness reports is a ready engine's, else the first heard of."""
    from nmt_serve.engine.protocol import EngineStatus
    from nmt_serve.service.engine_connection import EngineConnection

    async def scenario():
        slow, quick = (EngineConnection(f"inproc://{n}-calls", f"inproc://{n}-status", heartbeat_timeout_s=60) for n in ("slow", "quick"))
        pool = EnginePool([slow, quick])
        assert pool.status is None and not await pool.wait_for_settled(0.05)
        slow.status, slow.last_status_at = EngineStatus("loading", False), time.monotonic()
        assert pool.status is slow.status and not pool.ready
        waiting = asyncio.ensure_future(pool.wait_for_settled(5))
        await asyncio.sleep(0.05)
        quick.status, quick.last_status_at = EngineStatus("serving", True), time.monotonic()
        quick._settled.set()
        return await waiting, pool

    settled, pool = asyncio.run(scenario())
    assert settled and pool.ready and pool.status.incarnation == "serving"


def test_a_cancelled_call_takes_its_work_with_it():
    """The work a call counts in its engine's work_in_flight leaves with it however it ends (the choice of engine
    would otherwise drift from one engine to the other)."""
    from nmt_serve.engine.protocol import EngineStatus, Translate
    from nmt_serve.service.engine_connection import EngineConnection

    async def scenario():
        connection = EngineConnection("inproc://w-calls", "inproc://w-status", heartbeat_timeout_s=60)
        await connection.start()
        connection.status, connection.last_status_at = EngineStatus("x", True), time.monotonic()
        try:
            call = asyncio.ensure_future(connection.call(Translate(connection.new_id(), "m", [[1, 2]], None, 0.0, []), 3.0))
            await asyncio.sleep(0.05)  # sent; nobody answers
            during = connection.work_in_flight
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            return during, connection.work_in_flight
        finally:
            await connection.stop()

    assert asyncio.run(scenario()) == (3.0, 0.0)


def test_two_engines_on_the_cpu_map_one_copy_of_the_weights(tmp_path, spm_model):
    """Settings.shared_weights (the default): both engine processes map one file of each model's weights, a
    restarted one too, and the file goes when the server stops."""
    from tests.conftest import make_checkpoint

    make_checkpoint(tmp_path / "models" / "de-en", spm_model, "de", "en", seed=5, d_model=64, d_ff=256)
    with make_client(tmp_path / "models", engines=2, lanes=1) as c:
        wait_ready(c)
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=60)
        state = c.app.state.service
        directory = Path(state.supervisors[0].config["weights_dir"])
        assert {s.config["weights_dir"] for s in state.supervisors} == {str(directory)}
        files = list(directory.glob("*.weights"))
        assert [f.name.split(".")[0] for f in files] == ["de-en"]
        for supervisor in state.supervisors:
            assert str(files[0]) in Path(f"/proc/{supervisor.pid}/maps").read_text()
        model = c.get("/v1/models").json()["models"][0]
        assert model["id"] == "de-en" and 0 < model["shared_weights_bytes"] <= files[0].stat().st_size
        assert model["memory"]["weights_shared_by"] == 2  # each engine's plan counts its share of the one copy
        replies = [c.post("/v1/translate", json={"text": t, **FAST}) for t in GERMAN * 2]
        assert [r.status_code for r in replies] == [200] * len(replies)
        # an engine killed (as the OOM killer does) comes back on the same copy
        killed = state.supervisors[0].pid
        os.kill(killed, signal.SIGKILL)

        def maps_the_file() -> bool:
            pid = state.supervisors[0].pid
            try:
                return pid != killed and str(files[0]) in Path(f"/proc/{pid}/maps").read_text()
            except FileNotFoundError:  # between two engines
                return False

        wait_for(maps_the_file, timeout=90)
        assert list(directory.glob("*.weights")) == files
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=90)
        assert c.post("/v1/translate", json={"text": GERMAN[0], **FAST}).status_code == 200
        # the model replaced on disk: the next engine to start maps a file of the new version and removes the old
        # one's, which the engine still running on it keeps mapped
        weights = tmp_path / "models" / "de-en" / "model.safetensors"
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
        killed = state.supervisors[1].pid
        os.kill(killed, signal.SIGKILL)

        def maps_a_new_file() -> list[Path]:
            pid = state.supervisors[1].pid
            try:
                maps = Path(f"/proc/{pid}/maps").read_text() if pid != killed else ""
            except FileNotFoundError:
                return []
            return [f for f in directory.glob("*.weights") if f != files[0] and str(f) in maps]

        def only_the_new_file_is_left() -> bool:  # the old file goes after the new one is mapped (share_weights)
            new = maps_a_new_file()
            return bool(new) and list(directory.glob("*.weights")) == new

        wait_for(only_the_new_file_is_left, timeout=90)
        assert f"{files[0]} (deleted)" in Path(f"/proc/{state.supervisors[0].pid}/maps").read_text()
        wait_for(lambda: metric(c, "nmt_engines_ready") == 2, timeout=90)
        assert [c.post("/v1/translate", json={"text": t, **FAST}).status_code for t in GERMAN * 2] == [200] * len(GERMAN) * 2
    assert not directory.exists()
