"""Translated user help: the pages of GNOME's manuals and of applications' and games' help
(`/usr/share/help/{C,de,fr,cs}/DOCUMENT/`: Mallard `*.page`, or DocBook `*.xml`/`*.docbook`), running
prose written for people (steps, explanations, tips, the rules of card games) rather than interface strings.

Translation teams translate these documents in PO files, and itstool writes each translation back into a
copy of the English document, element for element. A translated page therefore holds the English page's
text blocks (Mallard's paragraphs, titles and page summary; DocBook's paragraphs, titles, terms and table
cells) in the same order: the blocks of a page pair up one to one where the sequence of block names agrees
between the languages, and a page where it does not (a translation made from an older page) is left out
whole (rule `help_structure`). Each block pair is one unit, cut into sentences where the counts agree
(alignment.py). Inline markup becomes the text a reader sees: a menu path as "Edit > Preferences", keys as
"Ctrl+C", a DocBook book's own entities (&app;) as their text; a link whose text the viewer fills in from
its target cannot be rendered here, so its block is left out (rule `help_link`). Text marked not to
translate (its:translate="no": commands, file names) stays as it is; editors' comments, program listings
and front matter (authors, legal notices) are left out.

The packages are a fixed list (HELP_PACKAGES): GNOME's user and administrator guides, the help of GNOME
applications whose pages the GNOME de/fr/cs teams keep, and of GNOME's games, whose rules are everyday
language. Held out (heldout.entry_split): every page of a package whose name's SHA-1 ends in 0, and the
pages whose "DOCUMENT/FILE" SHA-1 ends in 0: an evaluation set of this kind of text (eval-help).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lxml import etree

from nmt_serve.training.corpus import deb_files
from nmt_serve.training.corpus.apt import DebFile
from nmt_serve.training.corpus.heldout import entry_split
from nmt_serve.training.corpus.segments import Collector, Pair, where

HELP_PACKAGES = tuple(sorted({
    # GNOME's desktop help and system administrators' guide
    "gnome-user-docs",
    # applications
    "baobab", "brasero-common", "cheese-common", "eog", "evince-common", "evolution-common", "file-roller",
    "gedit-common", "gnome-calculator", "gnome-clocks", "gnome-system-monitor", "gnome-terminal-data",
    "gnome-text-editor", "gthumb-data", "meld", "orca", "seahorse", "shotwell-common", "simple-scan",
    "totem-common", "gnome-logs", "gnome-boxes", "rhythmbox-data",
    # games: rules and how to play
    "aisleriot", "gnome-chess", "gnome-mines", "gnome-sudoku", "quadrapassel", "swell-foop", "tali", "iagno",
    "lightsoff", "gnome-mahjongg", "five-or-more", "four-in-a-row", "gnome-klotski", "gnome-nibbles",
    "gnome-robots", "gnome-tetravex", "hitori", "gnome-taquin",
}))

ITS_TRANSLATE = "{http://www.w3.org/2005/11/its}translate"
ENGLISH_DIR = "C"  # the pages' source language
GUI_SEPARATOR = " > "  # yelp shows a menu path as "Edit ▸ Preferences"; plain text writes ">"
KEY_SEPARATOR = "+"
SUFFIXES = (".page", ".xml", ".docbook")  # Mallard pages; DocBook books and their included sections


@dataclass(frozen=True)
class Format:
    """What a help format's elements are to a reader (by local name, whatever their namespace)."""
    blocks: frozenset[str]  # a unit of text each: itstool's translation units
    skipped: frozenset[str]  # containers whose blocks are not the document's prose
    sequences: dict[str, str]  # inline elements whose children read joined: {name: separator}
    references: frozenset[str]  # inline elements the viewer fills in from their target when empty
    kept: frozenset[str] = frozenset()  # blocks taken even inside a skipped container


MALLARD = Format(blocks=frozenset({"p", "title", "subtitle", "desc"}),
                 skipped=frozenset({"info", "comment"}),  # comment: editors' notes, which itstool leaves out
                 sequences={"guiseq": GUI_SEPARATOR, "keyseq": KEY_SEPARATOR},
                 references=frozenset({"link"}), kept=frozenset({"desc"}))  # a page's summary, in its info
DOCBOOK = Format(blocks=frozenset({"para", "simpara", "title", "subtitle", "term", "entry", "glossterm"}),
                 skipped=frozenset({"info", "articleinfo", "bookinfo", "sect1info", "sectioninfo", "chapterinfo",
                                    "legalnotice", "remark", "programlisting", "screen", "literallayout"}),
                 sequences={"menuchoice": GUI_SEPARATOR, "keycombo": KEY_SEPARATOR},
                 references=frozenset({"xref", "link", "ulink"}))

# no entity resolved by the parser, no DTD read, nothing from the network: a DocBook book's own entities
# (&app;) are read from its internal subset as text; one of another file (&legal;) is left out
_PARSER = etree.XMLParser(resolve_entities=False, load_dtd=False, no_network=True, remove_comments=True,
                          remove_pis=True)
_TAG = re.compile(r"<[^<>]*>")


