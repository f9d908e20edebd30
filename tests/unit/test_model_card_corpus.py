"""The model card's corpus section: a column per kind of segment the corpus holds, each source it was built from."""
from __future__ import annotations

from nmt_serve.training.model_card import corpus_section

TCFG = {"pair_data": "corpora/x/train.{pair}.{lang}", "pair_weights": "help=2", "max_sentence_tokens": 96, "pair_valid_lines": 150}


def _manifest(train: dict, sources: dict, sets=("eval", "eval-short")) -> dict:
    return {"name": "debian-vX", "archive": {"releases": [{"codename": "bookworm", "version": "12.15"}]},
            "sources": sources, "counts": {**{name: {"en-de": {"pairs": 1}} for name in sets}, "train": train}}


def test_the_corpus_section_names_the_kinds_and_sources_the_corpus_holds():
    before = _manifest({"en-de": {"pairs": 10, "ddtp-short": 2, "ddtp-long": 3, "catalog": 5}},
                       {"ddtp": {"paired_descriptions": {"en-de": {}}}, "catalogs": {"packages": [{}]}, "dictionaries": {"packages": []}})
    text = corpus_section(before, TCFG)
    words = " ".join(text.split())
    assert "| pair | training pairs | short descriptions | description sentences | catalog messages |" in text
    assert "| en-de | 10 | 2 | 3 | 5 |" in text and "a dictionary's example sentences" not in words
    assert "translated help pages" not in words and "(the `eval` and `eval-short` sets)." in words

    now = _manifest({"en-de": {"pairs": 17, "ddtp-short": 2, "ddtp-long": 3, "catalog": 5, "dictionary": 3, "help": 4}},
                    {"ddtp": {"paired_descriptions": {"en-de": {}}}, "catalogs": {"packages": [{}]},
                     "dictionaries": {"packages": [{}]}, "help": {"packages": [{}]}}, sets=("eval", "eval-help"))
    text = corpus_section(now, TCFG)
    words = " ".join(text.split())
    assert "| catalog messages | dictionary sentences | help pages' sentences |" in text
    assert "| en-de | 17 | 2 | 3 | 5 | 3 | 4 |" in text
    assert "a dictionary's example sentences" in words and "translated help pages" in words
    assert "(the `eval` and `eval-help` sets), and so are some a dictionary's lines and help pages." not in words
    assert "(the `eval` and `eval-help` sets), and so are some of a dictionary's lines and help pages." in words
    assert "each catalog, dictionary and help page carries" in words
