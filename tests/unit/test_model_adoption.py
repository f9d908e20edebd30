"""A ready engine's models taken in by the API process (service/app.StatusFollower): on a thread, so the event loop
answers meanwhile; the newest engine's models win; models that cannot be taken in are a load failure."""
from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

from nmt_serve.engine.protocol import EngineStatus
from nmt_serve.service import app as app_module
from nmt_serve.service.settings import Settings
from nmt_serve.service.state import ServiceState


def served(tag: str) -> app_module.Served:
    return app_module.Served({f"{tag}-en": SimpleNamespace(source=tag, target="en")}, {tag: tag}, "en", {})


def scenario(slow_served_of, *statuses: EngineStatus, settle: float = 1.5):
    """Each status given to a StatusFollower in turn, 0.05 s apart, while a ticker measures the event loop's
    longest gap; what the state holds after `settle` seconds."""
    state = ServiceState(Settings(models_dir="/nonexistent", language_detection=False))
    events = {"ready": 0, "failed": 0}
    on_status = app_module.StatusFollower(state, lambda: events.__setitem__("failed", events["failed"] + 1),
                                          lambda: events.__setitem__("ready", events["ready"] + 1))

    async def run() -> float:
        gaps = [0.0]

        async def ticker():
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        for status in statuses:
            on_status(status)
            await asyncio.sleep(0.05)
        await asyncio.sleep(settle)
        ticking.cancel()
        return max(gaps)

    original = app_module.served_of
    app_module.served_of = slow_served_of
    try:
        longest_gap = asyncio.run(run())
    finally:
        app_module.served_of = original
    return state, events, longest_gap


def test_the_models_are_taken_in_off_the_event_loop_and_the_newest_engine_wins():
    def slow(status, settings):
        assert threading.current_thread() is not threading.main_thread()
        time.sleep(0.6 if status.incarnation == "first" else 0.2)  # served_directions of NLLB-200 took 0.85 s
        return served(status.incarnation)

    state, events, gap = scenario(slow, EngineStatus("first", True), EngineStatus("second", True))
    assert gap < 0.3  # the loop ran its ticker all along
    assert list(state.models) == ["second-en"] and state.names == {"second": "second"}  # not the first's, done later
    assert events == {"ready": 1, "failed": 0}


def test_models_that_cannot_be_taken_in_are_a_load_failure():
    def broken(status, settings):
        raise KeyError("source")

    state, events, _ = scenario(broken, EngineStatus("only", True), EngineStatus("only", True))
    assert events == {"ready": 0, "failed": 1} and not state.models
    assert "could not be taken in: KeyError" in state.load_error


def test_a_joining_worker_can_wait_until_the_models_are_taken_in():
    """An API worker joining a running engine accepts connections only once its models are in (app's lifespan)."""
    state = ServiceState(Settings(models_dir="/nonexistent", language_detection=False))
    follower = app_module.StatusFollower(state)

    def slow(status, settings):
        time.sleep(0.3)
        return served(status.incarnation)

    async def run():
        follower(EngineStatus("one", True))
        early = await follower.adopted(0.05)
        assert not state.models
        return early, await follower.adopted(5), list(state.models)

    original, app_module.served_of = app_module.served_of, slow
    try:
        assert asyncio.run(run()) == (False, True, ["one-en"])
    finally:
        app_module.served_of = original
