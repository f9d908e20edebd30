"""Paragraphs of Office Open XML (WordprocessingML `w:p` and DrawingML `a:p`, shared by .docx and
.pptx) as `InlineParagraph`s: every `t` element of a run is a text slot, keyed by its run's
properties (`rPr`, less the attributes that do not change how it looks: language, spelling marks,
revision ids) and, in Word, by the hyperlink it sits in.

The walk goes into containers (hyperlinks, insertions, content controls, smart tags) and treats
anything else inside a paragraph that is not a run as a separator (line breaks, tabs, fields,
footnote and comment marks, drawings): it stays in place. Zero-width markers (bookmarks, comment
ranges, proofing marks) are neither; so is an optional hyphen (`w:softHyphen`, inside a word), which
a translated paragraph drops. A nested paragraph (a text box inside a run) is a paragraph of its
own. Fields (`w:fldChar` ... `w:fldChar`, or one `w:fldSimple`) are computed text: their results
are left alone (page numbers, dates: Word recomputes them), except a HYPERLINK field's, whose text
is the author's, and a table of contents' (TOC: the headings' text, translated as they are; its page
numbers are PAGEREF fields, left alone). A field may span paragraphs, as a table of contents does:
its state carries from one to the next.

`check_main_part` tells a .docx or .pptx from another Office file renamed to it (a .docm, a
template, a workbook) before python-docx or python-pptx opens it.
"""
from __future__ import annotations

import copy
import io
import posixpath
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field

from lxml import etree

from nmt_serve.text.documents.document import DocumentError
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


# fields whose result is the author's text, translated: a link's, and a table of contents' (the
# headings' text; the page numbers in it are PAGEREF fields of their own, left alone)
_TEXT_FIELDS = {"HYPERLINK", "TOC"}
_FIELD_NAME = re.compile(r"\s*([A-Za-z]+)")


class _Field:
    def __init__(self) -> None:
        self.instruction, self.in_result = "", False

    @property
    def skipped(self) -> bool:
        return self.in_result and not _is_text_field(self.instruction)


def _is_text_field(instruction: str) -> bool:
    name = _FIELD_NAME.match(instruction)
    return name is not None and name.group(1).upper() in _TEXT_FIELDS


def paragraph_slots(p: etree._Element, dialect: Dialect, fields: list[_Field] | None = None) -> list[TextSlot]:
    """The paragraph's text slots. fields: the complex fields open where it starts (one may span
    paragraphs, as a table of contents does), updated as its runs open and close them."""
    slots: list[TextSlot] = []
    separated = [False]
    fields = [] if fields is None else fields
    soft_hyphens: list[etree._Element] = []
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
            elif local == "fldSimple" and _is_text_field(child.get(dialect.tag("instr")) or "") \
                    and not any(f.skipped for f in fields):
                separated[0] = True  # a field in one element: its result is the author's text, as a link's
                walk(child, child)
                separated[0] = True
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
            elif local == "softHyphen":
                if not any(f.skipped for f in fields):
                    soft_hyphens.append(child)
            elif local not in dialect.run_markers:
                separated[0] = True

    walk(p, None)
    if soft_hyphens and slots:
        slots[0].write = _dropping(soft_hyphens, slots[0].write)
    return slots


def _dropping(elements: list[etree._Element], write: Callable[[str], None]) -> Callable[[str], None]:
    """The slot's writer, which also takes the elements out of the paragraph (its source words'
    optional hyphens: the translation's words break where the target language does)."""
    def drop_and_write(text: str) -> None:
        for el in elements:
            if el.getparent() is not None:
                el.getparent().remove(el)  # a soft hyphen has no tail (it sits in a run, as text does in w:t)
        write(text)

    return drop_and_write


def paragraphs(root: etree._Element, dialect: Dialect) -> list[InlineParagraph]:
    """Every paragraph in the part with text to translate (text boxes and table cells included). A
    complex field open at a paragraph's end stays open in the next (a table of contents, an index),
    where the part's fields are balanced (each begun one ends): its result is then the same kind of
    text in every paragraph it covers."""
    out = []
    char = dialect.tag("fldChar"), dialect.tag("fldCharType")
    kinds = [el.get(char[1]) for el in root.iter(char[0])]
    fields: list[_Field] | None = [] if kinds.count("begin") == kinds.count("end") else None
    for p in root.iter(dialect.tag("p")):
        slots = paragraph_slots(p, dialect, fields)
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


def held_roots(package, stored: list[tuple[object, etree._Element]], wanted: Callable[[str], bool]):
    """(part, XML root) of every part of the package whose content type is `wanted`: the root already held
    for a part in `stored`, else the part's own, one read from its bytes added to `stored` (written back)."""
    held = {id(part): root for part, root in stored}
    for part in package.iter_parts():
        if not wanted(part.content_type):
            continue
        root = held.get(id(part))
        if root is None:
            root, as_bytes = part_root(part)
            if as_bytes:
                stored.append((part, root))
        yield part, root


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


# attributes that hold text for people, by their element: the description and title in the non-visual
# properties of a picture, shape or chart (Word's wp:docPr, DrawingML's p:cNvPr, pic:cNvPr, xdr:cNvPr), its
# alternative text, which a screen reader speaks; a link's tooltip (Word's w:hyperlink, DrawingML's a:hlinkClick)
_FOR_PEOPLE = {"docPr": ("descr", "title"), "cNvPr": ("descr", "title"), "hyperlink": ("tooltip",),
               "hlinkClick": ("tooltip",), "hlinkHover": ("tooltip",)}


