"""XLIFF (.xlf, .xliff), the file translation tools exchange (CAT tools, localization platforms), versions 1.2
and 2.x, read and written with lxml: every segment without a translation gets one, and everything else in
the file is kept (its declaration, comments, notes, other namespaces' elements and attributes).

- 1.2: a `<trans-unit>` gets a `<target>` after its `<source>`, marked `state="needs-review-translation"`
  and `state-qualifier="mt-suggestion"`: a machine's suggestion for a translator to review, as a gettext
  catalog's entries get `fuzzy`. A unit segmented by the tool that wrote it (`<seg-source>` of
  `<mrk mtype="seg">`: Okapi, Trados) gets each segment translated on its own and a target of the same
  segments (the same `mid`s).
- 2.x: each `<segment>` without a target (or with an empty one) gets one, and `state="translated"`.
- A target that has text is kept (a translator's); a unit, group or file marked `translate="no"` is left
  alone; a segment with no letter in it (codes, numbers) too. The file's target language (1.2
  `<file target-language>`, 2.x `<xliff trgLang>`) becomes the translation's; its source language is the
  document's `source_language` (a request's `auto` takes it).
- A translation the service flags as doubtful (text/quality_flags.py) gets a note for the reviewer in its
  unit, each flag with what it means: 1.2 `<note from="nmt-serve" annotates="target">`, 2.x `<note
  category="nmt-serve" appliesTo="target">` in the unit's `<notes>`.

Inline codes go through as inline HTML and are placed on the target words as any document's formatting
(html_markup.py): an element around text (1.2 `<g>`, `<mrk>`; 2.x `<pc>`, `<mrk>`) and a pair of codes
around text at one level (`<bpt>`/`<ept>`, `<bx/>`/`<ex/>`, `<sc/>`/`<ec/>`, `<sm/>`/`<em/>`) become
spans, every other code (`<x/>`, `<ph>`, `<it>`, a lone `<bpt>`, `<cp/>`, ...) an anchor; each is written
back as the element(s) it stood for, ids and all, so the target holds the source's codes. A `<mrk>` marked
`translate="no"` (2.x) or `mtype="protected"` (1.2) is kept as it is and out of what the model reads, and
so are placeholders, URLs and code in the text (%s, {0}: protected_spans.py). A segment's leading and
trailing spaces stay outside the translation.
"""
from __future__ import annotations

import copy
import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser

from lxml import etree

from nmt_serve.text import protected_spans
from nmt_serve.text.documents.document import MAX_MARKUP_BYTES, Document, DocumentError
from nmt_serve.text.quality_flags import review_note

_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, remove_blank_text=False)
_NS_1 = "urn:oasis:names:tc:xliff:document:1."  # 1.0, 1.1, 1.2
_NS_2 = "urn:oasis:names:tc:xliff:document:2."  # 2.0 (2.1 uses its namespace), 2.2
_ATTRIBUTE = "data-xliff"
NOTE_AUTHOR = "nmt-serve"  # a note's `from` (1.2) or `category` (2.x): what wrote it
_TAG = re.compile(r"<[^<>]*>")
_LETTER = re.compile(r"[^\W\d_]")  # a segment without one (codes, numbers, punctuation) is not translated
_WRAPPING = {"g", "pc", "mrk"}  # elements whose content is text of the segment
# a code that begins a span of text, the code that ends it, and the attributes that pair them (the end's
# first, the beginning's second)
_PAIRS = {"bpt": ("ept", ("rid", "id"), ("rid", "id")), "bx": ("ex", ("rid", "id"), ("rid", "id")),
          "sc": ("ec", ("startRef",), ("id",)), "sm": ("em", ("startRef",), ("id",))}


def _name(node) -> str:
    return etree.QName(node).localname if isinstance(node.tag, str) else ""


def _bare(node: etree._Element) -> etree._Element:
    """A copy of the element alone: its tag and attributes, no content, no tail."""
    shell = copy.copy(node)
    for child in list(shell):
        shell.remove(child)
    shell.text = shell.tail = None
    return shell


def _whole(node) -> etree._Element:
    whole = copy.deepcopy(node)
    whole.tail = None
    return whole


def _text_html(text: str) -> str:
    marked = protected_spans.as_html(text)
    return marked if marked is not None else html.escape(text, quote=False)


@dataclass
class _Code:
    kind: str  # "wrap": an element around text; "pair": a begin and an end code; "whole": written as it was
    elements: tuple


