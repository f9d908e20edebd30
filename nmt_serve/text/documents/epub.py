"""EPUB books (.epub): the zip container read and rewritten with lxml; every XHTML content document
of the package (chapters, the EPUB 3 navigation document) translated block by block, and the
title and labels of the EPUB 2 table of contents (toc.ncx; not its author's name). A book whose
content documents are encrypted (DRM, as META-INF/encryption.xml lists them) is refused as such.

A unit is a run of inline content inside a block element (`<p>`, `<li>`, `<h1>`, `<td>`...): the
block's text, or a nested block's tail, with the inline elements that follow up to the next block.
It goes to the HTML path as the markup it is, so its inline tags (emphasis, links, footnote
references) are placed on the target words by the alignment as for any HTML, and the translated
fragment is parsed back in its place. The attributes that are text for people (an image's alt, a title)
are translated with the run that holds their element, or as units of their own where no run does (a
figure's image).

Not ebooklib: writing a book with it regenerates the package document and the navigation (their
metadata, guide and spine attributes are not all kept); here every other member of the zip is
copied byte for byte.
"""
from __future__ import annotations

import io
import posixpath
import re
from html.entities import name2codepoint
from html.parser import HTMLParser
from urllib.parse import unquote

from lxml import etree

from nmt_serve.text.documents.document import (
    Document,
    DocumentError,
    open_zip,
    rewrite_zip,
)
from nmt_serve.text.documents.inline_runs import InlineParagraph, TextSlot
from nmt_serve.text.documents.language_marks import relabel_package, relabel_xhtml
from nmt_serve.text.documents.office_open_xml import SAFE_PARSER
from nmt_serve.text.html_markup import translatable_attributes

XHTML = "http://www.w3.org/1999/xhtml"
CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
OPF = "http://www.idpf.org/2007/opf"
NCX = "http://www.daisy.org/z3986/2005/ncx/"
DC = "http://purl.org/dc/elements/1.1/"
XMLENC = "http://www.w3.org/2001/04/xmlenc#"

