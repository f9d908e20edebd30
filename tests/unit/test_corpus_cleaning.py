"""The corpus's text rules: entities, markup, accelerators, placeholders, filters, deduplication, the
held-out rule, and entity normalisation when training data is read."""
from __future__ import annotations

import gzip
import hashlib

from nmt_serve.training.corpus import markup
from nmt_serve.training.corpus.alignment import message_units, split_pair
from nmt_serve.training.corpus.filters import Deduplicator, clean_unit, normalise, pair_rule
from nmt_serve.training.corpus.heldout import is_held_out, split_of
from nmt_serve.training.data import read_lines, read_parallel


def test_entities_are_unescaped_only_in_their_complete_form():
    assert markup.unescape_entities("Tom &amp; Jerry &lt;3 &#233;t&#xE9;") == "Tom & Jerry <3 été"
    # HTML's legacy forms without a semicolon would eat an accelerator: "&notice" is no entity here
    assert markup.unescape_entities("&notice AT&T") == "&notice AT&T"


def test_accelerators_are_removed_once_per_marker_and_never_from_entities():
    assert markup.remove_accelerator("_Save As…") == "Save As…"
    assert markup.remove_accelerator("Sa_ve") == "Save"
    assert markup.remove_accelerator("&File") == "File"
    assert markup.remove_accelerator("~Open") == "Open"
    assert markup.remove_accelerator("Fish &amp;&Chips") == "Fish &amp;Chips"
    assert markup.remove_accelerator("file_name_list") == "file_name_list"  # two markers: an identifier
    assert markup.remove_accelerator("Copy && &Paste") == "Copy & Paste"
    assert markup.remove_accelerator("%s_%d") == "%s_%d"


def test_placeholders_compare_as_multisets_without_positions():
    assert markup.placeholders("%1$s of %2$d") == markup.placeholders("%d von %s")
    assert markup.placeholders("{0} files in {name}") == markup.placeholders("{name}: {0} Dateien")
    assert markup.placeholders("%(count)d items in $HOME") == markup.placeholders("$HOME: %(count)d Elemente")
    assert markup.placeholders("%s of %s") != markup.placeholders("%s")
    assert markup.placeholders("100% sure") == markup.placeholders("100 % sicher")  # "% s" is no spec here


def test_clean_unit_strips_consistent_markup_and_drops_what_differs():
    assert clean_unit("<b>Bold</b> &amp; _new", "<b>Fett</b> &amp; _neu", accelerators=True) == ("Bold & new", "Fett & neu")
    assert clean_unit("<b>Bold</b> text", "Fetter Text", accelerators=False) == "markup_mismatch"
    assert clean_unit("Delete %s?", "Löschen?", accelerators=False) == "placeholder_mismatch"
    assert clean_unit("Delete %1$s from %2$s?", "%2$s: %1$s löschen?", accelerators=False) == (
        "Delete %1$s from %2$s?", "%2$s: %1$s löschen?")
    # accelerators only where asked (catalogs): a description may well say snake_case
    assert clean_unit("Uses _private names", "Nutzt _private Namen", accelerators=False)[0] == "Uses _private names"


def test_pair_rules_each_drop_their_case():
    assert pair_rule("Open the file", "Datei öffnen") is None
    assert pair_rule("42", "42") == "no_letters"
    assert pair_rule("x" * 401, "y" * 401) == "too_long"
    assert pair_rule("Firefox!", "firefox") == "untranslated"
    assert pair_rule("Open", "Öffnet die ausgewählte Datei in einem neuen Fenster") == "length_ratio"
    assert pair_rule("OK", "Akzeptieren") is None  # smoothed: short strings are judged leniently


def test_duplicates_and_near_duplicates_keep_the_first():
    dedup = Deduplicator()
    assert dedup.rule("Open file", "Datei öffnen") is None
    assert dedup.rule("Open file", "Datei öffnen") == "duplicate"
    assert dedup.rule("Open File.", "Datei Öffnen") == "near_duplicate"
    assert dedup.rule("Open file", "Öffne Datei") is None  # another translation of the same text stays
    assert normalise("  Hello, World 2!") == "hello world"


def test_sentences_pair_up_when_their_counts_agree_else_short_units_stay_whole():
    en = "This is the first sentence. Here is the second one."
    de = "Das ist der erste Satz. Hier ist der zweite."
    assert split_pair(en, de, "en", "de") == [("This is the first sentence.", "Das ist der erste Satz.", "sentence"),
                                              ("Here is the second one.", "Hier ist der zweite.", "sentence")]
    merged = "Das ist der erste Satz, und hier ist der zweite."
    assert split_pair(en, merged, "en", "de") == [(en, merged, "unit")]
    assert split_pair(en + " " + "Word " * 90, merged, "en", "de") is None
    assert message_units("Line one\nLine two\n", "Zeile eins\nZeile zwei") == [("Line one", "Zeile eins"),
                                                                                ("Line two", "Zeile zwei")]
    assert message_units("Line one\nLine two", "Zeile eins und zwei") == [("Line one Line two", "Zeile eins und zwei")]


def test_held_out_packages_are_those_whose_name_digest_ends_in_zero():
    names = [f"package{i}" for i in range(400)]
    held = [n for n in names if is_held_out(n)]
    assert held == [n for n in names if hashlib.sha1(n.encode()).hexdigest()[-1] == "0"]
    assert 10 < len(held) < 45  # about one in sixteen
    assert is_held_out("less") and not is_held_out("hello")
    assert split_of(["hello", "less"]) == "eval" and split_of(["hello"]) == "train"


def test_training_data_is_read_with_entities_unescaped(tmp_path):
    with gzip.open(tmp_path / "train.en.gz", "wt", encoding="utf-8") as f:
        f.write("A man &amp; a dog.\nFish &amp;amp; chips &lt;3\n")
    (tmp_path / "train.de").write_text("Ein Mann &amp; ein Hund.\nFisch\n", encoding="utf-8")
    src, tgt = read_parallel(tmp_path / "train.en.gz", tmp_path / "train.de")
    assert src == ["A man & a dog.", "Fish &amp; chips <3"]  # unescaped once, as the text was escaped once
    assert tgt[0] == "Ein Mann & ein Hund."
    assert read_lines(tmp_path / "train.en.gz", entities=False)[0] == "A man &amp; a dog."