@dataclass
class _Segment:
    """One text to translate: a 1.2 source or seg-source segment, a 2.x segment's source."""

    html: str
    text: str
    codes: list[_Code]
    lead: str
    trail: str
    put: Callable[[etree._Element | None], None]  # called with the translation as a target-shaped element
    make: Callable[[], etree._Element]  # an empty element to write the translation into
    translated: str | None = field(default=None, repr=False)
    owner: etree._Element | None = field(default=None, repr=False)  # the unit (1.2 trans-unit) its notes go in
    flags: tuple[str, ...] = ()  # its translation's quality flags

    def write(self, translated_html: str) -> None:
        self.translated = translated_html


def _segment(source: etree._Element, make, put) -> _Segment | None:
    """The source's content as inline HTML; None when it holds no word to translate."""
    codes: list[_Code] = []
    texts = [source.text or ""] + [child.tail or "" for child in source]
    lead = re.match(r"\s*", texts[0]).group()
    trail = texts[-1][len(texts[-1].rstrip()):] if texts[-1].strip() or len(texts) > 1 else ""
    texts[0] = texts[0][len(lead):]
    texts[-1] = texts[-1][:len(texts[-1]) - len(trail)] if trail else texts[-1]
    marked = _sequence(texts, list(source), codes).strip()
    text = html.unescape(_TAG.sub("", marked))
    if not _LETTER.search(text):
        return None
    return _Segment(marked, text, codes, lead, trail, put, make)


def _partners(nodes: list) -> dict[int, int]:
    """Begin and end codes at one level that pair up: index -> partner's index, both ways."""
    found: dict[int, int] = {}
    for i, node in enumerate(nodes):
        begin = _PAIRS.get(_name(node))
        if begin is None:
            continue
        end_name, end_keys, begin_keys = begin
        key = next((node.get(k) for k in begin_keys if node.get(k)), None)
        for j in range(i + 1, len(nodes)):
            if _name(nodes[j]) == end_name and j not in found and key is not None \
                    and next((nodes[j].get(k) for k in end_keys if nodes[j].get(k)), None) == key:
                found[i], found[j] = j, i
                break
    return found


def _sequence(texts: list[str], nodes: list, codes: list[_Code]) -> str:
    """Inline HTML of a run of text and nodes: texts[0] before nodes[0], texts[i + 1] after nodes[i]."""
    partners = _partners(nodes)
    out = [_text_html(texts[0])]
    i = 0
    while i < len(nodes):
        node, j = nodes[i], partners.get(i, -1)
        # a pair around text, with no pair crossing its edges: one span
        if j > i and all(i < partners.get(m, m) < j for m in range(i + 1, j)):
            inner = _sequence(texts[i + 1:j + 1], nodes[i + 1:j], codes)
            if _LETTER.search(html.unescape(_TAG.sub("", inner))):
                codes.append(_Code("pair", (_whole(node), _whole(nodes[j]))))
                out.append(f'<span {_ATTRIBUTE}="{len(codes) - 1}">{inner}</span>{_text_html(texts[j + 1])}')
                i = j + 1
                continue
        out.append(_node(node, codes) + _text_html(texts[i + 1]))
        i += 1
    return "".join(out)


def _node(node, codes: list[_Code]) -> str:
    name = _name(node)
    protected = node.get("translate") == "no" or node.get("mtype") == "protected"
    if name in _WRAPPING and not protected and "".join(node.itertext()).strip():
        codes.append(_Code("wrap", (_bare(node),)))
        k = len(codes) - 1
        return f'<span {_ATTRIBUTE}="{k}">{_sequence([node.text or ""] + [c.tail or "" for c in node], list(node), codes)}</span>'
    codes.append(_Code("whole", (_whole(node),)))
    if name in _WRAPPING:  # kept as written, out of what the model reads (html_markup's rule for translate="no")
        content = html.escape("".join(node.itertext()), quote=False)
        return f'<span translate="no" {_ATTRIBUTE}="{len(codes) - 1}">{content}</span>'
    return f'<img {_ATTRIBUTE}="{len(codes) - 1}">'


