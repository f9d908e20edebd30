"""The engine's translation cache: where several API workers share one engine (`workers` > 1), the n-best
lists of the sentences it translated lately are kept here, once for all of them, so that a sentence asked
for again through any worker is answered without a search. With one worker the API process keeps them
itself (service/translation_cache.py), which also spares the call to the engine.

The key is what decides the answer, as the API's cache has it: the model, every decoding option, the
target prefix, the avoided terms, the sentence's encoder ids and its glossary terms. The cache lives and
dies with the engine process, so no answer outlives the models that gave it. A call's sentences are
looked up when it is screened (on the I/O thread: a call answered from memory reserves no admitted work)
and kept when they finish (on the main thread): one lock guards both. A text asked for while another call's
search of the same key runs takes that search's answer instead (`EngineCore._follow`).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from nmt_serve.engine.protocol import EngineHypothesis, Translate

NBest = list[EngineHypothesis]


class ResultCache:
    """Least recently used n-best lists, up to `entries` of them (0: none)."""

    def __init__(self, entries: int):
        self.entries = entries
        self._kept: OrderedDict[Hashable, NBest] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def keys(self, call: Translate, sources: list[list[int] | None]) -> list[Hashable | None]:
        """Per text of the call, its key (None for an empty text, which is never searched, and for every
        text when nothing is kept)."""
        if not self.entries:
            return [None] * len(sources)
        # options: a frozen dataclass, compared and hashed by value as it is
        common = (call.model, call.options, tuple(call.target_prefix), tuple(call.avoid))
        return [None if ids is None else (common, tuple(ids), tuple(call.terms[i]) if call.terms else ())
                for i, ids in enumerate(sources)]

    def get(self, keys: list[Hashable | None]) -> list[NBest | None]:
        """The kept n-best of each key (None: not kept, or no key)."""
        if not self.entries:
            return [None] * len(keys)
        with self._lock:
            found = []
            for key in keys:
                kept = self._kept.get(key) if key is not None else None
                if kept is not None:
                    self._kept.move_to_end(key)
                found.append(kept)
            return found

    def put(self, key: Hashable | None, nbest: NBest) -> None:
        if not self.entries or key is None:
            return
        with self._lock:
            self._kept[key] = nbest
            self._kept.move_to_end(key)
            while len(self._kept) > self.entries:
                self._kept.popitem(last=False)
