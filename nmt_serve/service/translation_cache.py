"""Sentences the engine is asked for once: within a call, a sentence that occurs twice (a document's repeated
heading, a subtitle's "Ja." in many cues, the same text in one request) is sent once and its translation
given to each place; across calls, where the `translation_cache_entries` setting is above 0 and the API
process is the only worker, it keeps the n-best lists of the sentences it translated lately (least recently
used out), and a sentence asked for again with the same model, options, forced prefix and terms is answered
from memory. Where several workers share the engine, the engine keeps them for all (engine/result_cache.py)
and this cache only sends each distinct sentence of a call once.

A kept translation is what the engine gave for exactly that input: the key is the model, the sentence's
ids as the engine reads them, every decoding option (the scores, alignment and attention figures asked for
too), the target prefix, the sentence's glossary terms and the avoided ones. The cache is emptied whenever
the engine (re)starts, so no answer outlives the models that gave it. On a GPU, sentences batched with
different neighbours may differ in their last digits (float16): a kept answer is one the model gave.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable

from nmt_serve.engine.protocol import DecodeOptions, EngineHypothesis

NBest = list[EngineHypothesis]


class TranslationCache:
    """Least recently used n-best lists, up to `entries` of them (0: none kept; repeats in a call still go once)."""

    def __init__(self, entries: int):
        self.entries = entries
        self._kept: OrderedDict[Hashable, NBest] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        self._kept.clear()

    async def translate(self, call: Callable[[list[list[int]], list[list[str]] | None], Awaitable[list[NBest]]], model: str,
                        sources: list[list[int]], options: DecodeOptions, target_prefix: list[int], *,
                        terms: list[list[str]] | None = None, avoid: tuple[str, ...] = ()) -> tuple[list[NBest], int]:
        """(each source's n-best, how many the engine translated): `call(sources, terms)` translates what is
        left, each distinct sentence once."""
        common = (model, options, tuple(target_prefix), tuple(avoid))  # options: frozen, compared and hashed by value
        keys = [(common, tuple(ids), tuple(terms[i]) if terms else ()) for i, ids in enumerate(sources)]
        results: list[NBest | None] = [None] * len(sources)
        wanted: dict[Hashable, list[int]] = {}  # key -> the places that take its translation
        for i, key in enumerate(keys):
            kept = self._kept.get(key) if self.entries else None
            if kept is not None:
                self._kept.move_to_end(key)
                results[i] = kept
            else:
                wanted.setdefault(key, []).append(i)
        if wanted:
            first = [places[0] for places in wanted.values()]
            fresh = await call([sources[i] for i in first], [terms[i] for i in first] if terms else None)
            for (key, places), nbest in zip(wanted.items(), fresh):
                for i in places:
                    results[i] = nbest
                self._keep(key, nbest)
        return results, len(wanted)  # type: ignore[return-value]

    def _keep(self, key: Hashable, nbest: NBest) -> None:
        if not self.entries:
            return
        self._kept[key] = nbest
        self._kept.move_to_end(key)
        while len(self._kept) > self.entries:
            self._kept.popitem(last=False)