class _Builder(HTMLParser):
    """A translation's inline HTML written into an element: text as text, each span and anchor as the
    code(s) it stood for, any other tag (a protected span) dropped and its text kept."""

    def __init__(self, target: etree._Element, codes: list[_Code]):
        super().__init__(convert_charrefs=True)
        self.parents = [target]
        self.closing: list[tuple[str, object]] = []  # per open tag: what its end does
        self.skipping = 0  # depth inside a code written whole (its text was the source's)
        self.codes = codes

    def _code(self, attrs) -> _Code | None:
        value = dict(attrs).get(_ATTRIBUTE)
        return self.codes[int(value)] if value is not None and value.isdigit() and int(value) < len(self.codes) else None

    def _append(self, element: etree._Element) -> None:
        self.parents[-1].append(copy.deepcopy(element))

    def handle_starttag(self, tag, attrs):
        if self.skipping:
            self.skipping += tag != "img"
            return
        code = self._code(attrs)
        if tag == "img":
            if code is not None:
                for element in code.elements:
                    self._append(element)
            return
        if code is None:
            self.closing.append(("none", None))
        elif code.kind == "whole":
            self._append(code.elements[0])
            self.skipping = 1
        elif code.kind == "wrap":
            self._append(code.elements[0])
            self.parents.append(self.parents[-1][-1])
            self.closing.append(("pop", None))
        else:
            self._append(code.elements[0])
            self.closing.append(("end", code.elements[1]))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag != "img":
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.skipping:
            self.skipping -= 1
            return
        if tag == "img" or not self.closing:
            return
        what, element = self.closing.pop()
        if what == "pop":
            self.parents.pop()
        elif what == "end":
            self._append(element)

    def handle_data(self, data):
        if self.skipping:
            return
        _add_text(self.parents[-1], data)


def _add_text(parent: etree._Element, text: str) -> None:
    if len(parent):
        parent[-1].tail = (parent[-1].tail or "") + text
    else:
        parent.text = (parent.text or "") + text


def _fill(element: etree._Element, segment: _Segment, translated_html: str) -> etree._Element:
    builder = _Builder(element, segment.codes)
    builder.feed(translated_html)
    builder.close()
    element.text = segment.lead + (element.text or "")
    _add_text(element, segment.trail)
    return element


def _translatable(node: etree._Element) -> bool:
    """Whether the nearest translate attribute above the node (its own, its group's, its file's) allows it."""
    for ancestor in (node, *node.iterancestors()):
        if ancestor.get("translate") in ("no", "yes"):
            return ancestor.get("translate") == "yes"
    return True


def _has_text(node: etree._Element | None) -> bool:
    return node is not None and (bool("".join(node.itertext()).strip()) or len(node) > 0)


def _insert_after(anchor: etree._Element, element: etree._Element) -> None:
    """The element put after the anchor on a line of its own, indented as the anchor is, where the file is
    laid out so."""
    parent = anchor.getparent()
    index = parent.index(anchor)
    before = parent.text if index == 0 else parent[index - 1].tail
    parent.insert(index + 1, element)
    element.tail = anchor.tail
    if before and not before.strip():
        anchor.tail = before


def _place(parent: etree._Element, filled: etree._Element, target: etree._Element | None, after: etree._Element) -> None:
    """A translation's target where the empty one stood (its attributes kept), or after `after`."""
    if target is not None:
        filled.attrib.update(target.attrib)
        parent.replace(target, filled)
        filled.tail = target.tail
    else:
        _insert_after(after, filled)


def _segments_1(root: etree._Element, ns: str) -> list[_Segment]:
    q = lambda name: f"{{{ns}}}{name}" if ns else name  # noqa: E731
    segments: list[_Segment] = []
    for unit in root.iter(q("trans-unit")):
        source, target = unit.find(q("source")), unit.find(q("target"))
        if source is None or _has_text(target) or not _translatable(unit):
            continue
        seg_source = unit.find(q("seg-source"))
        marks = [] if seg_source is None else [m for m in seg_source.iter(q("mrk")) if m.get("mtype") == "seg"]

        def mark_target(unit=unit, target=target, source=source, seg_source=seg_source) -> etree._Element:
            """The unit's target: a copy of its segmented source, whose segments the translations replace."""
            made = unit.find(q("target"))
            if made is None or made is target:
                made = copy.deepcopy(seg_source)
                made.tag = q("target")
                made.attrib.clear()
                if target is not None:
                    made.attrib.update(target.attrib)
                    unit.remove(target)
                _insert_after(seg_source, made)
                made.set("state", "needs-review-translation")
                made.set("state-qualifier", "mt-suggestion")
            return made

        if marks:
            for mark in marks:
                mid = mark.get("mid")

                def put(filled, mid=mid, make_target=mark_target):
                    for into in make_target().iter(q("mrk")):
                        if into.get("mtype") == "seg" and into.get("mid") == mid:
                            into.text = filled.text
                            for child in list(into):
                                into.remove(child)
                            into.extend(list(filled))
                            return

                segment = _segment(mark, lambda: etree.Element(q("mrk")), put)
                if segment is not None:
                    segment.owner = unit
                    segments.append(segment)
            continue

        def put(filled, unit=unit, after=source if seg_source is None else seg_source, target=target):
            _place(unit, filled, target, after)
            filled.set("state", "needs-review-translation")
            filled.set("state-qualifier", "mt-suggestion")

        segment = _segment(source, lambda: etree.Element(q("target")), put)
        if segment is not None:
            segment.owner = unit
            segments.append(segment)
    return segments


