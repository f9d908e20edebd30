"""Sentences the engine is asked for once: within a call, a sentence that occurs twice (a document's repeated
heading, a subtitle's "Ja." in many cues, the same text in one request) is sent once and its translation
given to each place; across calls, where the `translation_cache_entries` setting is above 0 and the API
process is the only worker, it keeps the n-best lists of the sentences it translated lately (least recently
used out), and a sentence asked for again with the same model, options, forced prefix and terms is answered
from memory. Where several workers share the engine, the engine keeps them for all (engine/result_cache.py)
and this cache only sends each distinct sentence of a call once.

With the cache on, a sentence asked for while the same question (and priority: an interactive request does
not wait behind a job's queue) is still in the engine for another call is not sent again: it takes that
call's answer when it comes, as a later repeat takes the kept one. A burst of the same text (a page many
visitors ask for at once after it changed) costs one translation, not one per request. If the call that
sent it fails (its deadline, its client gone, the engine lost), the calls that waited on it send the
sentence themselves; a waiting call's own deadline still applies to it. With several workers the engine
shares them across the workers' calls (engine/core.py, `EngineCore._follow`).

A kept translation is what the engine gave for exactly that input: the key is the model, the sentence's
ids as the engine reads them, every decoding option (the scores, alignment and attention figures asked for
too), the target prefix, the sentence's glossary terms and the avoided ones. The cache is emptied whenever
the engine (re)starts, so no answer outlives the models that gave it. On a GPU, sentences batched with
different neighbours may differ in their last digits (float16): a kept answer is one the model gave.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable

from nmt_serve.engine.protocol import DecodeOptions, EngineHypothesis

NBest = list[EngineHypothesis]


class TranslationCache:
    """Least recently used n-best lists, up to `entries` of them (0: none kept; repeats in a call still go once)."""

    def __init__(self, entries: int):
        self.entries = entries
        self._kept: OrderedDict[Hashable, NBest] = OrderedDict()
        # (priority, key) -> the answer of the call that sent it, while that call is in the engine (with the cache on)
        self._in_flight: dict[tuple[int, Hashable], asyncio.Future[NBest]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        """Forget what is kept, and which sentences are in flight (their calls still end as they end)."""
        self._kept.clear()
        self._in_flight.clear()

    async def translate(self, call: Callable[[list[list[int]], list[list[str]] | None], Awaitable[list[NBest]]], model: str,
                        sources: list[list[int]], options: DecodeOptions, target_prefix: list[int], *,
                        terms: list[list[str]] | None = None, avoid: tuple[str, ...] = (),
                        priority: int = 0) -> tuple[list[NBest], int, int]:
        """(each source's n-best, how many distinct sentences this call sent to the engine, how many it took from
        another call's in flight): `call(sources, terms)` translates what is left, each distinct sentence once."""
        common = (model, options, tuple(target_prefix), tuple(avoid))  # options: frozen, compared and hashed by value
        keys = [(common, tuple(ids), tuple(terms[i]) if terms else ()) for i, ids in enumerate(sources)]
        results: list[NBest | None] = [None] * len(sources)
        wanted: dict[Hashable, list[int]] = {}  # key -> the places that take its translation
        # key -> another call's answer to it, in flight, and the places here that take it
        awaited: dict[Hashable, tuple[asyncio.Future[NBest], list[int]]] = {}
        for i, key in enumerate(keys):
            kept = self._kept.get(key) if self.entries else None
            if kept is not None:
                self._kept.move_to_end(key)
                results[i] = kept
            elif key in awaited:
                awaited[key][1].append(i)
            elif self.entries and key not in wanted and (answer := self._in_flight.get((priority, key))) is not None:
                awaited[key] = (answer, [i])
            else:
                wanted.setdefault(key, []).append(i)
        sent = await self._send(call, wanted, priority, sources, terms, results)
        shared = 0
        if awaited:
            again: dict[Hashable, list[int]] = {}
            for key, (answer, places) in awaited.items():
                try:  # shielded: this call's own cancellation leaves the answer to the others waiting on it
                    nbest = await asyncio.shield(answer)
                except asyncio.CancelledError:
                    own = asyncio.current_task()  # Task.cancelling: Python 3.11 on
                    if not answer.cancelled() or getattr(own, "cancelling", lambda: 0)():  # this call is being cancelled
                        raise
                    again[key] = places  # the call that sent it failed: send it from here
                    continue
                shared += 1
                for i in places:
                    results[i] = nbest
            sent += await self._send(call, again, priority, sources, terms, results)
        return results, sent, shared  # type: ignore[return-value]

    async def _send(self, call, wanted: dict[Hashable, list[int]], priority: int, sources: list[list[int]],
                    terms: list[list[str]] | None, results: list[NBest | None]) -> int:
        """The engine translates each wanted sentence once; the answers go to their places (and are kept).
        With the cache on, other calls asking for the same meanwhile wait for them (_in_flight)."""
        if not wanted:
            return 0
        answers: dict[Hashable, asyncio.Future[NBest]] = {}
        if self.entries:
            loop = asyncio.get_running_loop()
            for key in wanted:
                answers[key] = self._in_flight[(priority, key)] = loop.create_future()
        first = [places[0] for places in wanted.values()]
        try:
            fresh = await call([sources[i] for i in first], [terms[i] for i in first] if terms else None)
        except BaseException:
            for key, answer in answers.items():  # the calls waiting on these send them themselves
                self._settle(priority, key, answer, None)
            raise
        for (key, places), nbest in zip(wanted.items(), fresh):
            for i in places:
                results[i] = nbest
            self._keep(key, nbest)
            if key in answers:
                self._settle(priority, key, answers[key], nbest)
        return len(wanted)

    def _settle(self, priority: int, key: Hashable, answer: asyncio.Future, nbest: NBest | None) -> None:
        if self._in_flight.get((priority, key)) is answer:
            del self._in_flight[(priority, key)]
        if answer.done():
            return
        if nbest is None:
            answer.cancel()
        else:
            answer.set_result(nbest)

    def _keep(self, key: Hashable, nbest: NBest) -> None:
        if not self.entries:
            return
        self._kept[key] = nbest
        self._kept.move_to_end(key)
        while len(self._kept) > self.entries:
            self._kept.popitem(last=False)
