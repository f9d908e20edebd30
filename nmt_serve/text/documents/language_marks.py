"""The language a document says its text is in, changed to the translation's.

Word processors and readers go by it: spell checking, hyphenation, the voice that reads it aloud, the
fonts of East Asian text. A translated document that still says `de-DE` is checked as German. Each
format keeps it in its own place, and only where it is already given is it changed (a document that
names no language keeps naming none):

- Word (`w:lang` in runs, styles and the defaults): `w:val` for text in Latin and other simple scripts,
  `w:eastAsia` for Chinese, Japanese and Korean, `w:bidi` for right-to-left scripts; the attribute of the
  target's kind is set, the others are left as they were (they name the language of runs in other scripts).
- DrawingML (PowerPoint, and charts and SmartArt in Word): the `lang` attribute of run properties.
- OpenDocument (`style:text-properties`): `fo:language` / `fo:country`, or their `-asian` and
  `-complex` kinds as above.
- EPUB: the package's `dc:language` and the `lang` / `xml:lang` of each page's root element.

A language is given as the service names it (ISO 639-1 `en`, or a model's own code, `pt_BR`, `fra_Latn`)
and written as a BCP 47 tag (`en`, `pt-BR`, `fr`).
"""
from __future__ import annotations

from lxml import etree

EAST_ASIAN = frozenset({"zh", "ja", "ko"})
RIGHT_TO_LEFT = frozenset({"ar", "he", "fa", "ur", "yi", "ps", "sd", "ug", "dv", "ckb"})
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"


def kind(tag: str) -> str:
    """Which of a document's three language slots a tag goes in: "latin", "asian" or "complex"."""
    primary = tag.split("-")[0].lower()
    return "asian" if primary in EAST_ASIAN else "complex" if primary in RIGHT_TO_LEFT else "latin"


def relabel_word(root: etree._Element, tag: str, ns: str) -> None:
    """Word's `w:lang` elements: the attribute of the tag's kind set where the element is."""
    attribute = f"{{{ns}}}" + {"latin": "val", "asian": "eastAsia", "complex": "bidi"}[kind(tag)]
    for el in root.iter(f"{{{ns}}}lang"):
        el.set(attribute, tag)


def relabel_drawing(root: etree._Element, tag: str) -> None:
    """DrawingML run properties that name a language (`lang`)."""
    for el in root.iter():
        if isinstance(el.tag, str) and el.get("lang") is not None and el.tag.endswith(("}rPr", "}endParaRPr", "}defRPr")):
            el.set("lang", tag)


def relabel_open_document(root: etree._Element, tag: str, fo: str, style: str) -> None:
    """OpenDocument text properties: the language (and country, or none) of the tag's kind."""
    primary, _, region = tag.partition("-")
    language, country = {
        "latin": (f"{{{fo}}}language", f"{{{fo}}}country"),
        "asian": (f"{{{style}}}language-asian", f"{{{style}}}country-asian"),
        "complex": (f"{{{style}}}language-complex", f"{{{style}}}country-complex"),
    }[kind(tag)]
    for el in root.iter(f"{{{style}}}text-properties"):
        if el.get(language) is not None:
            el.set(language, primary)
            if region:
                el.set(country, region)
            elif el.get(country) is not None:
                del el.attrib[country]  # "none" would say there is none; no attribute: the language's own


def relabel_xhtml(root: etree._Element, tag: str) -> None:
    """An XHTML page's root `lang` and `xml:lang`, and those of elements that name the same language
    as the root (a quotation in a third language keeps its own)."""
    before = {root.get(a) for a in ("lang", XML_LANG)} - {None}
    for el in root.iter():
        if not isinstance(el.tag, str):
            continue
        for attribute in ("lang", XML_LANG):
            if el.get(attribute) is not None and (el is root or el.get(attribute) in before):
                el.set(attribute, tag)


def relabel_package(opf: etree._Element, tag: str, dc: str) -> bool:
    """The EPUB package's first `dc:language`; whether there was one."""
    language = opf.find(f".//{{{dc}}}language")
    if language is None:
        return False
    language.text = tag
    return True
