"""Which model serves a direction that several could: the one with the best test BLEU recorded in its
model card (test_2016_flickr, beam 4, float weights), then a bilingual model before a multilingual one,
then the name. The engine uses it to leave unneeded checkpoints unloaded and the API to route requests,
so both processes decide alike."""
from __future__ import annotations

from collections.abc import Iterable


def preference(test_bleu: float | None, multilingual: bool, name: str) -> tuple:
    """Sort key of one model for one direction: the larger, the more preferred."""
    return (test_bleu is not None, test_bleu or 0.0, not multilingual, name)


def route(offers: Iterable[tuple[str, str, float | None, bool]]) -> dict[str, str]:
    """{direction: model name} from (model name, direction, its test BLEU or None, multilingual) offers."""
    best: dict[str, tuple[tuple, str]] = {}
    for name, direction, bleu, multilingual in offers:
        key = preference(bleu, multilingual, name)
        if direction not in best or key > best[direction][0]:
            best[direction] = (key, name)
    return {direction: name for direction, (_, name) in sorted(best.items())}
