"""Terminology in the engine: per-sentence terms and avoided terms, constrained and free sentences in one
running batch, and a term that cannot fit giving the free translation flagged."""
from __future__ import annotations

import re
import time

import pytest
import torch

from nmt_serve.engine.core import EngineConfig, EngineCore
from nmt_serve.engine.protocol import DecodeOptions, Translate
from nmt_serve.inference.search import SearchOptions, generate
from nmt_serve.inference.translator import Translator

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.",
          "Ein kleines Kind sitzt auf einer Bank."]


def sources(translator):
    """The encoder's ids of GERMAN, as the engine gets them (they decide the sentence-end rule of its constraints)."""
    return [translator.inputs.source_ids(translator.src_tokenizer.encode(t)) for t in GERMAN]


@pytest.fixture(scope="module")
def translator(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, device="cpu")


def run(translator, *, terms=None, avoid=(), beam=1, max_length=16):
    core = EngineCore({"de-en": translator}, EngineConfig())
    core.admission.rate = 1e9
    message = Translate("c", "de-en", [translator.src_tokenizer.encode(t) for t in GERMAN],
                        DecodeOptions(beam_size=beam, max_length=max_length, return_scores=True), time.monotonic() + 60,
                        terms=terms, avoid=list(avoid))
    replies = core.handle(message)
    while core.busy:
        replies += core.work()
    [reply] = replies
    assert reply.error is None, reply.message
    return [nbest[0] for nbest in reply.value]


def through_engine(translator, texts, terms, **options):
    """German texts into English through an engine core of this shipped (multilingual) translator: each
    text's best hypothesis, and the core."""
    core = EngineCore({"de-en": translator}, EngineConfig())
    core.admission.rate = 1e9
    replies = core.handle(Translate("c", "de-en", [translator.inputs.tokens(t, "en", "de") for t in texts],
                                    DecodeOptions(beam_size=4, **options), time.monotonic() + 60, terms=terms))
    while core.busy:
        replies += core.work()
    [reply] = replies
    assert reply.error is None, reply.message
    return [nbest[0] for nbest in reply.value], core


def test_terms_appear_where_asked_and_free_sentences_are_as_alone(translator):
    free = run(translator)
    terms = [["house"], [], ["green", "cat"], []]
    out = run(translator, terms=terms)
    for hyp, wanted, alone in zip(out, terms, free):
        assert all(term in hyp.text for term in wanted), (hyp.text, wanted)
        assert not hyp.constraint_unmet
        if not wanted:  # free sentences shared the steps of the constrained ones, and are what they were alone
            assert hyp.text == alone.text
    # the engine's constrained search is the eager one's, token for token
    src = translator.inputs
    lexical = translator.lexical_constraints(terms, (), len(terms), sources(translator))
    for i, (hyp, lex) in enumerate(zip(out, lexical)):
        if lex is None:
            continue
        ids = src.source_ids(translator.src_tokenizer.encode(GERMAN[i]))
        # a greedy request with terms runs constrained beam search (CONSTRAINED_MIN_BEAM), here and there
        [eager] = generate(translator.runner, torch.tensor([ids]), SearchOptions(beam_size=1, max_length=16), constraints=[lex])
        assert translator.tgt_tokenizer.decode(eager[0].tokens) == hyp.text


def test_avoided_terms_are_enforced_as_in_the_eager_search(translator):
    # random weights write pieces that re-encode differently, so the check is on ids, through the eager search
    # (whose avoidance the unit tests check token by token)
    encode, decode = translator.tgt_tokenizer.encode, translator.tgt_tokenizer.decode
    free = run(translator, beam=2)
    avoided = decode(encode(free[0].text)[:2])
    out = run(translator, avoid=[avoided], beam=2)
    [lexical] = translator.lexical_constraints(None, [avoided], 1)
    for i, hyp in enumerate(out):
        ids = translator.inputs.source_ids(translator.src_tokenizer.encode(GERMAN[i]))
        [eager] = generate(translator.runner, torch.tensor([ids]), SearchOptions(beam_size=2, max_length=16), constraints=[lexical])
        assert decode(eager[0].tokens) == hyp.text


