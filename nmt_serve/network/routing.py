"""Which model serves a direction that several could.

Each model card records test scores per direction and test set (Multi30k's test_2016_flickr, the Debian
corpus's held-out package descriptions, ...: beam 4, float weights). Candidates for a direction are
compared over every test set any of them was measured on:
1. the more of those sets a model was measured on, the better: a score on image captions says nothing
   about other text, so a model measured only there does not take a direction from one shown on more;
2. then the mean BLEU over its sets, each set counting once, so that a few BLEU on captions do not
   outweigh twenty on package descriptions;
3. then a bilingual model before a multilingual one, then the name.
On CPU one sentence's latency grows with the model's work per token, and a larger model may score better
and still be too slow to be the default: there a candidate whose work per token (decode_cost) is more than
`cpu_cost_limit` times the cheapest scored candidate's does not serve the direction, whatever its scores (a CPU
host keeps the small model; a GPU takes the larger one). Before all of that, a model the operator prefers
(Settings.prefer: a checkpoint converted from OPUS-MT or NLLB-200 comes with no scores on these sets) serves
every direction it can, the first named first. The engine uses it to leave unneeded checkpoints unloaded
and the API to route requests, so both processes decide alike."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nmt_serve.network.config import ModelConfig

# the service's default (Settings.cpu_cost_limit): the latency a CPU host's default model may cost over the
# cheapest one of a direction; 23.9M parameters against the shipped 8.1M cost 2.96x and took 2.37x the time of
# one sentence at 1 thread (bench.routing_cost)
DEFAULT_CPU_COST_LIMIT = 2.0


def decode_cost(config: ModelConfig) -> int:
    """Multiply-adds per generated token of one sentence whose source is as long as its translation: every
    weight of the encoder's and the decoder's layers once (the cross-attention's keys and values once per
    source token), and the output layer. Attention over the sequence itself is left out: at sentence
    lengths it is a small part of either."""
    d, ff = config.d_model, config.d_ff
    return (config.n_encoder_layers * (4 * d * d + 2 * d * ff) + config.n_decoder_layers * (8 * d * d + 2 * d * ff)
            + d * config.tgt_vocab_size)


@dataclass(frozen=True)
class Offer:
    """A model able to serve a direction, with what its card recorded for it ({test set: BLEU})."""
    name: str
    direction: str
    scores: Mapping[str, float] = field(default_factory=dict)
    multilingual: bool = False
    cost: float = 0.0  # decode_cost of the model; 0: unknown, never passed over for it


def affordable(offers: Iterable[Offer], cost_limit: float = 0.0) -> list[Offer]:
    """The offers for one direction whose cost is at most cost_limit times the cheapest one's (all of them
    when cost_limit is 0 or no cost is known). The cheapest is taken among the offers with recorded scores
    where there are any: a model nothing was measured on (a converted one) would lose to them by scores, so
    its being small does not rule them out."""
    offers = list(offers)
    known = [o.cost for o in offers if o.cost > 0 and o.scores] or [o.cost for o in offers if o.cost > 0]
    if cost_limit <= 0 or not known:
        return offers
    return [o for o in offers if o.cost <= cost_limit * min(known)]


def best(offers: Iterable[Offer], cost_limit: float = 0.0, prefer: Sequence[str] = ()) -> Offer:
    """The offer that serves one direction: the first of `prefer` (model names) among them, whatever its
    scores and cost; else the best by scores among those cost_limit allows (see affordable; 0 on a GPU)."""
    offers = list(offers)
    if len(offers) == 1:  # whatever the rules, the only one (most of a many-to-many model's 40,602 directions)
        return offers[0]
    preferred = [o for o in offers if o.name in prefer]
    if preferred:
        return min(preferred, key=lambda o: prefer.index(o.name))
    offers = affordable(offers, cost_limit)
    test_sets = {s for o in offers for s in o.scores}

    def key(o: Offer) -> tuple:
        measured = [o.scores[s] for s in test_sets if s in o.scores]
        return (len(measured), sum(measured) / len(measured) if measured else 0.0, not o.multilingual, o.name)

    return max(offers, key=key)


def route(offers: Iterable[Offer], cost_limit: float = 0.0, prefer: Sequence[str] = ()) -> dict[str, str]:
    """{direction: model name} over the offers of every direction."""
    by_direction: dict[str, list[Offer]] = {}
    for offer in offers:
        by_direction.setdefault(offer.direction, []).append(offer)
    return {direction: best(found, cost_limit, prefer).name for direction, found in sorted(by_direction.items())}


def preferred_names(prefer: str | Sequence[str], aliases: Mapping[str, str] | None = None) -> list[str]:
    """Settings.prefer (comma-separated) as model names, in its order: an item may also be another name of a
    model (`aliases`: its checkpoint directory's name -> the model's name)."""
    items = prefer.split(",") if isinstance(prefer, str) else prefer
    return [(aliases or {}).get(p.strip(), p.strip()) for p in items if p.strip()]
