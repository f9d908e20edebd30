"""The shipped checkpoints load and translate test sentences sensibly (chrF against the references)."""
import json

import pytest
import sacrebleu
from conftest import ROOT

from nmt_serve.inference.translator import Translator
from nmt_serve.training.data import read_lines

DATA = ROOT.parent / "shared" / "data" / "multi30k"
# the first sentences of test_2016_flickr, so the test also runs where the data is absent
FALLBACK = {
    "de": ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun."],
    "en": ["A man in an orange hat starring at something.", "A Boston Terrier is running on lush green grass in front of a white fence."],
}


def sample(lang: str, n: int = 24) -> list[str]:
    path = DATA / f"test_2016_flickr.{lang}.gz"
    return read_lines(path)[:n] if path.exists() else FALLBACK[lang]


@pytest.mark.parametrize("pair, floor", [("de-en", 50.0), ("en-de", 45.0)])
def test_shipped_checkpoint_translates_sensibly(pair, floor):
    directory = ROOT / "checkpoints" / pair
    source, target = pair.split("-")
    translator = Translator.load(directory, device="cpu")
    assert (translator.source_lang, translator.target_lang) == (source, target)
    sources, references = sample(source), sample(target)
    hypotheses = [r.text for r in translator.translate(sources, beam_size=4)]
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert chrf >= floor, f"{pair}: chrF {chrf:.1f} on {len(sources)} test sentences\n" + "\n".join(hypotheses[:5])
    # no runaway repetition
    for s, h in zip(sources, hypotheses):
        assert len(h.split()) <= 3 * max(1, len(s.split()))


@pytest.mark.parametrize("pair", ["de-en", "en-de"])
def test_shipped_checkpoint_has_a_model_card_with_measured_scores(pair):
    directory = ROOT / "checkpoints" / pair
    card = (directory / "README.md").read_text()
    scores = json.loads((directory / "config.json").read_text())["metadata"]["scores"]
    splits = {(s["split"], s["beam_size"]) for s in scores}
    assert {("val", 1), ("val", 4), ("test_2016_flickr", 1), ("test_2016_flickr", 4)} <= splits
    for s in scores:
        assert f"{s['bleu']:.2f}" in card
    assert "BLEU signature" in card and "nrefs:1|case:mixed|eff:no|tok:13a" in card
    assert sum(f.stat().st_size for f in directory.iterdir()) < 30 * 1024 * 1024


@pytest.mark.parametrize("pair, floor", [("de-en", 50.0), ("en-de", 45.0)])
def test_shipped_checkpoint_in_int8_keeps_its_quality(pair, floor):
    directory = ROOT / "checkpoints" / pair
    source, target = pair.split("-")
    sources, references = sample(source), sample(target)
    full = Translator.load(directory, device="cpu")
    int8 = Translator.load(directory, device="cpu", quantization="int8")
    hypotheses = [r.text for r in int8.translate(sources, beam_size=4)]
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert chrf >= floor, f"{pair} int8: chrF {chrf:.1f}\n" + "\n".join(hypotheses[:5])
    same = sum(a == b.text for a, b in zip(hypotheses, full.translate(sources, beam_size=4)))
    assert same >= len(sources) // 2, f"only {same}/{len(sources)} int8 outputs equal the float32 ones"
