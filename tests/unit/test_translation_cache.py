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
    nbest, sent = asyncio.run(cache.translate(engine, model, sources, options, list(prefix), terms=terms))
    assert sent == (len(engine.calls[-1]) if engine.calls and sent else 0)
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