def alt_texts(root: etree._Element) -> list[InlineParagraph]:
    """Every picture's and shape's alternative text in the part (its description and title) and every link's
    tooltip, a unit per distinct text: Word writes a picture's description twice (`wp:docPr` and
    `pic:cNvPr`), and both places take the one translation."""
    places: dict[str, list[Callable[[str], None]]] = {}  # text -> where it is written, in document order
    for el in root.iter():
        names = _FOR_PEOPLE.get(etree.QName(el).localname) if isinstance(el.tag, str) else None
        for key in [k for k in el.attrib if names and etree.QName(k).localname in names]:
            value = el.get(key)
            if any(c.isalpha() for c in value):
                places.setdefault(value, []).append(lambda text, el=el, k=key: el.set(k, text))
    return [InlineParagraph([TextSlot(value, None, lambda text, setters=setters: [put(text) for put in setters])])
            for value, setters in places.items()]


def plain_text_unit(el: etree._Element) -> InlineParagraph:
    """An element whose text is all it has (a legacy PowerPoint comment), as a unit."""
    return InlineParagraph([TextSlot(el.text or "", None, _writer(el))])


_WML = "application/vnd.openxmlformats-officedocument.wordprocessingml."
_PML = "application/vnd.openxmlformats-officedocument.presentationml."
MAIN_PARTS = {".docx": _WML + "document.main+xml", ".pptx": _PML + "presentation.main+xml",
              ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"}
# what an Office file renamed to .docx or .pptx is, by its main part's content type (Office itself
# refuses a file whose name and main part disagree: it is answered here rather than translated)
_KINDS = {  # content type -> (what it is, its extension)
    _WML + "document.main+xml": ("a Word document", ".docx"),
    _WML + "template.main+xml": ("a Word template", ".dotx"),
    "application/vnd.ms-word.document.macroEnabled.main+xml": ("a Word document with macros", ".docm"),
    "application/vnd.ms-word.template.macroEnabledTemplate.main+xml": ("a Word template with macros", ".dotm"),
    _PML + "presentation.main+xml": ("a PowerPoint presentation", ".pptx"),
    _PML + "slideshow.main+xml": ("a PowerPoint show", ".ppsx"),
    _PML + "template.main+xml": ("a PowerPoint template", ".potx"),
    "application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml": ("a PowerPoint presentation with macros", ".pptm"),
    "application/vnd.ms-powerpoint.slideshow.macroEnabled.main+xml": ("a PowerPoint show with macros", ".ppsm"),
    "application/vnd.ms-powerpoint.template.macroEnabled.main+xml": ("a PowerPoint template with macros", ".potm"),
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml": ("an Excel workbook", ".xlsx"),
    "application/vnd.ms-excel.sheet.macroEnabled.main+xml": ("an Excel workbook with macros", ".xlsm"),
}
_OFFICE_DOCUMENT = "/officeDocument"  # the end of the package relationship's type that names the main part
_STRICT = "http://purl.oclc.org/ooxml/"  # ISO 29500 Strict's namespaces (python-docx and python-pptx read Transitional)


def check_main_part(archive: zipfile.ZipFile, extension: str) -> None:
    """The package's main part is there and is what the extension says (.docx: a Word document, not a
    .docm or a template renamed); DocumentError naming what it is otherwise."""
    members = {name.lower(): name for name in archive.namelist()}

    def read(name: str) -> etree._Element:
        member = members.get(name.lower())
        if member is None:
            raise DocumentError(f"it is not an Office Open XML package (no {name})")
        return etree.fromstring(archive.read(member), SAFE_PARSER)

    types, rels = read("[Content_Types].xml"), read("_rels/.rels")
    main = next((r for r in rels if isinstance(r.tag, str) and (r.get("Type") or "").endswith(_OFFICE_DOCUMENT)
                 and r.get("TargetMode") != "External"), None)
    target = main.get("Target") if main is not None else None
    if not target:
        raise DocumentError("it names no main document part (_rels/.rels)")
    if main.get("Type").startswith(_STRICT):
        raise DocumentError(f"it is saved as Strict Open XML, which is not read here: save it as {extension} "
                            f"(not \"Strict Open XML\") to translate it")
    part = posixpath.normpath("/" + target.lstrip("/"))
    if part.lstrip("/").lower() not in members:
        raise DocumentError(f"its main document part {part} is missing")
    content_type = next((t.get("ContentType") for t in types if etree.QName(t).localname == "Override"
                         and (t.get("PartName") or "").lower() == part.lower()), None)
    if content_type is None:
        ext = posixpath.splitext(part)[1].lstrip(".").lower()
        content_type = next((t.get("ContentType") for t in types if etree.QName(t).localname == "Default"
                             and (t.get("Extension") or "").lower() == ext), None)
    if content_type != MAIN_PARTS[extension]:
        expected = "{} ({})".format(*_KINDS[MAIN_PARTS[extension]])
        if content_type not in _KINDS:
            raise DocumentError(f"it is not {expected}: its main part is {content_type or 'of no known type'}")
        kind, kind_extension = _KINDS[content_type]
        advice = (f"send it named {kind_extension}" if kind_extension in MAIN_PARTS
                  else f"save it as {extension} to translate it" if kind.split()[1] == expected.split()[1] else "")
        raise DocumentError(f"it is {kind} ({kind_extension}), not {expected}" + (f": {advice}" if advice else ""))
