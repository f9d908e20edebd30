"""OpenDocument text and presentations (.odt, .odp): the zip container read and rewritten with lxml,
every paragraph (`text:p`, `text:h`) of content.xml translated in place (body, tables, lists, frames,
slides, speaker notes, footnotes and comments: each of those holds paragraphs of its own), those
of the headers and footers in styles.xml, and the titles and descriptions of frames and shapes (their
alternative text) and links' titles. A password-protected document (its manifest lists
encryption data) is refused as such.

Not odfpy: its last release is from 2020, its DOM rebuilds and reserializes every part it loads,
and its text API joins a paragraph's spans into one string (the formatting of a run inside a
sentence could not be put back). A paragraph here is mixed content: text sits in an element's text
and in its children's tails; spans and links (with their style) are containers, `text:s`, tabs,
line breaks, notes, comments, frames and fields are separators that stay in place.
"""
from __future__ import annotations

from lxml import etree

from nmt_serve.text.documents.document import (
    Document,
    DocumentError,
    open_zip,
    rewrite_zip,
)
from nmt_serve.text.documents.inline_runs import InlineParagraph, TextSlot
from nmt_serve.text.documents.language_marks import relabel_open_document, relabel_package
from nmt_serve.text.documents.office_open_xml import SAFE_PARSER

TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
PRESENTATION = "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"
FO = "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"
DC = "http://purl.org/dc/elements/1.1/"
XLINK = "http://www.w3.org/1999/xlink"
SVG = "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0"
_TITLE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}title"
MANIFEST = "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"
MEDIA_TYPES = {".odt": "application/vnd.oasis.opendocument.text", ".odp": "application/vnd.oasis.opendocument.presentation"}

_CONTAINERS = {f"{{{TEXT}}}{n}" for n in ("span", "a", "meta", "ruby-base")}
_MARKERS = {f"{{{TEXT}}}{n}" for n in (
    "bookmark", "bookmark-start", "bookmark-end", "reference-mark", "reference-mark-start", "reference-mark-end",
    "soft-page-break", "change", "change-start", "change-end", "alphabetical-index-mark", "toc-mark")} | {
    "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}annotation-end"}
_HEADERS_FOOTERS = {f"{{{STYLE}}}{n}" for n in ("header", "footer", "header-left", "footer-left", "header-first", "footer-first")}


def _setter(el: etree._Element, attribute: str):
    def write(text: str) -> None:
        setattr(el, attribute, text)

    return write


def paragraph_slots(p: etree._Element) -> list[TextSlot]:
    slots: list[TextSlot] = []
    separated = [False]

    def add(el: etree._Element, attribute: str, key: tuple) -> None:
        text = getattr(el, attribute)
        if text:
            slots.append(TextSlot(text, key, _setter(el, attribute), separated[0]))
            separated[0] = False

    def walk(el: etree._Element, key: tuple) -> None:
        add(el, "text", key)
        for child in el:
            if child.tag in _CONTAINERS:
                style = child.get(f"{{{TEXT}}}style-name") or child.get(f"{{{XLINK}}}href") or ""
                walk(child, key + ((child.tag, style, id(child) if child.tag == f"{{{TEXT}}}a" else None),))
            elif child.tag not in _MARKERS:
                separated[0] = True  # a comment (<!-- -->) too: harmless
            add(child, "tail", key)

    walk(p, ())
    return slots


def _paragraphs(elements) -> list[InlineParagraph]:
    out = []
    for p in elements:
        slots = paragraph_slots(p)
        if any(s.text.strip() for s in slots):
            out.append(InlineParagraph(slots))
    return out


def _plain(el: etree._Element) -> InlineParagraph:
    return InlineParagraph([TextSlot(el.text, None, _setter(el, "text"))])


def _encrypted(manifest: bytes) -> bool:
    """Whether the manifest says its members are encrypted (a password-protected document)."""
    try:
        root = etree.fromstring(manifest, SAFE_PARSER)
    except etree.XMLSyntaxError:
        return False  # a damaged manifest: the content tells
    return next(root.iter(f"{{{MANIFEST}}}encryption-data"), None) is not None


def read_open_document(data: bytes, extension: str) -> Document:
    archive = open_zip(data)
    names = set(archive.namelist())
    if "content.xml" not in names:
        raise DocumentError("it is not an OpenDocument (no content.xml)")
    if "mimetype" in names and archive.read("mimetype").decode("ascii", "replace").strip() != MEDIA_TYPES[extension]:
        raise DocumentError(f"it is not an OpenDocument {'text' if extension == '.odt' else 'presentation'}")
    if "META-INF/manifest.xml" in names and _encrypted(archive.read("META-INF/manifest.xml")):
        raise DocumentError("it is password-protected (encrypted): remove the password and send it again")
    roots = {"content.xml": etree.fromstring(archive.read("content.xml"), SAFE_PARSER)}
    if "styles.xml" in names:
        roots["styles.xml"] = etree.fromstring(archive.read("styles.xml"), SAFE_PARSER)
    p_tags = (f"{{{TEXT}}}p", f"{{{TEXT}}}h")
    content = roots["content.xml"]
    units = _paragraphs(content.iter(*p_tags))
    # a presentation's footer, header and date texts, declared once for the slides that show them
    units += [_plain(el) for el in content.iter(*(f"{{{PRESENTATION}}}{n}-decl" for n in ("header", "footer", "date-time")))
              if (el.text or "").strip()]
    # a frame's or shape's title and description: its alternative text, what a screen reader speaks for it
    units += [_plain(el) for el in content.iter(f"{{{SVG}}}title", f"{{{SVG}}}desc")
              if any(c.isalpha() for c in el.text or "") and not len(el)]
    # a link's title (its tooltip)
    units += [InlineParagraph([TextSlot(a.get(_TITLE), None, lambda text, a=a: a.set(_TITLE, text))])
              for a in content.iter(f"{{{TEXT}}}a") if any(c.isalpha() for c in a.get(_TITLE) or "")]
    if "styles.xml" in roots:
        units += _paragraphs(p for hf in roots["styles.xml"].iter(*_HEADERS_FOOTERS) for p in hf.iter(*p_tags))

    def save() -> bytes:
        return rewrite_zip(archive, {name: etree.tostring(root, xml_declaration=True, encoding="UTF-8")
                                     for name, root in roots.items()})

    def relabel(tag: str) -> None:  # the styles' languages, and meta.xml's dc:language
        for root in roots.values():
            relabel_open_document(root, tag, FO, STYLE)
        if "meta.xml" in names:
            meta = etree.fromstring(archive.read("meta.xml"), SAFE_PARSER)
            if relabel_package(meta, tag, DC):
                roots["meta.xml"] = meta

    return Document(units, save, relabel)
