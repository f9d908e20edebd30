"""A ready engine's models taken in by the API process (service/app.StatusFollower): on a thread, so the event loop
answers meanwhile; the newest engine's models win; models that cannot be taken in are a load failure. Threads
and the loop are ordered by events here, never by how long something takes."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from nmt_serve.engine.protocol import EngineStatus
from nmt_serve.service import app as app_module
from nmt_serve.service.settings import Settings
from nmt_serve.service.state import ServiceState

WAIT_S = 30.0  # a bound on waits that end by an event, never reached unless the code under test is wrong


def served(tag: str) -> app_module.Served:
    return app_module.Served({f"{tag}-en": SimpleNamespace(source=tag, target="en")}, {tag: tag}, "en", {})


def follower_with_events():
    state = ServiceState(Settings(models_dir="/nonexistent", language_detection=False))
    events = {"ready": 0, "failed": 0}
    follower = app_module.StatusFollower(state, lambda: events.__setitem__("failed", events["failed"] + 1),
                                         lambda: events.__setitem__("ready", events["ready"] + 1))
    return state, events, follower


def run_with(served_of, scenario):
    original, app_module.served_of = app_module.served_of, served_of
    try:
        return asyncio.run(scenario())
    finally:
        app_module.served_of = original


def test_the_models_are_taken_in_off_the_event_loop_and_the_newest_engine_wins():
    state, events, follower = follower_with_events()
    second_done = threading.Event()
    loop_ran = {"first": False}
    ticks = [0]

    def slow(status, settings):
        assert threading.current_thread() is not threading.main_thread()
        if status.incarnation == "first":  # taken in after the second engine's models, though it came first
            before = ticks[0]
            assert second_done.wait(WAIT_S)
            while ticks[0] == before:  # the event loop goes on while this thread works
                assert second_done.wait(0.001)
            loop_ran["first"] = True
        else:
            second_done.set()
        return served(status.incarnation)

    async def scenario():
        async def ticker():
            while True:
                ticks[0] += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        follower(EngineStatus("first", True))
        follower(EngineStatus("second", True))
        assert await follower.adopted(WAIT_S)
        ticking.cancel()

    run_with(slow, scenario)
    assert loop_ran["first"]
    assert list(state.models) == ["second-en"] and state.names == {"second": "second"}  # not the first's, done later
    assert events == {"ready": 1, "failed": 0}


def test_models_that_cannot_be_taken_in_are_a_load_failure():
    state, events, follower = follower_with_events()

    def broken(status, settings):
        raise KeyError("source")

    async def scenario():
        follower(EngineStatus("only", True))
        follower(EngineStatus("only", True))
        assert await follower.adopted(WAIT_S)

    run_with(broken, scenario)
    assert events == {"ready": 0, "failed": 1} and not state.models
    assert "could not be taken in: KeyError" in state.load_error


def test_a_joining_worker_can_wait_until_the_models_are_taken_in():
    """An API worker joining a running engine accepts connections only once its models are in (app's lifespan)."""
    state, _, follower = follower_with_events()
    release = threading.Event()

    def held(status, settings):
        assert release.wait(WAIT_S)
        return served(status.incarnation)

    async def scenario():
        follower(EngineStatus("one", True))
        early = await follower.adopted(0.01)  # the adoption waits for `release`: not done, whatever the clock
        assert not state.models
        release.set()
        return early, await follower.adopted(WAIT_S), list(state.models)

    assert run_with(held, scenario) == (False, True, ["one-en"])


def by_models(status, settings):
    """Served from what the status names (each model id a direction)."""
    return app_module.Served({m["id"]: SimpleNamespace(source=m["id"][:2], target="en") for m in status.models}, {}, "en", {})


def test_what_is_served_is_every_model_some_engine_serves():
    """Several engines (Settings.engines): one restarted after the directory changed names the new set while the
    others keep theirs; every model that some engine serves is served (a call goes only to engines that name it)."""
    state, events, follower = follower_with_events()
    old, new = [{"id": "de-en"}, {"id": "fr-en"}], [{"id": "de-en"}, {"id": "cs-en"}]

    async def scenario():
        seen = []
        for incarnation, index, models in (("a1", 0, old), ("b1", 1, old), ("a2", 0, new), ("b2", 1, new)):
            follower(EngineStatus(incarnation, True, models=models), index)
            assert await follower.adopted(WAIT_S)
            seen.append(sorted(state.models))
        return seen

    assert run_with(by_models, scenario) == [["de-en", "fr-en"], ["de-en", "fr-en"], ["cs-en", "de-en", "fr-en"], ["cs-en", "de-en"]]
    assert events == {"ready": 4, "failed": 0}


def test_an_engine_s_models_taken_in_late_do_not_hide_another_s():
    """Engine 0's models are still being taken in when engine 1 names others: what is served at the end is both
    engines' models, whichever adoption ends last."""
    state, events, follower = follower_with_events()
    release, second_done = threading.Event(), threading.Event()

    def held(status, settings):
        if status.incarnation == "a":
            assert release.wait(WAIT_S)
        else:
            second_done.set()
        return by_models(status, settings)

    async def scenario():
        follower(EngineStatus("a", True, models=[{"id": "de-en"}]), 0)
        await asyncio.sleep(0)  # engine 0's adoption has begun: its thread waits for `release`
        follower(EngineStatus("b", True, models=[{"id": "fr-en"}]), 1)
        assert await asyncio.to_thread(second_done.wait, WAIT_S)
        release.set()  # engine 0's adoption, begun before engine 1 named its models, ends last
        assert await follower.adopted(WAIT_S)
        return sorted(state.models)

    assert run_with(held, scenario) == ["de-en", "fr-en"]
