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
