"""The translation cache (service/translation_cache.py): repeats go to the engine once, kept answers are
exact, and the least recently used leave first."""
from __future__ import annotations

import asyncio

from nmt_serve.engine.protocol import DecodeOptions, EngineHypothesis
from nmt_serve.service.translation_cache import TranslationCache


class Engine:
    def __init__(self):
        self.calls: list[list[list[int]]] = []

    async def __call__(self, sources, terms):
        self.calls.append(sources)
        return [[EngineHypothesis(text=f"{ids}{terms[k] if terms else ''}")] for k, ids in enumerate(sources)]


def run(cache, engine, sources, options=DecodeOptions(), prefix=(), terms=None, model="de-en"):
    nbest, sent, shared = asyncio.run(cache.translate(engine, model, sources, options, list(prefix), terms=terms))
    assert sent == (len(engine.calls[-1]) if engine.calls and sent else 0) and shared == 0
    return [n[0].text for n in nbest], len(sources) - sent


def test_a_sentence_repeated_in_a_call_goes_to_the_engine_once_even_without_a_cache():
    cache, engine = TranslationCache(0), Engine()
    assert run(cache, engine, [[1, 2], [3], [1, 2], [1, 2]]) == (["[1, 2]", "[3]", "[1, 2]", "[1, 2]"], 2)
    assert engine.calls == [[[1, 2], [3]]]
    run(cache, engine, [[1, 2]])
    assert engine.calls[-1] == [[1, 2]] and len(cache) == 0  # nothing kept across calls


def test_a_kept_sentence_is_answered_from_memory_only_for_the_same_model_options_prefix_and_terms():
    cache, engine = TranslationCache(100), Engine()
    run(cache, engine, [[1, 2], [3]])
    assert run(cache, engine, [[3], [1, 2]]) == (["[3]", "[1, 2]"], 2) and len(engine.calls) == 1
    for other in (dict(options=DecodeOptions(beam_size=1)), dict(options=DecodeOptions(return_alignment=True)),
                  dict(prefix=[7]), dict(model="de-fr"), dict(terms=[["Hund"]])):
        assert run(cache, engine, [[3]], **other)[1] == 0, other
    assert len(engine.calls) == 6
    assert run(cache, engine, [[3]], terms=[["Hund"]]) == (["[3]['Hund']"], 1)


def test_the_least_recently_used_leave_first_and_clear_empties_it():
    cache, engine = TranslationCache(2), Engine()
    run(cache, engine, [[1]])
    run(cache, engine, [[2]])
    run(cache, engine, [[1]])  # used again: [2] is now the oldest
    run(cache, engine, [[3]])
    assert run(cache, engine, [[1], [3]])[1] == 2 and run(cache, engine, [[2]])[1] == 0
    cache.clear()
    assert len(cache) == 0 and run(cache, engine, [[1]])[1] == 0


def test_a_failed_call_keeps_nothing():
    cache = TranslationCache(10)

    async def failing(sources, terms):
        raise RuntimeError("engine lost")

    try:
        asyncio.run(cache.translate(failing, "de-en", [[1]], DecodeOptions(), []))
    except RuntimeError:
        pass
    assert len(cache) == 0


class HeldEngine:
    """An engine whose answers wait until the test lets them go (`release`), or fail (`fail`)."""

    def __init__(self):
        self.calls: list[list[list[int]]] = []
        self.gates: list[asyncio.Future] = []

    async def __call__(self, sources, terms):
        self.calls.append(sources)
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        return [[EngineHypothesis(text=f"{ids}")] for ids in sources]

    def release(self, n: int) -> None:
        self.gates[n].set_result(None)

    def fail(self, n: int) -> None:
        self.gates[n].set_exception(RuntimeError("the engine was lost"))


async def until(condition) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never came")


