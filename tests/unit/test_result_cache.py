"""The engine's result cache (engine/result_cache.py): a text's key holds everything its translation depends on,
by value, so that the same request from another API worker finds it and any other one does not."""
from __future__ import annotations

from nmt_serve.engine.protocol import DecodeOptions, EngineHypothesis, Translate
from nmt_serve.engine.result_cache import ResultCache


def call(**overrides) -> Translate:
    values = dict(id="1-1-1", model="de-en", sources=[[5, 6], [7]], options=DecodeOptions(beam_size=4), deadline=0.0)
    return Translate(**{**values, **overrides})


def test_a_text_is_found_again_under_equal_options_and_only_under_them():
    cache = ResultCache(10)
    first = call()
    keys = cache.keys(first, first.sources)
    cache.put(keys[0], [EngineHypothesis("a dog")])
    again = call(id="2-1-1", options=DecodeOptions(beam_size=4))  # another worker's call: equal, not the same objects
    assert [n and n[0].text for n in cache.get(cache.keys(again, again.sources))] == ["a dog", None]
    for other in (dict(options=DecodeOptions(beam_size=1)), dict(options=DecodeOptions(beam_size=4, return_alignment=True)),
                  dict(model="en-de"), dict(target_prefix=[9]), dict(avoid=["Hund"]), dict(terms=[["dog"], []])):
        changed = call(**other)
        assert cache.get(cache.keys(changed, changed.sources)) == [None, None], other


def test_nothing_is_kept_without_entries_and_empty_texts_have_no_key():
    off = ResultCache(0)
    off.put(("k",), [EngineHypothesis("x")])
    assert len(off) == 0 and off.keys(call(), [[5], None]) == [None, None]
    assert ResultCache(10).keys(call(), [[5], None])[1] is None
