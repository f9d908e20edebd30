"""Terminology in the engine's device search (a static decoder: CPU op by op here): constrained sentences
join the device search's running batch with the free ones, no eager group; the constrained ones get
the eager constrained search's translations, the free ones what they get with no glossary anywhere,
and a term that cannot fit gives the free translation flagged."""
from __future__ import annotations

import pytest
import torch
from test_terminology import GERMAN, run

from nmt_serve.engine.core import EngineCore
from nmt_serve.inference.search import SearchOptions, generate
from nmt_serve.inference.translator import Translator


def sources(translator):
    """The encoder's ids of GERMAN, as the engine gets them (they decide the sentence-end rule of its constraints)."""
    return [translator.inputs.source_ids(translator.src_tokenizer.encode(t)) for t in GERMAN]


@pytest.fixture(scope="module")
def translator(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, device="cpu", step_mode="static", static_rows=64, static_length=64)


@pytest.fixture
def kinds(monkeypatch):
    """The kinds of search ("device", "eager") the engine makes while the test runs."""
    made = set()
    new_search = EngineCore._new_search

    def recording(self, model_id, beam, kind):
        made.add(kind)
        return new_search(self, model_id, beam, kind)

    monkeypatch.setattr(EngineCore, "_new_search", recording)
    return made

def eager(translator, i, lexical, beam=4, max_length=16):
    ids = translator.inputs.source_ids(translator.src_tokenizer.encode(GERMAN[i]))
    [hyps] = generate(translator.runner, torch.tensor([ids]), SearchOptions(beam_size=beam, max_length=max_length), constraints=[lexical])
    return translator.tgt_tokenizer.decode(hyps[0].tokens)


def test_constrained_and_free_sentences_share_the_device_search(translator, kinds):
    free = run(translator, beam=4)
    terms = [["house"], [], ["green", "cat"], ["dog"]]
    out = run(translator, terms=terms, beam=4)
    assert kinds == {"device"}  # no eager group
    lexical = translator.lexical_constraints(terms, (), len(terms), sources(translator))
    for i, (hyp, wanted, alone) in enumerate(zip(out, terms, free)):
        assert not hyp.constraint_unmet
        if wanted:
            assert all(term in hyp.text for term in wanted), (hyp.text, wanted)
            assert hyp.text == eager(translator, i, lexical[i])
        else:  # shared the steps of the constrained ones, and got what it gets with no glossary in the call
            assert (hyp.text, hyp.score) == (alone.text, alone.score)


def test_greedy_calls_with_terms_and_avoided_terms(translator, kinds):
    decode, encode = translator.tgt_tokenizer.decode, translator.tgt_tokenizer.encode
    greedy = run(translator)
    avoided = decode(encode(greedy[1].text)[:2])
    terms = [["house"], [], [], ["green"]]
    out = run(translator, terms=terms, avoid=[avoided])
    assert kinds == {"device"}
    lexical = translator.lexical_constraints(terms, [avoided], len(terms), sources(translator))
    for i, hyp in enumerate(out):
        assert hyp.text == eager(translator, i, lexical[i], beam=1)  # greedy with constraints: CONSTRAINED_MIN_BEAM beams, there too


def test_a_term_that_does_not_fit_gives_the_free_translation_flagged(translator, kinds):
    free = run(translator, beam=4, max_length=3)
    out = run(translator, terms=[["green house"], [], [], []], beam=4, max_length=3)
    assert kinds == {"device"}
    assert out[0].constraint_unmet and out[0].text == free[0].text
    assert not any(h.constraint_unmet for h in out[1:])
    assert [h.text for h in out[1:]] == [h.text for h in free[1:]]