def test_a_sentence_in_flight_for_another_call_is_not_sent_again_with_the_cache_on():
    async def scenario():
        cache, engine = TranslationCache(10), HeldEngine()
        first = asyncio.create_task(cache.translate(engine, "de-en", [[1], [2]], DecodeOptions(), []))
        await until(lambda: len(engine.calls) == 1)
        # [1] is in flight: only [3] goes; [1] twice here takes the first call's answer
        second = asyncio.create_task(cache.translate(engine, "de-en", [[1], [3], [1]], DecodeOptions(), []))
        await until(lambda: len(engine.calls) == 2)
        assert engine.calls == [[[1], [2]], [[3]]]
        engine.release(1)
        await asyncio.sleep(0)
        assert not second.done()  # still waiting for [1]
        engine.release(0)
        (a, sent_a, shared_a), (b, sent_b, shared_b) = await first, await second
        assert [n[0].text for n in b] == ["[1]", "[3]", "[1]"] and b[0] is a[0]
        assert (sent_a, shared_a, sent_b, shared_b) == (2, 0, 1, 1)
        assert len(engine.calls) == 2
        # without the cache each call sends its own
        plain, engine2 = TranslationCache(0), HeldEngine()
        one = asyncio.create_task(plain.translate(engine2, "de-en", [[1]], DecodeOptions(), []))
        await until(lambda: len(engine2.calls) == 1)
        two = asyncio.create_task(plain.translate(engine2, "de-en", [[1]], DecodeOptions(), []))
        await until(lambda: len(engine2.calls) == 2)
        engine2.release(0)
        engine2.release(1)
        assert [(await one)[1:], (await two)[1:]] == [(1, 0), (1, 0)]

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_call_waiting_on_one_that_fails_sends_the_sentence_itself():
    async def scenario():
        cache, engine = TranslationCache(10), HeldEngine()
        first = asyncio.create_task(cache.translate(engine, "de-en", [[1]], DecodeOptions(), []))
        await until(lambda: len(engine.calls) == 1)
        second = asyncio.create_task(cache.translate(engine, "de-en", [[1]], DecodeOptions(), []))
        await asyncio.sleep(0)
        engine.fail(0)
        try:
            await first
        except RuntimeError:
            pass
        await until(lambda: len(engine.calls) == 2)
        assert engine.calls[1] == [[1]]
        engine.release(1)
        nbest, sent, shared = await second
        assert nbest[0][0].text == "[1]" and (sent, shared) == (1, 0)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_waiting_call_cancelled_leaves_the_answer_to_the_others_and_a_cancelled_sender_to_them():
    async def scenario():
        cache, engine = TranslationCache(10), HeldEngine()
        first = asyncio.create_task(cache.translate(engine, "de-en", [[1]], DecodeOptions(), []))
        await until(lambda: len(engine.calls) == 1)
        leaving = asyncio.create_task(cache.translate(engine, "de-en", [[1]], DecodeOptions(), []))
        staying = asyncio.create_task(cache.translate(engine, "de-en", [[1]], DecodeOptions(), []))
        await asyncio.sleep(0)
        leaving.cancel()  # its client went away: the first call's answer still reaches the others
        await asyncio.sleep(0)
        engine.release(0)
        assert (await first)[1:] == (1, 0) and (await staying)[1:] == (0, 1) and leaving.cancelled()
        # the sender cancelled (its deadline): the one waiting sends it itself
        sender = asyncio.create_task(cache.translate(engine, "de-en", [[5]], DecodeOptions(), []))
        await until(lambda: len(engine.calls) == 2)
        waiter = asyncio.create_task(cache.translate(engine, "de-en", [[5]], DecodeOptions(), []))
        await asyncio.sleep(0)
        sender.cancel()
        await until(lambda: len(engine.calls) == 3)
        engine.release(2)
        assert (await waiter)[1:] == (1, 0)
        # both cancelled at once (a server shutting down): the waiting one ends too, sending nothing
        sender = asyncio.create_task(cache.translate(engine, "de-en", [[6]], DecodeOptions(), []))
        await until(lambda: len(engine.calls) == 4)
        waiter = asyncio.create_task(cache.translate(engine, "de-en", [[6]], DecodeOptions(), []))
        await asyncio.sleep(0)
        sender.cancel()
        waiter.cancel()
        await asyncio.gather(sender, waiter, return_exceptions=True)
        assert sender.cancelled() and waiter.cancelled() and len(engine.calls) == 4

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_an_interactive_call_does_not_wait_on_a_background_one():
    async def scenario():
        cache, engine = TranslationCache(10), HeldEngine()
        job = asyncio.create_task(cache.translate(engine, "de-en", [[1]], DecodeOptions(), [], priority=1))
        await until(lambda: len(engine.calls) == 1)
        request = asyncio.create_task(cache.translate(engine, "de-en", [[1]], DecodeOptions(), [], priority=0))
        await until(lambda: len(engine.calls) == 2)  # sent at its own priority
        engine.release(1)
        assert (await request)[1:] == (1, 0)
        engine.release(0)
        await job

    asyncio.run(asyncio.wait_for(scenario(), 10))
