"""Characters the tokenizer has no piece for come back into the translation where the model wrote <unk>."""
from pathlib import Path

import pytest

from nmt_serve.inference.translator import Translator
from nmt_serve.network.tokenizer import UNKNOWN_MARK, Tokenizer, restore_unknowns

ROOT = Path(__file__).resolve().parents[2]
CAPTIONS_SPM = ROOT / "checkpoints" / "multi30k" / "spm.model"  # trained on captions: no `+`, `{`, `~`


def test_the_source_runs_without_a_piece_in_order():
    tok = Tokenizer(CAPTIONS_SPM)
    assert tok.unknown_spans("GTK+3 und {foo} für C++") == ["+", "{", "}", "++"]
    assert tok.unknown_spans("Ein Hund läuft.") == [] and tok.unknown_spans("  ") == []
    # what the model writes for them: sentencepiece's mark with a space either side
    ids = tok.encode("GTK+3-Daten")
    assert tok.decode(ids) == f"GTK {UNKNOWN_MARK} 3-Daten"


def test_a_vulgar_fraction_keeps_its_value():
    """NFKC wrote "1½" as "11⁄2" with a fraction slash no piece has, and its <unk> had no source
    characters of its own: the translation read "112"."""
    tok = Tokenizer(CAPTIONS_SPM)
    assert tok.encode("1½ Katzen") == tok.encode("1 1/2 Katzen") and tok.encode("¾") == tok.encode("3/4")
    assert UNKNOWN_MARK not in tok.decode(tok.encode("2⅓ Äpfel"))
    assert tok.unknown_spans("1½ und ⅞") == []


def test_invisible_characters_are_left_out():
    """A soft hyphen ("Fahr\u00adrad", where a word may break), a word joiner and a byte-order mark show
    nothing: the model reads the word whole. Before, "Fahr\u00adrad" reached it as "Fahr <unk> rad", and
    the shipped model wrote "A man is riding a\u00ad bike on the street." (its <unk> put back)."""
    tok = Tokenizer(CAPTIONS_SPM)
    assert tok.encode("Ein Fahr\u00adrad") == tok.encode("Ein Fahrrad") == tok.encode("\ufeffEin Fahr\u2060rad")
    assert tok.unknown_spans("Fahr\u00adrad") == []
    translator = Translator.load(ROOT / "checkpoints" / "debian-multi30k", device="cpu")
    [hyphenated, plain] = translator.translate(["Ein Mann fährt Fahr\u00adrad auf der Straße.", "Ein Mann fährt Fahrrad auf der Straße."],
                                               source_lang="de", target_lang="en")
    assert hyphenated.text == plain.text and "\u00ad" not in hyphenated.text


@pytest.mark.parametrize("translation, spans, expected", [
    (f"GTK {UNKNOWN_MARK} 3 data", ["+"], "GTK+3 data"),
    (f"a  {UNKNOWN_MARK}  b", ["~"], "a ~ b"),  # the text's own spaces stay
    (f"library  {UNKNOWN_MARK} foo {UNKNOWN_MARK}  for C {UNKNOWN_MARK}", ["{", "}", "++"], "library {foo} for C++"),
    (f"{UNKNOWN_MARK} 3 and  {UNKNOWN_MARK} 4", ["["], "[3 and [4"),  # runs used up: the last again
    (f"the  {UNKNOWN_MARK}  dog", [], "the dog"),  # nothing to put back: the mark goes
    ("no mark here", ["+"], "no mark here"),
])
def test_restore_unknowns(translation, spans, expected):
    assert restore_unknowns(translation, spans) == expected


def test_the_translator_puts_them_back(tiny_checkpoint, monkeypatch):
    translator = Translator.load(tiny_checkpoint, device="cpu")
    tok = translator.inputs.tokenizer
    text = next(t for t in ("a+b", "a~b", "a{b") if tok.unknown_spans(t))
    decode = tok.decode
    # a model that writes <unk> where the source has the unknown character
    monkeypatch.setattr(translator.tgt_tokenizer, "decode", lambda ids: f"x {UNKNOWN_MARK} y" if ids else decode(ids))
    [result] = translator.translate([text], beam_size=2, num_hypotheses=2, max_length=4)
    assert [h.text for h in result.hypotheses] == [f"x{tok.unknown_spans(text)[0]}y"] * 2


def test_the_service_puts_them_back_before_it_unescapes():
    from nmt_serve.engine.protocol import EngineHypothesis
    from nmt_serve.service.pipeline import _cleaned

    tok = Tokenizer(CAPTIONS_SPM)
    hyps = [[EngineHypothesis(f"GTK {UNKNOWN_MARK} 3 &amp; Qt", -1.0), EngineHypothesis("plain", -2.0)]]
    [[first, second]] = _cleaned(hyps, ["GTK+3 & Qt"], tok)
    assert first.text == "GTK+3 & Qt" and first.score == -1.0
    assert second is hyps[0][1]  # nothing to do: the same object