BLOCK = frozenset(
    ["html", "head", "title", "body", "div", "p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "dl", "dt", "dd", "table", "thead", "tbody", "tfoot", "tr", "td", "th", "caption", "figure", "figcaption", "blockquote", "section", "article", "aside", "header", "footer", "nav", "main", "address", "hr", "form", "fieldset", "legend", "details", "summary", "center", "menu", "hgroup"])
SKIP = frozenset(["script", "style", "pre", "textarea", "svg", "math", "noscript", "template"])  # not translated, and separate runs
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)


def _local(el: etree._Element) -> str | None:
    return etree.QName(el).localname if isinstance(el.tag, str) else None


class _InlineRun:
    """One unit: the owner's text (a block's text, or a nested block's tail) and the inline elements
    after it, their tails included."""

    def __init__(self, parent: etree._Element, after: etree._Element | None, children: list[etree._Element]):
        self.parent, self.after, self.children = parent, after, children
        lead = (after.tail if after is not None else parent.text) or ""
        self.html = _escape(lead) + "".join(etree.tostring(c, encoding="unicode", with_tail=True) for c in children)

    @property
    def text(self) -> str:
        lead = (self.after.tail if self.after is not None else self.parent.text) or ""
        # a comment or a processing instruction among them has no text of its own, only its tail
        return lead + "".join(("".join(c.itertext()) if isinstance(c.tag, str) else "") + (c.tail or "") for c in self.children)

    def write(self, translated_html: str) -> None:
        try:
            wrapper = etree.fromstring(f'<wrapper xmlns="{XHTML}">{translated_html}</wrapper>', _PARSER)
            lead, new = wrapper.text, list(wrapper)
        except etree.XMLSyntaxError:  # never expected (the HTML path keeps the markup): keep the text at least
            lead, new = _text_of(translated_html), []
        for c in self.children:
            self.parent.remove(c)
        if self.after is not None:
            self.after.tail = lead
            index = self.parent.index(self.after) + 1
        else:
            self.parent.text = lead
            index = 0
        for k, c in enumerate(new):
            self.parent.insert(index + k, c)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _text_of(fragment: str) -> str:
    parts: list[str] = []
    parser = HTMLParser(convert_charrefs=True)
    parser.handle_data = parts.append
    parser.feed(fragment)
    parser.close()
    return "".join(parts)


def inline_runs(root: etree._Element) -> list[_InlineRun]:
    units: list[_InlineRun] = []

    def finish(parent, after, children) -> None:
        run = _InlineRun(parent, after, children)
        if run.text.strip():
            units.append(run)

    def walk(block: etree._Element) -> None:
        after, children = None, []
        for child in block:
            local = _local(child)
            if local is None or (local not in BLOCK and local not in SKIP):
                children.append(child)  # inline (comments and processing instructions ride along, kept)
                continue
            finish(block, after, children)
            if local in BLOCK:
                walk(child)
            after, children = child, []
        finish(block, after, children)

    walk(root)
    return units


def attribute_units(root: etree._Element, runs: list[_InlineRun]) -> list[InlineParagraph]:
    """The values of the attributes that are text for people (an image's alt, a title: html_markup's rule) of
    the elements no run holds (a figure's image), each a unit; a run's own are translated with its text."""
    held = {id(el) for run in runs for child in run.children if isinstance(child.tag, str) for el in child.iter()}
    units = []

    def walk(el: etree._Element) -> None:
        local = _local(el)
        if local is None or local in SKIP or el.get("translate") == "no" or "notranslate" in (el.get("class") or "").split():
            return
        if id(el) not in held:
            names = translatable_attributes(local, {k: v for k, v in el.attrib.items() if not k.startswith("{")})
            for name in names:
                if any(c.isalpha() for c in el.get(name)):
                    units.append(InlineParagraph([TextSlot(el.get(name), None, lambda text, el=el, n=name: el.set(n, text))]))
        for child in el:
            walk(child)

    walk(root)
    return units


def _plain(el: etree._Element) -> InlineParagraph:
    def write(text: str) -> None:
        el.text = text

    return InlineParagraph([TextSlot(el.text, None, write)])


def _parse(data: bytes) -> etree._ElementTree:
    """The document as a tree (so its DOCTYPE is kept). EPUB 2 books may use HTML's named entities
    (`&nbsp;`), which XML knows only from the DTD, never loaded here: without a DTD to name they are
    an error, and become numeric references; under a DOCTYPE that names one (XHTML 1.1's, as EPUB 2
    books have it) the parser keeps them as entity nodes, which become their characters."""
    try:
        tree = etree.parse(io.BytesIO(data), _PARSER)
    except etree.XMLSyntaxError:
        named = re.sub(rb"&([A-Za-z][A-Za-z0-9]{1,31});", _numeric, data)
        if named == data:
            raise
        tree = etree.parse(io.BytesIO(named), _PARSER)
    _resolve_entities(tree.getroot())
    return tree


def _resolve_entities(root: etree._Element) -> None:
    """Each reference to an HTML named entity replaced by its character, in the text it sits in (one
    the DTD alone could define stays a node: it rides along as markup)."""
    for entity in list(root.iter(etree.Entity)):
        code = name2codepoint.get(entity.name)
        if code is None or entity.name in ("amp", "lt", "gt", "quot", "apos"):
            continue
        text, parent, previous = chr(code) + (entity.tail or ""), entity.getparent(), entity.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + text
        else:
            parent.text = (parent.text or "") + text
        parent.remove(entity)


def _numeric(m: re.Match) -> bytes:
    code = name2codepoint.get(m.group(1).decode())
    return m.group() if code is None or m.group(1) in (b"amp", b"lt", b"gt", b"quot", b"apos") else b"&#%d;" % code


def _encrypted_members(archive) -> set[str]:
    """The members META-INF/encryption.xml lists as encrypted (DRM; obfuscated fonts are listed too,
    and are no text)."""
    try:
        root = etree.fromstring(archive.read("META-INF/encryption.xml"), SAFE_PARSER)
    except etree.XMLSyntaxError:
        return set()
    return {posixpath.normpath(unquote(ref.get("URI", ""))) for ref in root.iter(f"{{{XMLENC}}}CipherReference")}


def read_epub(data: bytes) -> Document:
    archive = open_zip(data)
    try:
        container = etree.fromstring(archive.read("META-INF/container.xml"), SAFE_PARSER)
        opf_path = container.find(f".//{{{CONTAINER}}}rootfile").get("full-path")
        opf = etree.fromstring(archive.read(opf_path), SAFE_PARSER)
    except (KeyError, AttributeError, etree.XMLSyntaxError) as exc:
        raise DocumentError("it is not an EPUB (no readable META-INF/container.xml or package document)") from exc
    base = posixpath.dirname(opf_path)
    names = set(archive.namelist())
    encrypted = _encrypted_members(archive) if "META-INF/encryption.xml" in names else set()
    trees: dict[str, etree._ElementTree] = {}
    units = []
    for item in opf.iter(f"{{{OPF}}}item"):
        name = posixpath.normpath(posixpath.join(base, unquote(item.get("href", ""))))
        kind = item.get("media-type")
        if name not in names or kind not in ("application/xhtml+xml", "application/x-dtbncx+xml"):
            continue
        if name in encrypted:
            raise DocumentError(f"it is protected by DRM ({name} is encrypted): only a book without DRM can be translated")
        try:
            tree = _parse(archive.read(name))
        except etree.XMLSyntaxError as exc:
            raise DocumentError(f"{name} in the book is not well-formed XHTML ({exc})") from exc
        trees[name] = tree
        if kind == "application/x-dtbncx+xml":
            # the title and the labels; not the author's name (docAuthor)
            units += [_plain(t) for t in tree.getroot().iter(f"{{{NCX}}}text") if (t.text or "").strip()
                      and t.getparent().tag != f"{{{NCX}}}docAuthor"]
        else:
            runs = inline_runs(tree.getroot())
            units += runs + attribute_units(tree.getroot(), runs)

    package: dict[str, etree._Element] = {}  # the package document, once its dc:language is changed

    def save() -> bytes:
        return rewrite_zip(archive, {**{name: etree.tostring(tree, xml_declaration=True, encoding="utf-8")
                                        for name, tree in trees.items()},
                                     **{name: etree.tostring(root, xml_declaration=True, encoding="utf-8")
                                        for name, root in package.items()}})

    def relabel(tag: str) -> None:
        for tree in trees.values():
            relabel_xhtml(tree.getroot(), tag)
        if relabel_package(opf, tag, DC):
            package[opf_path] = opf

    return Document(units, save, relabel)
