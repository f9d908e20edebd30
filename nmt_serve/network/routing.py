"""Which model serves a direction that several could.

Each model card records test scores per direction and test set (Multi30k's test_2016_flickr, the Debian
corpus's held-out package descriptions, ...: beam 4, float weights). Candidates for a direction are
compared over every test set any of them was measured on:
1. the more of those sets a model was measured on, the better: a score on image captions says nothing
   about other text, so a model measured only there does not take a direction from one shown on more;
2. then the mean BLEU over its sets, each set counting once, so that a few BLEU on captions do not
   outweigh twenty on package descriptions;
3. then a bilingual model before a multilingual one, then the name.
The engine uses it to leave unneeded checkpoints unloaded and the API to route requests, so both
processes decide alike."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Offer:
    """A model able to serve a direction, with what its card recorded for it ({test set: BLEU})."""
    name: str
    direction: str
    scores: Mapping[str, float] = field(default_factory=dict)
    multilingual: bool = False


def best(offers: Iterable[Offer]) -> Offer:
    """The preferred offer among those for one direction."""
    offers = list(offers)
    test_sets = {s for o in offers for s in o.scores}

    def key(o: Offer) -> tuple:
        measured = [o.scores[s] for s in test_sets if s in o.scores]
        return (len(measured), sum(measured) / len(measured) if measured else 0.0, not o.multilingual, o.name)

    return max(offers, key=key)


def route(offers: Iterable[Offer]) -> dict[str, str]:
    """{direction: model name} over the offers of every direction."""
    by_direction: dict[str, list[Offer]] = {}
    for offer in offers:
        by_direction.setdefault(offer.direction, []).append(offer)
    return {direction: best(found).name for direction, found in sorted(by_direction.items())}
