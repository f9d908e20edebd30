"""Paragraphs of Office Open XML (WordprocessingML `w:p` and DrawingML `a:p`, shared by .docx and
.pptx) as `InlineParagraph`s: every `t` element of a run is a text slot, keyed by its run's
properties (`rPr`, less the attributes that do not change how it looks: language, spelling marks,
revision ids) and, in Word, by the hyperlink it sits in.

The walk goes into containers (hyperlinks, insertions, content controls, smart tags) and treats
anything else inside a paragraph that is not a run as a separator (line breaks, tabs, fields,
footnote and comment marks, drawings): it stays in place. Zero-width markers (bookmarks, comment
ranges, proofing marks) are neither. A nested paragraph (a text box inside a run) is a paragraph of
its own. Fields are computed text: their results are left alone (Word recomputes page numbers,
dates and tables of contents), except a HYPERLINK field's, whose text is the author's.
"""
from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import dataclass, field

from lxml import etree

from nmt_serve.text.documents.inline_runs import InlineParagraph, TextSlot

WORD_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
DRAWING_NS = "http://schemas.openxmlformats.org/drawingml/2006/main"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_WORD_T = f"{{{WORD_NS}}}t"

# properties that do not change how a run looks, dropped from its key
_IGNORED_ATTRIBUTES = {"lang", "altLang", "dirty", "err", "noProof", "smtClean", "smtId", "bmk"}
_IGNORED_PROPERTIES = {"lang", "noProof", "rsid", "specVanish", "webHidden"}


@dataclass(frozen=True)
class Dialect:
    ns: str
    containers: frozenset[str]  # descended into: their runs belong to the paragraph
    markers: frozenset[str]  # zero-width: neither text nor a separator
    hyperlink: str | None = None
    run_markers: frozenset[str] = field(default_factory=frozenset)  # inside a run: neither text nor a separator

    def tag(self, local: str) -> str:
        return f"{{{self.ns}}}{local}"


WORD = Dialect(
    WORD_NS,
    containers=frozenset({"hyperlink", "ins", "moveTo", "smartTag", "sdt", "sdtContent", "customXml", "bdo", "dir"}),
    markers=frozenset({"pPr", "bookmarkStart", "bookmarkEnd", "commentRangeStart", "commentRangeEnd", "proofErr",
                       "permStart", "permEnd", "moveFromRangeStart", "moveFromRangeEnd", "moveToRangeStart", "moveToRangeEnd",
                       "sdtPr", "sdtEndPr", "customXmlPr", "smartTagPr"}),
    hyperlink="hyperlink",
    run_markers=frozenset({"rPr", "lastRenderedPageBreak"}),
)
DRAWING = Dialect(DRAWING_NS, containers=frozenset(), markers=frozenset({"pPr", "endParaRPr"}),
                  run_markers=frozenset({"rPr"}))


def run_key(props: etree._Element | None, link: etree._Element | None = None) -> tuple:
    if props is None:
        return (b"", id(link) if link is not None else None)
    props = copy.deepcopy(props)
    for el in props.iter():
        for name in [n for n in el.attrib if etree.QName(n).localname in _IGNORED_ATTRIBUTES or etree.QName(n).localname.startswith("rsid")]:
            del el.attrib[name]
    for child in list(props):
        if isinstance(child.tag, str) and etree.QName(child).localname in _IGNORED_PROPERTIES:
            props.remove(child)
    return (etree.tostring(props, method="c14n"), id(link) if link is not None else None)


def _writer(t: etree._Element):
    def write(text: str) -> None:
        t.text = text
        if text != text.strip() and t.tag == _WORD_T:  # Word drops a w:t's outer spaces without it
            t.set(XML_SPACE, "preserve")

    return write


class _Field:
    def __init__(self) -> None:
        self.instruction, self.in_result = "", False

    @property
    def skipped(self) -> bool:
        return self.in_result and not self.instruction.strip().upper().startswith("HYPERLINK")


def paragraph_slots(p: etree._Element, dialect: Dialect) -> list[TextSlot]:
    slots: list[TextSlot] = []
    separated = [False]
    fields: list[_Field] = []
    run_tag, t_tag, p_tag = dialect.tag("r"), dialect.tag("t"), dialect.tag("p")

    def walk(el: etree._Element, link: etree._Element | None) -> None:
        for child in el:
            if not isinstance(child.tag, str):
                continue
            local = etree.QName(child).localname
            if child.tag == run_tag:
                run(child, link)
            elif child.tag == p_tag or etree.QName(child).namespace != dialect.ns:
                separated[0] = True
            elif local in dialect.containers:
                walk(child, child if local == dialect.hyperlink else link)
            elif local not in dialect.markers:
                separated[0] = True

    def run(r: etree._Element, link: etree._Element | None) -> None:
        key = run_key(r.find(dialect.tag("rPr")), link)
        for child in r:
            if not isinstance(child.tag, str):
                continue
            local = etree.QName(child).localname
            if child.tag == t_tag and not any(f.skipped for f in fields):
                if child.text:
                    slots.append(TextSlot(child.text, key, _writer(child), separated[0]))
                    separated[0] = False
            elif local == "fldChar":
                kind = child.get(dialect.tag("fldCharType"))
                if kind == "begin":
                    fields.append(_Field())
                elif kind == "separate" and fields:
                    fields[-1].in_result = True
                elif kind == "end" and fields:
                    fields.pop()
                separated[0] = True
            elif local == "instrText" and fields:
                fields[-1].instruction += child.text or ""
            elif local not in dialect.run_markers:
                separated[0] = True

    walk(p, None)
    return slots


def paragraphs(root: etree._Element, dialect: Dialect) -> list[InlineParagraph]:
    """Every paragraph in the part with text to translate (text boxes and table cells included)."""
    out = []
    for p in root.iter(dialect.tag("p")):
        slots = paragraph_slots(p, dialect)
        if any(s.text.strip() for s in slots):
            out.append(InlineParagraph(slots))
    return out


SAFE_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=False)


def part_root(part) -> tuple[etree._Element, bool]:
    """A package part's XML (python-docx and python-pptx keep the parts they model parsed, the others
    as bytes), and whether it must be written back with `store_root`."""
    element = getattr(part, "_element", None)
    if element is not None:
        return element, False
    return etree.fromstring(part.blob, SAFE_PARSER), True


def store_root(part, root: etree._Element) -> None:
    part._blob = etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True)


def package_writer(package, stored: list[tuple[object, etree._Element]]) -> Callable[[], bytes]:
    """The document's bytes once translated: the parts kept as bytes (`part_root`) written back, then
    the python-docx / python-pptx package saved."""
    def save() -> bytes:
        for part, root in stored:
            store_root(part, root)
        out = io.BytesIO()
        package.save(out)
        return out.getvalue()
    return save


def plain_text_unit(el: etree._Element) -> InlineParagraph:
    """An element whose text is all it has (a legacy PowerPoint comment), as a unit."""
    return InlineParagraph([TextSlot(el.text or "", None, _writer(el))])