def test_an_avoided_term_never_written_changes_nothing():
    """Avoided terms only: no term to meet, so a hypothesis ends as a free one does (among the best K).
    Before, any eos among the best 2K ended one, the search stopped early and the shipped model wrote
    "A man with a dog" for "A man with a dog." (4 of these 6 changed). The random test models do not
    show it: their eos is rarely among the candidates."""
    from conftest import ROOT

    translator = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu")
    texts = ["Ein Mann mit einem Hund.", "Ein Junge springt ins Wasser.", "Zwei Kinder spielen im Park.",
             "Drei Männer arbeiten auf einer Baustelle.", "Eine Frau liest ein Buch.", "Ein Hund rennt über die Wiese."]
    free = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4)
    avoided = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4, avoid=["xylophone"])
    assert not any("xylophone" in r.text for r in free)
    assert [r.text for r in avoided] == [r.text for r in free]


def test_a_term_the_model_writes_anyway_leaves_its_translation_as_it_is():
    """Terms are placed only where the free translation lacks them. Searched with the term from the start,
    each of these came out otherwise though its free translation has the term ("A group of men are
    loading boxes on a truck", without its full stop: the beams that had it ended on their own best eos);
    so did 48 of 120 Multi30k validation sentences. The offline Translator and the engine alike."""
    from conftest import ROOT

    translator = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu")
    texts = ["Eine Gruppe von Männern lädt Kisten auf einen Lastwagen.", "Ein Hund springt über einen Baumstamm im Wald.",
             "Eine alte Frau verkauft Obst auf dem Markt.", "Ein Mann in einem blauen Hemd telefoniert im Büro."]
    terms = [["truck"], ["woods"], ["market"], ["office"]]
    free = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4)
    assert all(t[0] in r.text for r, t in zip(free, terms))
    constrained = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4, terms=terms)
    assert [r.text for r in constrained] == [r.text for r in free]
    engine, _ = through_engine(translator, texts, terms)
    assert [h.text for h in engine] == [r.text for r in free]
    assert not any(h.constraint_unmet for h in engine)


@pytest.mark.parametrize("step_mode", ["eager", "static"])
def test_two_terms_one_nested_in_the_other_are_both_placed_as_whole_words(step_mode):
    """"zebra" and "zebras": once "zebra" is written, the piece "s" both breaks it as a word and goes on
    into "zebras". Before, the whole-word rule banned that piece, so neither was placed (the free
    translation, flagged). The eager search and the device search's step program alike."""
    from conftest import ROOT

    translator = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu", step_mode=step_mode, warmup=False)
    assert translator.uses_static_decoder == (step_mode == "static")  # the device search and its constraints' step
    cases = [("Ein Zebra und zwei Zebras stehen auf der Wiese.", ["zebra", "zebras"]),
             ("Ein Hund liegt vor der Hundehütte.", ["doghouse", "dog"])]
    for text, terms in cases:
        [result] = translator.translate([text], source_lang="de", target_lang="en", beam_size=4, terms=[terms])
        words = result.text.rstrip(".").split()
        assert not result.hypotheses[0].constraint_unmet and all(term in words for term in terms), (result.text, terms)


def test_an_avoided_term_is_avoided_in_any_case():
    """"Dog" is one token to the model and "dog" another: an avoided term is avoided as given, in lower
    case, capitalized and in upper case. Before, avoid=["Dog"] left "A dog runs ..." as it was."""
    from conftest import ROOT

    translator = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu")
    texts = ["Ein Hund rennt über die Wiese.", "Der Hund schläft."]
    free = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4)
    assert [r.text.split()[:2] for r in free] == [["A", "dog"], ["The", "dog"]]
    for avoid in (["Dog"], ["DOG"], ["dog"]):
        out = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4, avoid=avoid)
        assert not any(w.lower().strip(".") == "dog" for r in out for w in r.text.split()), (avoid, [r.text for r in out])
    out = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4, avoid=["THE DOG"])
    assert out[1].text.split()[:2] != ["The", "dog"] and out[0].text == free[0].text


def test_a_term_that_does_not_fit_gives_the_free_translation_flagged(translator):
    free = run(translator, beam=4, max_length=3)
    out = run(translator, terms=[["supercalifragilistic expialidocious"], [], [], []], beam=4, max_length=3)
    assert out[0].constraint_unmet and out[0].text == free[0].text
    assert not any(h.constraint_unmet for h in out[1:])