def _segments_2(root: etree._Element, ns: str) -> list[_Segment]:
    q = lambda name: f"{{{ns}}}{name}"  # noqa: E731
    segments: list[_Segment] = []
    for seg in root.iter(q("segment")):
        source, target = seg.find(q("source")), seg.find(q("target"))
        if source is None or _has_text(target) or not _translatable(seg):
            continue

        def put(filled, seg=seg, source=source, target=target):
            _place(seg, filled, target, source)
            if seg.get("state", "initial") == "initial":
                seg.set("state", "translated")

        segment = _segment(source, lambda: etree.Element(q("target")), put)
        if segment is not None:
            segment.owner = seg.getparent()
            segments.append(segment)
    return segments


def _note(owner: etree._Element, ns: str, second: bool, text: str) -> None:
    """A note for the reviewer in the unit: 1.2's `<note from annotates="target">` after what the unit holds;
    2.x's `<note category appliesTo="target">` in its `<notes>`, which comes before its data and segments."""
    q = lambda name: f"{{{ns}}}{name}" if ns else name  # noqa: E731
    if not second:
        note = etree.Element(q("note"), {"from": NOTE_AUTHOR, "annotates": "target"})
        _insert_after(owner[-1], note)  # (a unit holds its source at least)
    else:
        note = etree.Element(q("note"), {"category": NOTE_AUTHOR, "appliesTo": "target"})
        notes = owner.find(q("notes"))
        if notes is not None and len(notes):
            _insert_after(notes[-1], note)
        elif notes is not None:
            notes.append(note)
        else:
            notes = etree.Element(q("notes"))
            notes.append(note)
            first = next((child for child in owner if _name(child) in ("originalData", "segment", "ignorable")), None)
            if first is None:
                owner.append(notes)
            else:  # before it, on a line of its own as it is
                index = owner.index(first)
                before = owner.text if index == 0 else owner[index - 1].tail
                first.addprevious(notes)
                if before and not before.strip():
                    notes.tail = before
    note.text = text


def read_xliff(data: bytes) -> Document:
    if len(data) > MAX_MARKUP_BYTES:
        raise DocumentError(f"it is {len(data)} bytes of XML; the limit is {MAX_MARKUP_BYTES}: split the file")
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError as exc:
        raise DocumentError(f"it is not well-formed XML ({exc})") from None
    if root is None or _name(root) != "xliff":
        raise DocumentError(f"it is not XLIFF (its root element is <{_name(root) if root is not None else ''}>, not <xliff>)")
    ns = etree.QName(root).namespace or ""
    version = root.get("version", "")
    if ns.startswith(_NS_2) or (not ns and version.startswith("2.")):
        segments, second = _segments_2(root, ns), True
    elif ns.startswith(_NS_1) or (not ns and version.startswith("1.")):
        segments, second = _segments_1(root, ns), False
    else:
        raise DocumentError(f"it is an XLIFF version this service does not read ({version or ns or 'none named'}); "
                            "it reads 1.2 and 2.x")
    tree = root.getroottree()
    # the declaration's standalone as the file had it (lxml reads a missing one as "no")
    standalone = tree.docinfo.standalone if re.match(rb"\s*<\?xml[^>]*standalone", data) else None
    labelled: list[str] = []

    def save() -> bytes:
        notes: dict[etree._Element, list[_Segment]] = {}
        for segment in segments:
            # a partial job's result (written without a language) holds texts not translated yet as they were:
            # their segments stay without a target
            if segment.translated is None or (segment.translated == segment.html and not labelled):
                continue
            segment.put(_fill(segment.make(), segment, segment.translated))
            if segment.flags and segment.owner is not None:
                notes.setdefault(segment.owner, []).append(segment)
        for owner, flagged in notes.items():  # one note per unit; its segment named where it has several
            several = sum(s.owner is owner for s in segments) > 1
            _note(owner, ns, second, "\n".join((f'"{s.text}": ' if several else "") + review_note(s.flags) for s in flagged))
        return etree.tostring(tree, xml_declaration=True, encoding=tree.docinfo.encoding or "UTF-8", standalone=standalone)

    def relabel(tag: str) -> None:
        labelled.append(tag)
        if second:
            root.set("trgLang", tag)
        else:
            for file in root.iter(f"{{{ns}}}file" if ns else "file"):
                file.set("target-language", tag)

    def annotate(flags: list[tuple[str, ...]]) -> None:
        for segment, found in zip(segments, flags):
            segment.flags = tuple(found)

    declared = root.get("srcLang") if second else next((f.get("source-language") for f in root.iter(f"{{{ns}}}file" if ns else "file")), None)
    return Document(segments, save, relabel, declared or None, annotate)
