"""Translated help pages in the corpus (nmt_serve/training/corpus/help_pages.py): the blocks of a Mallard
page as a reader sees them, pages paired block by block only where their shapes agree, held-out pages and
their `eval-help` set, and the pages read out of a .deb built here."""
from __future__ import annotations

import shutil
from collections import Counter

import pytest
from conftest import build_deb, deb_tree

from nmt_serve.training.corpus.filters import Counts
from nmt_serve.training.corpus.heldout import entry_split
from nmt_serve.training.corpus.help_pages import DOCBOOK, format_of, page_blocks
from nmt_serve.training.corpus.output import select
from nmt_serve.training.corpus.segments import Collector

PAGE = """<?xml version="1.0" encoding="utf-8"?>
<page xmlns="http://projectmallard.org/1.0/" xmlns:its="http://www.w3.org/2005/11/its" type="topic" id="{id}">
  <info>
    <link type="guide" xref="index#tips"/>
    <title type="sort">{sort}</title>
    <desc>{desc}</desc>
    <credit type="author"><name>Somebody</name></credit>
  </info>
  <title>{title}</title>
  <p>{intro}</p>
  <steps>
    <item><p>{step}</p></item>
  </steps>
  <comment><cite>Editor</cite><p>Only in the English page: itstool leaves comments out.</p></comment>
  <p><cmd its:translate="no">gsettings set org.example key true</cmd></p>
  <note><p>{note}</p></note>
  {extra}
</page>
"""

EN = dict(id="coffee", sort="coffee", desc="Make a cup of coffee.", title="Make coffee",
          intro="Fill the kettle with water. Wait until it boils.",
          step='Choose <guiseq><gui>Drinks</gui><gui>Coffee</gui></guiseq> and press <keyseq><key>Ctrl</key><key>C</key></keyseq>.',
          note='See <link xref="tea"/> for tea.', extra="")
DE = dict(id="coffee", sort="Kaffee", desc="Eine Tasse Kaffee kochen.", title="Kaffee kochen",
          intro="Füllen Sie den Wasserkocher mit Wasser. Warten Sie, bis es kocht.",
          step='Wählen Sie <guiseq><gui>Getränke</gui><gui>Kaffee</gui></guiseq> und drücken Sie '
               '<keyseq><key>Strg</key><key>C</key></keyseq>.',
          note='Siehe <link xref="tea"/> für Tee.', extra="")


def _page(values: dict) -> bytes:
    return PAGE.format(**values).encode()


def test_a_page_gives_its_blocks_as_a_reader_sees_them():
    blocks = page_blocks(_page(EN))
    assert blocks == [("desc", "Make a cup of coffee."), ("title", "Make coffee"),
                      ("p", "Fill the kettle with water. Wait until it boils."),
                      ("p", "Choose Drinks > Coffee and press Ctrl+C."),
                      ("p", "gsettings set org.example key true"),  # not to translate: as it is (then "untranslated")
                      ("p", None)]  # a link the viewer fills in from its target
    assert [tag for tag, _ in page_blocks(_page(DE))] == [tag for tag, _ in blocks]
    assert page_blocks(b"<page><p>broken</page>") is None


DOCBOOK_BOOK = b"""<?xml version="1.0"?>
<!DOCTYPE article PUBLIC "-//OASIS//DTD DocBook XML V4.1.2//EN" "http://www.oasis-open.org/docbook/xml/4.1.2/docbookx.dtd" [
  <!ENTITY legal SYSTEM "legal.xml">
  <!ENTITY app "<application>Tali</application>">
]>
<article id="index">
  <articleinfo><title>Tali Manual</title>&legal;<legalnotice><para>Permission is granted.</para></legalnotice></articleinfo>
  <sect1><title>Introduction</title>
    <para>&app; is a sort of poker with dice. Roll five dice three times.</para>
    <para>Choose <menuchoice><shortcut><keycombo><keycap>Ctrl</keycap><keycap>N</keycap></keycombo></shortcut>
      <guimenu>Game</guimenu><guimenuitem>New</guimenuitem></menuchoice> or press
      <keycombo><keycap>Ctrl</keycap><keycap>N</keycap></keycombo>.</para>
    <para>See <xref linkend="rules"/>.</para>
    <informaltable><tgroup cols="2"><tbody><row><entry>Stock</entry><entry><para>Top left pile.</para></entry></row></tbody></tgroup></informaltable>
    <programlisting>gtali --help</programlisting>
    <remark>Editors: update the screenshots.</remark>
  </sect1>
</article>
"""