def test_terms_are_placed_inside_the_sentence_not_after_its_end():
    """Where the model reaches its sentence's end with a term unplaced, it may not write the full stop
    either (LexicalConstraints.sentence_ends): before, these came out as "A man is preparing food fellow
    at the stove. one.", "People sitting in a train. within one." (a glossary of function words: 27
    of 116 captions so). The eager search and the engine alike; and the engine says what the terms cost
    against the free translation, which scores the source."""
    from conftest import ROOT

    from nmt_serve.text.quality_flags import MAX_CONSTRAINT_COST

    translator = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu", warmup=False)
    texts = ["Ein Mann bereitet am Herd Essen zu.", "Leute sitzen in einem Zug.",
             "Eine Teenagerin spielt bei einem Spiel Trompete auf dem Feld.", "Ein Mann fährt Fahrrad.",
             "Ein Mädchen springt ins Wasser."]
    terms = [["one", "fellow"], ["one", "within"], ["upon", "one"], ["guy"], ["lass"]]
    offline = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4, terms=terms)
    engine, _ = through_engine(translator, texts, terms, return_scores=True)
    assert [h.text for h in engine] == [r.text for r in offline]
    free = translator.translate(texts, source_lang="de", target_lang="en", beam_size=4, return_scores=True)
    for hyp, wanted, alone in zip(engine, terms, free):
        assert not hyp.constraint_unmet and all(f" {t}" in f" {hyp.text}" for t in wanted), hyp.text
        assert not re.search(r"[.!?]\s*\w", hyp.text), hyp.text  # nothing after a sentence's end
        assert hyp.free_mean_logprob == pytest.approx(alone.hypotheses[0].score / (len(alone.hypotheses[0].tokens) + 1), abs=1e-4)
        assert hyp.constraint_cost == pytest.approx((alone.hypotheses[0].score - hyp.score) / len(wanted), abs=1e-3)
    # "guy" fits (3.9 a term); "one" and "fellow" do not (13.5), nor does "lass", never in its training data (24)
    assert engine[3].constraint_cost < MAX_CONSTRAINT_COST < min(engine[0].constraint_cost, engine[4].constraint_cost)


def test_the_device_search_holds_the_sentence_end_back_too():
    """The same rule in the device search's step program (the engine's search with the static decoder, on the
    CPU op by op): the eager search's translations."""
    from conftest import ROOT

    texts, terms = ["Ein Mann bereitet am Herd Essen zu.", "Leute sitzen in einem Zug."], [["one", "fellow"], ["one", "within"]]
    static = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu", step_mode="static", warmup=False,
                             static_rows=8, static_length=32)
    engine, core = through_engine(static, texts, terms)
    assert {key[2] for key in core.groups} == {"device"}
    device = [h.text for h in engine]
    eager = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu", warmup=False)
    assert device == [r.text for r in eager.translate(texts, source_lang="de", target_lang="en", beam_size=4, terms=terms)]
    assert not any(re.search(r"[.!?]\s*\w", t) for t in device), device


def test_a_source_with_a_sentence_end_inside_may_end_one_before_its_terms(translator):
    """A number, an abbreviation or two sentences: the translation may need a full stop before the
    terms are in, so only a source that ends its sentence at its end (or nowhere) holds it back."""
    texts = ["Ein Mann fährt Fahrrad.", "Ein Mann fährt Fahrrad", "Dr. Müller fährt Fahrrad.", "Er fährt 3.5 km. Sie läuft!"]
    ids = [translator.inputs.source_ids(translator.src_tokenizer.encode(t)) for t in texts]
    lexical = translator.lexical_constraints([["house"]] * 4, (), 4, ids)
    assert [lex.sentence_ends is not None for lex in lexical] == [True, True, False, False]
    ends = lexical[0].sentence_ends
    pieces = translator.tgt_tokenizer.pieces(ends.nonzero().view(-1).tolist())
    assert pieces and all(set(p.lstrip("\u2581")) <= set(".!?\u2026\u3002\uff01\uff1f") for p in pieces)
    assert translator.lexical_constraints([["house"]], (), 1)[0].sentence_ends is None  # no sources: as before
