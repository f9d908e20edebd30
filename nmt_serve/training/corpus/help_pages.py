"""Translated user help: the Mallard pages of GNOME's manuals and applications' help
(`/usr/share/help/{C,de,fr,cs}/DOCUMENT/*.page`), running prose written for people (steps, explanations,
tips) rather than interface strings.

Translation teams translate these pages in PO files, and itstool writes each translation back into a copy
of the English page, element for element. A translated page therefore holds the English page's text
blocks (paragraphs, titles, subtitles, the page's summary) in the same order: the blocks of a page pair
up one to one where the sequence of block names agrees between the languages, and a page where it does not
(a translation made from an older page) is left out whole (rule `help_structure`). Each block pair is one
unit, cut into sentences where the counts agree (alignment.py). Inline markup becomes the text a reader
sees: a menu path as "Edit > Preferences", keys as "Ctrl+C"; a link whose text yelp would fill in from its
target cannot be rendered here, so its block is left out (rule `help_link`). Text marked not to translate
(its:translate="no": commands, file names) stays as it is.

The packages are a fixed list (HELP_PACKAGES): GNOME's user and administrator guides, the help of GNOME
applications whose pages the GNOME de/fr/cs teams keep, and of GNOME's games, whose rules are everyday
language. Held out (heldout.entry_split): every page of a package whose name's SHA-1 ends in 0, and the
pages whose "DOCUMENT/NAME.page" SHA-1 ends in 0: an evaluation set of this kind of text (eval-help).
"""
from __future__ import annotations

from collections import Counter
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
    "totem-common", "gnome-logs", "gnome-boxes", "rhythmbox-data", "gnome-font-viewer", "gnome-disk-utility",
    # games: rules and how to play
    "aisleriot", "gnome-chess", "gnome-mines", "gnome-sudoku", "quadrapassel", "swell-foop", "tali", "iagno",
    "lightsoff", "gnome-mahjongg", "five-or-more", "four-in-a-row", "gnome-klotski", "gnome-nibbles",
    "gnome-robots", "gnome-tetravex", "hitori", "gnome-taquin", "atomix",
}))

MALLARD = "{http://projectmallard.org/1.0/}"
ITS_TRANSLATE = "{http://www.w3.org/2005/11/its}translate"
BLOCKS = frozenset(MALLARD + name for name in ("p", "title", "subtitle", "desc"))
ENGLISH_DIR = "C"  # the pages' source language
GUI_SEPARATOR = " > "  # yelp shows a menu path as "Edit ▸ Preferences"; plain text writes ">"
KEY_SEPARATOR = "+"

_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True, remove_pis=True)


class _Unrenderable(Exception):
    """A block whose text yelp fills in at display time (an empty link)."""


def _render(element: etree._Element) -> str:
    """The text a reader sees of an element and its inline children."""
    tag = element.tag if isinstance(element.tag, str) else ""
    children = [c for c in element if isinstance(c.tag, str)]
    if tag == MALLARD + "link" and not "".join(element.itertext()).strip():
        raise _Unrenderable
    if tag in (MALLARD + "guiseq", MALLARD + "keyseq") and children:
        separator = GUI_SEPARATOR if tag == MALLARD + "guiseq" else KEY_SEPARATOR
        return separator.join(_render(c).strip() for c in children)
    parts = [element.text or ""]
    for child in element:
        if isinstance(child.tag, str):
            parts.append(_render(child))
        parts.append(child.tail or "")
    return "".join(parts)


def page_blocks(source: bytes | Path) -> list[tuple[str, str | None]] | None:
    """[(block name, its text or None where it cannot be rendered)] of a page in document order, or None
    when the page is not well-formed XML. Blocks of the page's <info> are left out but for its summary
    (<desc>), and so are editors' comments, blocks inside another block and text not to translate."""
    try:
        root = etree.fromstring(source.read_bytes() if isinstance(source, Path) else source, _PARSER)
    except etree.XMLSyntaxError:
        return None
    blocks = []
    for element in root.iter(*BLOCKS):
        ancestors = list(element.iterancestors())
        if any(a.tag in BLOCKS for a in ancestors):
            continue
        if element.tag != MALLARD + "desc" and any(a.tag == MALLARD + "info" for a in ancestors):
            continue
        if any(a.tag == MALLARD + "comment" for a in ancestors):  # editors' notes: itstool leaves them out
            continue
        if element.get(ITS_TRANSLATE) == "no" or any(a.get(ITS_TRANSLATE) == "no" for a in ancestors):
            continue
        try:
            text = " ".join(_render(element).split())
        except _Unrenderable:
            text = None
        blocks.append((element.tag.removeprefix(MALLARD), text))
    return blocks


def _place(path: str, languages: list[str]) -> str | None:
    """Where a package's file goes in the extraction: "{language}/DOCUMENT/NAME.page" (English for C)."""
    parts = path.split("/")
    if len(parts) != 6 or parts[:3] != ["usr", "share", "help"] or not parts[5].endswith(".page"):
        return None
    language = "en" if parts[3] == ENGLISH_DIR else parts[3]
    return f"{language}/{parts[4]}/{parts[5]}" if language in languages else None


def help_segments(deb: DebFile, languages: list[str], pairs: list[Pair], release: str, cache_dir: Path,
                  collector: Collector) -> dict:
    """Collect a package's help pages' block pairs for every pair of languages; returns its manifest entry."""
    root = deb_files.extract(deb, cache_dir, lambda name: _place(name, languages), purpose="help")
    entry = {"package": deb.package, "version": deb.version, "sha256": deb.sha256,
             "licenses": list(deb_files.licenses_in(root))}
    english = sorted((root / "en").glob("*/*.page")) if (root / "en").is_dir() else []
    pages, blocks, found = Counter(), Counter(), Counter()
    for page in english:
        name = f"{page.parent.name}/{page.name}"
        split = entry_split(deb.package, name)
        parsed = {"en": page_blocks(page)}
        for language in languages:
            if language != "en" and (root / language / name).is_file():
                parsed[language] = page_blocks(root / language / name)
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
            blocks[f"{x}-{y}"] += len(units)
            found[split] += len(units)
            collector.add(split, (x, y), "help", deb.package, release, units)
    return {**entry, "pages": len(english), "paired_pages": dict(sorted(pages.items())),
            "block_pairs": dict(sorted(found.items()))}