def test_a_docbook_book_reads_its_own_entities_and_leaves_out_its_front_matter():
    assert format_of("tali/index.docbook") is DOCBOOK and format_of("aisleriot/klondike.xml") is DOCBOOK
    assert page_blocks(DOCBOOK_BOOK, DOCBOOK) == [
        ("title", "Introduction"), ("para", "Tali is a sort of poker with dice. Roll five dice three times."),
        ("para", "Choose Game > New or press Ctrl+N."), ("para", None),
        ("entry", "Stock"), ("entry", "Top left pile.")]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_a_help_package_gives_paired_pages_held_out_pages_and_drops_what_differs(tmp_path):
    from nmt_serve.training.corpus.help_pages import help_segments

    root = deb_tree(tmp_path, "gnome-demo", "Files: *\nLicense: CC-BY-SA-3.0\n")
    help_dir = root / "usr/share/help"
    pages = {"page1": ("The milk is cold.", "Die Milch ist kalt."), "page15": ("The cup is full.", "Die Tasse ist voll."),
             "page3": ("The sugar is sweet.", "Der Zucker ist süß.")}
    for name, (en, de) in pages.items():
        for lang, values, text in (("C", EN, en), ("de", DE, de)):
            (help_dir / lang / "demo").mkdir(parents=True, exist_ok=True)
            extra = f"<p>{text}</p>"
            if name == "page3" and lang == "de":
                extra = ""  # translated from an older page: one block fewer, the page cannot pair up
            (help_dir / lang / "demo" / f"{name}.page").write_bytes(_page(dict(values, id=name, extra=extra)))
    (help_dir / "fr" / "demo").mkdir(parents=True)  # French lacks the page: no en-fr pairs
    deb = build_deb(root, "gnome-demo")

    assert entry_split("gnome-demo", "demo/page15.page") == "eval" and entry_split("gnome-demo", "demo/page1.page") == "train"
    collector = Collector(Counts())
    pairs = [("en", "de"), ("en", "fr"), ("de", "fr")]
    entry = help_segments(deb, ["en", "de", "fr"], pairs, "bookworm", tmp_path / "cache", collector)
    assert entry["licenses"] == ["CC-BY-SA-3.0"] and entry["pages"] == 3
    assert entry["paired_pages"] == {"en-de": 2}
    # desc, title, intro, step, the command, the page's own line (the note's link cannot be rendered)
    assert entry["block_pairs"] == {"eval": 6, "train": 6}
    assert collector.counts.dropped["help_structure"] == Counter({"train en-de": 1})
    assert collector.counts.dropped["help_link"] == Counter({"train en-de": 1, "eval en-de": 1})
    found = [(s.a, s.b) for s in collector.segments]
    # the intro's two sentences pair up one by one; a menu path and keys as a reader sees them
    assert ("Fill the kettle with water.", "Füllen Sie den Wasserkocher mit Wasser.") in found
    assert ("Choose Drinks > Coffee and press Ctrl+C.", "Wählen Sie Getränke > Kaffee und drücken Sie Strg+C.") in found
    assert all(s.kind == "help" and s.origin == "gnome-demo" and s.pair == ("en", "de") for s in collector.segments)

    sets = select(collector.segments, pairs, collector.counts, None)
    assert ("The cup is full.", "Die Tasse ist voll.") in [(s.a, s.b) for s in sets[("eval-help", ("en", "de"))]]
    train = [(s.a, s.b) for s in sets[("train", ("en", "de"))]]
    assert ("The milk is cold.", "Die Milch ist kalt.") in train
    # the blocks every page shares are held out with page15, so no training pair repeats them
    assert not any(a == "Make a cup of coffee." for a, _ in train)
    assert collector.counts.dropped["in_eval"]["train en-de"] > 0
    assert (tmp_path / "cache" / "extracted" / "help" / "gnome-demo_1.0-1" / "en" / "demo" / "page1.page").is_file()