class _Unrenderable(Exception):
    """A block whose text the viewer fills in at display time (an empty link)."""


def _name(element: etree._Element) -> str:
    return etree.QName(element).localname if isinstance(element.tag, str) else ""


def _render(element: etree._Element, fmt: Format, entities: dict[str, str]) -> str:
    """The text a reader sees of an element and its inline children."""
    name = _name(element)
    children = [c for c in element if isinstance(c.tag, str)]
    if name in fmt.references and not "".join(element.itertext()).strip():
        raise _Unrenderable
    if name in fmt.sequences and children:
        return fmt.sequences[name].join(_render(c, fmt, entities).strip() for c in children if _name(c) != "shortcut")
    parts = [element.text or ""]
    for child in element:
        if isinstance(child.tag, str):
            parts.append(_render(child, fmt, entities))
        elif child.tag is etree.Entity:
            parts.append(entities.get(child.name, ""))
        parts.append(child.tail or "")
    return "".join(parts)


def _entities(root: etree._Element) -> dict[str, str]:
    """{name: text} of the document's own entities (its internal subset); external ones are not read."""
    dtd = root.getroottree().docinfo.internalDTD
    if dtd is None:
        return {}
    return {e.name: " ".join(_TAG.sub("", e.content).split()) for e in dtd.iterentities() if e.content is not None}


def page_blocks(source: bytes | Path, fmt: Format = MALLARD) -> list[tuple[str, str | None]] | None:
    """[(block name, its text or None where it cannot be rendered)] of a page in document order, or None
    when the page is not well-formed XML. Blocks inside a skipped container (a page's <info>, but for
    the format's kept blocks: Mallard's summary), inside another block, or not to translate are left out."""
    try:
        root = etree.fromstring(source.read_bytes() if isinstance(source, Path) else source, _PARSER)
    except etree.XMLSyntaxError:
        return None
    entities = _entities(root)
    blocks = []
    for element in root.iter(etree.Element):
        name = _name(element)
        if name not in fmt.blocks:
            continue
        ancestors = [_name(a) for a in element.iterancestors()]
        if any(a in fmt.blocks for a in ancestors):
            continue
        if name not in fmt.kept and any(a in fmt.skipped for a in ancestors):
            continue
        if element.get(ITS_TRANSLATE) == "no" or any(a.get(ITS_TRANSLATE) == "no" for a in element.iterancestors()):
            continue
        try:
            text = " ".join(_render(element, fmt, entities).split())
        except _Unrenderable:
            text = None
        blocks.append((name, text))
    return blocks


def format_of(path: Path | str) -> Format:
    return MALLARD if str(path).endswith(".page") else DOCBOOK


def _place(path: str, languages: list[str]) -> str | None:
    """Where a package's file goes in the extraction: "{language}/DOCUMENT/FILE" (English for C)."""
    parts = path.split("/")
    if len(parts) != 6 or parts[:3] != ["usr", "share", "help"] or not parts[5].endswith(SUFFIXES):
        return None
    language = "en" if parts[3] == ENGLISH_DIR else parts[3]
    return f"{language}/{parts[4]}/{parts[5]}" if language in languages else None


def help_segments(deb: DebFile, languages: list[str], pairs: list[Pair], release: str, cache_dir: Path,
                  collector: Collector) -> dict:
    """Collect a package's help pages' block pairs for every pair of languages; returns its manifest entry."""
    root = deb_files.extract(deb, cache_dir, lambda name: _place(name, languages), purpose="help",
                             selection=f"usr/share/help {','.join(SUFFIXES)} {','.join(languages)}")
    entry = {"package": deb.package, "version": deb.version, "sha256": deb.sha256,
             "licenses": list(deb_files.licenses_in(root))}
    english = sorted(p for p in (root / "en").glob("*/*") if p.name.endswith(SUFFIXES)) if (root / "en").is_dir() else []
    pages, found = Counter(), Counter()
    for page in english:
        name = f"{page.parent.name}/{page.name}"
        split = entry_split(deb.package, name)
        fmt = format_of(page)
        parsed = {"en": page_blocks(page, fmt)}
        for language in languages:
            if language != "en" and (root / language / name).is_file():
                parsed[language] = page_blocks(root / language / name, fmt)
        shape = [tag for tag, _ in parsed["en"]] if parsed["en"] is not None else None
        for x, y in pairs:
            if x not in parsed or y not in parsed:
                continue
            if shape is None or any(parsed[lang] is None or [t for t, _ in parsed[lang]] != shape for lang in (x, y)):
                collector.counts.drop("help_structure", where(split, (x, y)))
                continue
            pages[f"{x}-{y}"] += 1
            units = []
            for (_, a), (_, b) in zip(parsed[x], parsed[y]):
                if a == "" and b == "":  # a block of an image or a command alone
                    continue
                if a is None or b is None:
                    collector.counts.drop("help_link", where(split, (x, y)))
                else:
                    units.append((a, b))
            found[split] += len(units)
            collector.add(split, (x, y), "help", deb.package, release, units)
    return {**entry, "pages": len(english), "paired_pages": dict(sorted(pages.items())),
            "block_pairs": dict(sorted(found.items()))}
