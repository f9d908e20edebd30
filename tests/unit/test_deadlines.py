"""with_deadline: the work in the request's own task, stopped at the deadline (504) or when the client goes
away (499), its cancellation reaching the work either way; a result is returned as it is, and nothing of
the wait outlives it (no late cancel of the request's task); a cancellation from elsewhere is not answered."""
from __future__ import annotations

import asyncio

import pytest

from nmt_serve.service.deadlines import with_deadline
from nmt_serve.service.errors import APIError


class _Counter:
    def __init__(self):
        self.counts: dict[str, int] = {}

    def labels(self, reason: str):
        counter = self

        class _Child:
            def inc(self):
                counter.counts[reason] = counter.counts.get(reason, 0) + 1
        return _Child()


class _State:
    def __init__(self):
        self.metrics = type("Metrics", (), {"dropped": _Counter()})()


class _Request:
    """What with_deadline reads of a request: receive(), which gives http.disconnect once `gone` is set."""

    def __init__(self):
        self.gone = asyncio.Event()

    async def receive(self):
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def _work(seconds: float, log: list, result="done"):
    try:
        await asyncio.sleep(seconds)
        return result
    except asyncio.CancelledError:
        log.append("cancelled")
        raise


def test_a_result_comes_back_and_nothing_of_the_wait_outlives_it():
    async def main():
        state, request, log = _State(), _Request(), []
        # work done at its first turn of the loop, before the deadline's timer however late the loop runs
        assert await with_deadline(state, request, 0.05, _work(0, log)) == "done"
        request.gone.set()  # the client leaves once answered, and the deadline passes: neither touches this task
        await asyncio.sleep(0.1)
        return state, log
    state, log = asyncio.run(main())
    assert log == [] and state.metrics.dropped.counts == {}


def test_the_deadline_cancels_the_work_and_answers_504():
    async def main():
        state, log = _State(), []
        with pytest.raises(APIError) as raised:
            await with_deadline(state, _Request(), 0.02, _work(10, log))
        await asyncio.sleep(0.05)  # and the request's task goes on undisturbed
        task = asyncio.current_task()
        assert not hasattr(task, "cancelling") or task.cancelling() == 0  # the cancel was handled (Python 3.11)
        return state, log, raised.value
    state, log, error = asyncio.run(main())
    assert error.status == 504 and log == ["cancelled"] and state.metrics.dropped.counts == {"timeout": 1}


def test_a_client_that_goes_away_cancels_the_work_and_gets_499():
    async def main():
        state, request, log = _State(), _Request(), []
        asyncio.get_running_loop().call_later(0.02, request.gone.set)
        with pytest.raises(APIError) as raised:
            await with_deadline(state, request, 10, _work(10, log))
        return state, log, raised.value
    state, log, error = asyncio.run(main())
    assert error.status == 499 and log == ["cancelled"] and state.metrics.dropped.counts == {"disconnect": 1}


def test_a_cancellation_from_elsewhere_goes_through():
    async def main():
        state, log = _State(), []
        task = asyncio.ensure_future(with_deadline(state, _Request(), 10, _work(10, log)))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return state, log
    state, log = asyncio.run(main())
    assert log == ["cancelled"] and state.metrics.dropped.counts == {}
