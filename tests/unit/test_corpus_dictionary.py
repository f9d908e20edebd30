"""Dictionary example sentences in the corpus (nmt_serve/training/corpus/dictionary.py): which
sub-entries of a Ding entry become sentence pairs, which are dropped and counted, held-out entries and
their `eval-dictionary` set, and the list read out of a .deb built here."""
from __future__ import annotations

import shutil
from collections import Counter

import pytest
from conftest import build_deb, deb_tree

from nmt_serve.training.corpus.dictionary import dictionary_segments, example_pairs, sentence
from nmt_serve.training.corpus.filters import Counts
from nmt_serve.training.corpus.heldout import entry_split
from nmt_serve.training.corpus.output import select
from nmt_serve.training.corpus.segments import Collector

HOW_ARE_YOU = ("Wie geht es Ihnen?; Wie geht es dir? | „Wie geht es dir?“, „(Mir geht’s) gut, und dir?“ | Wie geht’s so? | "
               "Danke, mir geht es gut. :: How are you? /HRU/ (chat jargon) | 'How are you?', '(I’m) fine, and you?' | "
               "How are you doing? | I am fine, thanks.; I am well, thanks.")


def test_sentences_lose_their_annotations_and_words_are_not_sentences():
    assert sentence("Das schießt den Vogel ab! [übtr.]") == "Das schießt den Vogel ab!"
    assert sentence("That takes the cake! [fig.]") == "That takes the cake!"
    assert sentence("How are you? /HRU/ (chat jargon)") == "How are you?"
    assert sentence("sheer; pure; plain; arrant [dated] <purer> <purest>") is None
    assert sentence("Lernfähigkeit {f}") is None
    assert sentence("the plain truth") is None
    # optional words in parentheses stay, as words; a note after the sentence goes
    assert sentence("(Mir geht’s) gut, und dir?") == "Mir geht’s gut, und dir?"
    assert sentence("Ich muss noch Schuhe einkaufen (gehen). (Alltag)") == "Ich muss noch Schuhe einkaufen gehen."


def test_an_entry_gives_its_example_sentences_paired_in_order():
    pairs, dropped = example_pairs(HOW_ARE_YOU)
    assert pairs == [("Wie geht es Ihnen?", "How are you?"), ("Wie geht es dir?", "How are you?"),
                     ("Wie geht’s so?", "How are you doing?"),
                     ("Danke, mir geht es gut.", "I am fine, thanks."), ("Danke, mir geht es gut.", "I am well, thanks.")]
    assert dropped == Counter()  # the quoted dialogue (its first character a quote) is no sentence here

    marks = ("Er hat etw. gesagt. | Es war reiner Zufall. | Er kam … und ging. | Das ist Unsinn. :: "
             "He said sth. | It was sheer/pure coincidence. | He came … and went. | That is nonsense.")
    assert example_pairs(marks) == ([("Das ist Unsinn.", "That is nonsense.")], Counter({"dictionary_mark": 3}))
    # a slash between alternatives still drops the pair: they may be phrases even when written tight
    assert example_pairs("Ich sehe sie gern. :: To see her/the sight of her pleases me.") == ([], Counter({"dictionary_mark": 1}))
    # several alternatives on both sides: only the first of each pair up
    assert example_pairs("Ja, gern.; Gerne. :: Yes, please.; With pleasure.")[0] == [("Ja, gern.", "Yes, please.")]
    # sides that list different numbers of sub-entries pair nothing
    assert example_pairs("Haus {n} | Das Haus ist alt. :: house") == ([], Counter({"unaligned_entry": 1}))
    assert example_pairs("# Version :: 1.9") == ([], Counter())


def _held_out_line(word: str, sentence_de: str, sentence_en: str, want: str) -> str:
    """An entry whose split (by its text's SHA-1) is `want`."""
    for i in range(1000):
        line = f"{word}{i} {{n}} | {sentence_de} :: {word.lower()}{i} | {sentence_en}"
        if entry_split("trans-de-en", line) == want:
            return line
    raise AssertionError("no such line")


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_a_dictionary_package_gives_train_and_held_out_sentences_the_other_way_round(tmp_path):
    held = _held_out_line("Kaffee", "Ich hätte gern einen Kaffee.", "I would like a coffee.", "eval")
    repeat = _held_out_line("Bitte", "Ich hätte gern einen Kaffee.", "I'd like a coffee, please.", "train")
    trained = _held_out_line("Tee", "Der Tee ist kalt.", "The tea is cold.", "train")
    root = deb_tree(tmp_path, "trans-de-en", "Files: *\nLicense: GPL-2+\n")
    (root / "usr/share/trans").mkdir(parents=True)
    (root / "usr/share/trans/de-en").write_text(f"# Version :: 1.0\n{held}\n{repeat}\n{trained}\n{HOW_ARE_YOU}\n",
                                                encoding="utf-8")
    deb = build_deb(root, "trans-de-en")

    collector = Collector(Counts())
    pairs = [("en", "de"), ("en", "fr"), ("de", "fr")]
    entry = dictionary_segments(deb, pairs, "bookworm", tmp_path / "cache", collector)
    split_of_how = entry_split("trans-de-en", HOW_ARE_YOU)
    assert entry["licenses"] == ["GPL-2+"] and entry["entries"] == 4
    assert entry["example_pairs"] == dict(sorted((Counter({"eval": 1, "train": 2}) + Counter({split_of_how: 5})).items()))
    assert {s.pair for s in collector.segments} == {("en", "de")}  # English first, as every pair of the corpus
    assert ("I would like a coffee.", "Ich hätte gern einen Kaffee.") in [(s.a, s.b) for s in collector.segments]
    assert collector.counts.dropped["dictionary_mark"] == Counter()

    sets = select(collector.segments, pairs, collector.counts, None)
    assert [(s.a, s.b) for s in sets[("eval-dictionary", ("en", "de"))]][0] == ("I would like a coffee.",
                                                                                "Ich hätte gern einen Kaffee.")
    train = [(s.a, s.b) for s in sets[("train", ("en", "de"))]]
    assert ("The tea is cold.", "Der Tee ist kalt.") in train
    # the training entry that repeats the held-out German sentence does not reach training
    assert all(b != "Ich hätte gern einen Kaffee." for _, b in train)
    assert collector.counts.dropped["in_eval"] == Counter({"train en-de": 1})
    assert all(s.kind == "dictionary" and s.origin == "trans-de-en" for s in collector.segments)


def test_an_unknown_dictionary_package_is_refused_before_anything_is_fetched(tmp_path, capsys):
    from nmt_serve.training.corpus.command import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--output", str(tmp_path / "corpus"), "--cache", str(tmp_path / "cache"), "--dictionaries", "trans-xx-yy"])
    assert exit_info.value.code == 2
    assert "no reader for a dictionary in trans-xx-yy; known: trans-de-en" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()
