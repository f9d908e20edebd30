"""What the API process knows of the models the engine serves: the directions it routes to them, what
the engine reports of them, and their input processor (sentencepiece only, no torch): the API tokenizes
each text once, checks its limits on the ids and sends them to the engine.

A direction ("fr-cs") is served by a bilingual checkpoint of that pair or by a multilingual checkpoint
listing it; the API then puts the model's target-language tag before the ids. Where several models
serve one direction, network.routing picks it (on CPU among those within cpu_cost_limit of the cheapest one's
work per token, then the best recorded test BLEU, then a bilingual model), as the engine did when it left the
others unloaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from nmt_serve.inference.input_processor import InputProcessor
from nmt_serve.network.routing import DEFAULT_CPU_COST_LIMIT, Offer, best, preferred_names
from nmt_serve.network.tokenizer import Tokenizer
from nmt_serve.text.language_codes import public_directions, public_names
from nmt_serve.text.quality_flags import FlagThresholds


@dataclass
class ServedDirection:
    id: str  # the direction: "de-en"
    info: dict  # as the engine reports the model serving it: parameters, device, dtype, path, ...
    inputs: InputProcessor  # the model's, shared by its directions
    source: str
    target: str
    engine_model: str  # the engine's id of the model: "de-en", or a multilingual checkpoint's name

    @property
    def multilingual(self) -> bool:
        return self.inputs.multilingual

    def encode(self, text: str) -> list[int]:
        """Source ids as the engine takes them (eos excluded; a multilingual model's tag, or a fairseq-family
        model's source code, first)."""
        return self.inputs.tokens(text, self.target, self.source)

    @cached_property
    def flag_thresholds(self) -> FlagThresholds:
        """The quality flags' thresholds of the model serving it: its own, measured, or the defaults."""
        return FlagThresholds.of(_flag_thresholds(self.info, self.id))

    @property
    def target_prefix(self) -> list[int]:
        """What every translation of this direction is forced to start with (a fairseq-family model's code)."""
        return self.inputs.target_prefix(self.target)

    def count(self, text: str) -> int:
        """Source pieces of a text (no tag): what sentence segmentation holds to max_sentence_tokens."""
        return self.inputs.count(text)

    def describe(self) -> dict:
        """The engine's report of the model, as this direction's entry of /v1/models."""
        return {**self.info, "id": self.id, "source": self.source, "target": self.target, "model": self.engine_model,
                "multilingual": self.multilingual, "test_bleu": _test_bleu(self.info, self.id),
                "test_scores": _test_scores(self.info, self.id), "quality_flags": _flag_thresholds(self.info, self.id)}


def language_names(served: dict[str, ServedDirection]) -> dict[str, str]:
    """{a name a request may give a language, case-folded: the service's name for it} over the served models,
    so that a request may name a language either way (`deu_Latn` or `de`), in any case (`DE`, as
    LibreTranslate takes it)."""
    names: dict[str, str] = {}
    for direction in served.values():
        names[direction.source.casefold()], names[direction.target.casefold()] = direction.source, direction.target
    for direction in {id(d.inputs): d for d in served.values()}.values():
        names.update((code.casefold(), name) for code, name in public_names(direction.inputs.codes).items())
    return names


def named(names: dict[str, str], name: str) -> str:
    """The service's name of a language named as a user may name it (language_names' table), or the name as given."""
    return names.get(name.casefold(), name)


def _test_bleu(info: dict, direction: str) -> float | None:
    return (info.get("test_bleu") or {}).get(direction)


def _test_scores(info: dict, direction: str) -> dict[str, float]:
    return (info.get("test_scores") or {}).get(direction, {})


def served_directions(infos: list[dict], cpu_cost_limit: float = DEFAULT_CPU_COST_LIMIT, prefer: str = "") -> dict[str, ServedDirection]:
    """{direction: ServedDirection} over every model the engine reports, each direction routed to one model
    (cpu_cost_limit: Settings', where the models run on the CPU; prefer: Settings', by model or checkpoint
    directory name)."""
    preferred = preferred_names(prefer, {Path(i["path"]).name: i["id"] for i in infos if i.get("path")})
    candidates: dict[str, list[ServedDirection]] = {}
    for info in infos:
        codes = info.get("language_codes")
        directions = info.get("directions") or [f"{info['source']}-{info['target']}"]
        inputs = InputProcessor(Tokenizer(info["src_tokenizer"], info.get("src_vocab")), target_lang=info["target"],
                                directions=directions, target_tags=info.get("target_tags"),
                                append_eos=info.get("append_eos_to_source", True), max_positions=info.get("max_positions"),
                                language_codes=codes, code_pairs=info.get("directions"), source_suffix=info.get("source_suffix"))
        if codes:  # every pair of its languages (or those it serves), each by its ISO 639-1 name where it has one
            directions = public_directions(info.get("directions") or [f"{s}-{t}" for s in codes for t in codes if s != t], codes)
        for direction in directions:
            source, target = direction.split("-", 1)
            candidates.setdefault(direction, []).append(ServedDirection(direction, info, inputs, source, target, info["id"]))

    def chosen(found: list[ServedDirection]) -> ServedDirection:
        offers = [Offer(m.engine_model, m.id, _test_scores(m.info, m.id), m.multilingual, m.info.get("decode_cost", 0.0)) for m in found]
        on_cpu = all(str(m.info.get("device", "cpu")).startswith("cpu") for m in found)
        pick = best(offers, cpu_cost_limit if on_cpu else 0.0, preferred)
        return next(m for m, o in zip(found, offers) if o is pick)

    return {d: chosen(found) for d, found in sorted(candidates.items())}


@dataclass(frozen=True)
class Pivot:
    """A direction no model serves, translated through a language that models translate from the source and
    into the target (de->fr as de->en, then en->fr), as Argos Translate (LibreTranslate's engine) does."""
    id: str  # "de-fr"
    first: ServedDirection  # de-en
    second: ServedDirection  # en-fr

    @property
    def source(self) -> str:
        return self.first.source

    @property
    def target(self) -> str:
        return self.second.target

    @property
    def through(self) -> str:
        return self.first.target

    @property
    def engine_model(self) -> str:
        """The models of both hops, as a response's `model` names them: "de-en+en-fr"."""
        return f"{self.first.engine_model}+{self.second.engine_model}"

    def describe(self) -> dict:
        """Its entry of /v1/models' `pivots`."""
        return {"id": self.id, "source": self.source, "target": self.target, "through": self.through,
                "models": [self.first.engine_model, self.second.engine_model]}


def pivot_directions(served: dict[str, ServedDirection], through: str) -> dict[str, Pivot]:
    """{direction: Pivot} for every pair of served languages no model translates directly that models translate
    through `through` (Settings.pivot_language; "" for none)."""
    if not through:
        return {}
    into = {m.source: m for m in served.values() if m.target == through}  # de -> de-en
    out_of = {m.target: m for m in served.values() if m.source == through}  # fr -> en-fr
    return {f"{s}-{t}": Pivot(f"{s}-{t}", first, second) for s, first in sorted(into.items())
            for t, second in sorted(out_of.items()) if s != t and f"{s}-{t}" not in served}


def _flag_thresholds(info: dict, direction: str) -> dict[str, float]:
    """The model's thresholds for this direction: its own where measured, else the model's pooled ones."""
    table = info.get("quality_flags") or {}
    return (table.get("directions") or {}).get(direction) or table.get("default") or {}
