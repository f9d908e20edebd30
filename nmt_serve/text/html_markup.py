"""Translate the text of an HTML document while keeping its markup byte for byte.

`parse_html` cuts a document into segments (runs of text and inline elements between block
boundaries); `HtmlDocument.rebuild` puts translations back, moving inline tags to the target words
the word alignment points at. Everything that is not translated text is copied from the source
verbatim, so tags, attributes, comments and untouched elements come out exactly as they went in.

The values of the attributes that hold text for people are segments too, after the text's: the HTML
standard's translatable attributes (`title`, `alt`, `placeholder`, `label`, `abbr`, a `<meta>`
description's `content`, a button's `value`) and `aria-label`, which screen readers speak; a value
comes back in its own quotes (an unquoted one quoted where its translation needs it), and one whose
translation is its text as it was comes back as written. The root element's `lang` (and `xml:lang`) becomes the translation's
language where rebuild is given it. An element marked `translate="no"` keeps its attributes too.
"""
from __future__ import annotations

import html as _html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from nmt_serve.text.word_alignment import complete_alignment

INLINE = frozenset("a abbr b bdi bdo big cite code data dfn em font i kbd mark q s samp small span "
                   "strike strong sub sup time tt u var".split())
# Void elements that can sit inside a sentence: kept as zero-width anchors instead of splitting it.
INLINE_VOID = frozenset({"img", "wbr"})
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
RAW_TEXT = frozenset({"script", "style", "pre", "textarea", "code"})
# Start tags that end an unclosed untouched element (so `<li translate=no>a<li>b` frees the 2nd item).
_CLOSED_BY = {"p": set("address article aside blockquote details div dl fieldset figcaption figure "
                       "footer form h1 h2 h3 h4 h5 h6 header hgroup hr main menu nav ol p pre section "
                       "table ul".split()),
              "li": {"li"}, "dt": {"dt", "dd"}, "dd": {"dt", "dd"},
              "td": {"td", "th", "tr"}, "th": {"td", "th", "tr"}, "tr": {"tr"},
              "option": {"option", "optgroup"}}
_WS = " \t\n\r\f"  # HTML whitespace; U+00A0 (&nbsp;) is text, not a separator
_TOKEN = re.compile(r"[^ \t\n\r\f]+|[ \t\n\r\f]+")
_WORD = re.compile(r"[^ \t\n\r\f]+")
# The same references html.unescape decodes, so text is decoded exactly as unescape would.
_REF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")
_ESCAPE = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# attribute -> the elements whose attribute it is a text for people (None: every element's)
_TRANSLATABLE = {"title": None, "aria-label": None, "alt": {"img", "area", "input"}, "placeholder": {"input", "textarea"},
                 "label": {"optgroup", "option", "track"}, "abbr": {"th"}}
_META_TEXT = {"description", "keywords", "og:title", "og:description", "twitter:title", "twitter:description"}
_BUTTONS = {"button", "reset", "submit"}
_ATTRIBUTE = re.compile(r"""[\s"'/]([^\s"'>/=]+)\s*=\s*("[^"]*"|'[^']*'|[^\s"'=<>`]+)""")
_MARK = re.compile("\ue000(\\d+)\ue001")  # an attribute value's place in the source while it is parsed


@dataclass(frozen=True)
class AlignedText:
    text: str
    # for each target word: (its char span in `text`, the char span in the segment's source text of
    # the source word it is aligned to); None when the segment has no inline markup
    alignment: list[tuple[tuple[int, int], tuple[int, int]]] | None = None
    # for each sentence, translated on its own: (its char span in `text`, its char span in the source text);
    # None when unknown. An element around whole sentences goes around their whole translations, and
    # whatever stands between two sentences stays between them
    sentences: list[tuple[tuple[int, int], tuple[int, int]]] | None = None


@dataclass
class _Event:
    kind: str  # parser: start | startend | end | text | other; in a run: text | open | close | anchor
    start: int
    end: int
    tag: str = ""
    attrs: list = field(default_factory=list)


class _Collector(HTMLParser):
    def __init__(self, source: str):
        super().__init__(convert_charrefs=False)  # see references as written, to copy them back
        self.source, self.events = source, []
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", source)]

    def _pos(self) -> int:
        line, col = self.getpos()
        return self._line_starts[line - 1] + col

    def _add(self, kind, length=-1, tag="", attrs=()):
        start = self._pos()
        self.events.append(_Event(kind, start, start + length if length >= 0 else -1, tag, list(attrs)))

    def handle_starttag(self, tag, attrs, kind="start"):
        self._add(kind, len(self.get_starttag_text()), tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs, "startend")

    def handle_endtag(self, tag):
        self._add("end", tag=tag)

    def handle_data(self, data):
        self._add("text", len(data))

    def handle_entityref(self, name, prefix="&"):
        end = self._pos() + len(prefix) + len(name)
        self._add("text", len(prefix) + len(name) + (self.source[end:end + 1] == ";"))

    def handle_charref(self, name):
        self.handle_entityref(name, "&#")

    def handle_comment(self, data):
        self._add("other")

    handle_decl = handle_pi = unknown_decl = handle_comment


def _events(source: str) -> list[_Event]:
    """Events tiling the source: each markup event owns the bytes up to the next one, and whatever the
    parser skipped after a text event (e.g. `</>`) becomes markup of its own."""
    p = _Collector(source)
    p.feed(source)
    tail = len(source) - len(p.rawdata)
    p.close()
    first = p.events[0].start if p.events else len(source)
    events: list[_Event] = [_Event("other", 0, first)] if first else []
    for i, ev in enumerate(p.events):
        nxt = p.events[i + 1].start if i + 1 < len(p.events) else len(source)
        if ev.kind == "text" and ev.start >= tail and re.match(r"<[A-Za-z!/?]", source[ev.start:]):
            # an unterminated tag at the end: the parser gave up on it, other parsers may not
            events.append(_Event("other", ev.start, len(source)))
            break
        if ev.kind != "text" or ev.end >= nxt:
            ev.end = nxt
            events.append(ev)
        else:
            events += [ev, _Event("other", ev.end, nxt)]
    return events


def _untouched(ev: _Event) -> bool:
    attrs = {k: (v or "") for k, v in ev.attrs}
    return (ev.tag in RAW_TEXT or attrs.get("translate", "").strip().lower() == "no"
            or "notranslate" in attrs.get("class", "").split())


def _region_end(events: list[_Event], i: int) -> tuple[int, bool]:
    """Index after an untouched element's last event, and whether its end tag was found."""
    tag = events[i].tag
    if events[i].kind == "startend" or tag in VOID:
        return i + 1, True
    depth = 1
    for k in range(i + 1, len(events)):
        ev = events[k]
        if ev.tag == tag and ev.kind in ("start", "end"):
            depth += 1 if ev.kind == "start" else -1
            if depth == 0:
                return k + 1, True
        elif depth == 1 and ev.kind in ("start", "startend") and ev.tag in _CLOSED_BY.get(tag, ()):
            return k, False
    return len(events), False


@dataclass
class _Node:
    start: int  # char offset in the segment's full text (an anchor has start == end)
    end: int = -1
    open: str = ""  # the anchor's whole markup, or the element's start tag
    close: str = ""
    children: list[_Node] = field(default_factory=list)
    anchor: bool = False


def _decode(raw: str) -> tuple[str, list[str]]:
    """Decoded text and, per decoded char, the source bytes it came from (so unchanged words can be
    written back with the entities they had)."""
    chars, pieces, pos = [], [], 0
    for m in list(_REF.finditer(raw)) + [None]:
        plain = raw[pos:m.start() if m else len(raw)]
        chars.append(plain)
        pieces += list(plain)
        if m:
            ref, dec = m.group(), _html.unescape(m.group())
            chars.append(dec)
            pieces += list(ref) if dec == ref else [ref] + [""] * (len(dec) - 1)
            pos = m.end()
    return "".join(chars), pieces


_PUNCTUATION = ".,;:!?…)]}»«“”„\"'’(["

def _edge_punctuation(text: str, step: int) -> int:
    """How many punctuation characters the text ends (step -1) or starts (step 1) with."""
    stripped = text.rstrip(_PUNCTUATION) if step < 0 else text.lstrip(_PUNCTUATION)
    return len(text) - len(stripped) if stripped.strip(_WS) else 0


def _equal_run(a: str, ai: int, b: str, bi: int, limit: int, step: int, words: bool = True) -> int:
    """How many chars (at most `limit`) match between a and b walking from ai/bi by step (+1 or -1);
    words=False: only spaces and punctuation (a letter that matches may be part of another word)."""
    n, ai, bi = 0, ai - (step < 0), bi - (step < 0)
    while n < limit and 0 <= ai + step * n < len(a) and 0 <= bi + step * n < len(b) \
            and a[ai + step * n] == b[bi + step * n] and (words or not a[ai + step * n].isalnum()):
        n += 1
    return n


def _proportional(src: str, tgt: str) -> list:
    """A monotone alignment for when none was given: equal word counts pair up one to one. Every
    source word gets a target word (the one at its place where the translation is shorter): with no
    alignment there is no telling that a word was dropped."""
    sw, tw = [m.span() for m in _WORD.finditer(src)], [m.span() for m in _WORD.finditer(tgt)]
    if not sw or not tw:
        return []
    pairs = [(t, sw[(2 * j + 1) * len(sw) // (2 * len(tw))]) for j, t in enumerate(tw)]
    paired = {s for _, s in pairs}
    return pairs + [(tw[(2 * i + 1) * len(tw) // (2 * len(sw))], s) for i, s in enumerate(sw) if s not in paired]


@dataclass
class Segment:
    text: str  # what to translate: entities decoded, inline tags removed, outer whitespace stripped
    has_inline: bool  # inline elements or anchors sit inside: rebuild places them by the alignment
    _full: str = field(default="", repr=False)  # text with its outer whitespace
    _lead: int = field(default=0, repr=False)
    _pieces: list[str] = field(default_factory=list, repr=False)
    _nodes: list[_Node] = field(default_factory=list, repr=False)

    def _encode(self, text: str) -> list[str]:
        """Per char of a translation, what to write: a word that is also in the source is written as
        it was there (the n-th time as the n-th time in the source), anything else escaped."""
        known: dict[str, list[list[str]]] = {}
        for m in _TOKEN.finditer(self.text):
            known.setdefault(m.group(), []).append(self._pieces[self._lead + m.start():self._lead + m.end()])
        seen: dict[str, int] = {}
        out: list[str] = []
        for m in _TOKEN.finditer(text):
            forms, n = known.get(m.group()), seen.get(m.group(), 0)
            seen[m.group()] = n + 1
            out += forms[min(n, len(forms) - 1)] if forms else [_ESCAPE.get(c, c) for c in m.group()]
        return out

    def render(self, tr: AlignedText) -> str:
        src, lead = self._full, self._lead
        tail = len(src) - lead - len(self.text)
        tgt = src[:lead] + tr.text + src[len(src) - tail:]
        pieces = self._pieces[:lead] + self._encode(tr.text) + self._pieces[len(src) - tail:]
        if not self._nodes:
            return "".join(pieces)
        if tr.alignment is None:
            align = _proportional(self.text, tr.text)
        else:
            align = complete_alignment(self.text, tr.text, tr.alignment, _WORD)
        pairs = [((t0 + lead, t1 + lead), (s0 + lead, s1 + lead)) for (t0, t1), (s0, s1) in align]
        # a word kept as it was (up to case) keeps tags that sit inside it at the same letters
        same = {p: tgt[p[0][0]:p[0][1]].casefold() == src[p[1][0]:p[1][1]].casefold()
                and p[0][1] - p[0][0] == p[1][1] - p[1][0] for p in pairs}
        sentences = [((t0 + lead, t1 + lead), (s0 + lead, s1 + lead)) for (t0, t1), (s0, s1) in tr.sentences or []]

        def between_sentences(p: int) -> int | None:
            """Target offset for source offset p in the text between two sentences (copied as it is)."""
            for ((_, ta), (_, sa)), ((tb, _), (sb, _)) in zip(sentences, sentences[1:]):
                if sa <= p <= sb:
                    return min(ta + (p - sa), tb)
            return None

        def at(p: int) -> int:
            """Target offset for a zero-width thing at source offset p: after the word before it."""
            if (t := between_sentences(p)) is not None:
                return t
            before = [x for x in pairs if x[1][0] < p]
            if before:
                x = max(before, key=lambda x: (x[1][0], x[0][1]))
                (t0, t1), (s0, s1) = x
                if p < s1:
                    return t0 + (p - s0) if same[x] else t1
                return t1 + _equal_run(tgt, t1, src, s1, p - s1, 1)
            after = [x for x in pairs if x[1][0] >= p]
            if after:
                (t0, _), (s0, _) = min(after, key=lambda x: (x[1][0], x[0][0]))
                return t0 - _equal_run(tgt, t0, src, s0, s0 - p, -1)
            return round(p * len(tgt) / max(1, len(src)))

        def span(n: _Node) -> tuple[int, int]:
            ts, te = words_span(n)
            whole = [t for t, (s0, s1) in sentences if n.start <= s0 and s1 <= n.end]
            if whole:  # its words' alignment may miss a sentence's first or last words
                ts, te = min(ts, whole[0][0]), max(te, whole[-1][1])
                if (t := between_sentences(n.start)) is not None:
                    ts = t
                if (t := between_sentences(n.end)) is not None:
                    te = t
            return ts, te

        def words_span(n: _Node) -> tuple[int, int]:
            over = [x for x in pairs if x[1][0] < n.end and x[1][1] > n.start]
            if not over:  # no aligned word inside: keep it, empty, beside its neighbour
                t = at(n.start)
                return t, t + _equal_run(tgt, t, src, n.start, n.end - n.start, 1)
            ts = min(x[0][0] + (max(0, n.start - x[1][0]) if same[x] else 0) for x in over)
            te = max(x[0][1] - (max(0, x[1][1] - n.end) if same[x] else 0) for x in over)
            # unaligned edge chars inside the element (spaces, punctuation) go with it when equal
            first, last = min(x[1][0] for x in over), max(x[1][1] for x in over)
            ts -= _equal_run(tgt, ts, src, first, max(0, first - n.start), -1, words=False)
            te += _equal_run(tgt, te, src, last, max(0, n.end - last), 1, words=False)
            # a word's punctuation the element does not hold in the source stays outside it: "<a>Wiese</a>."
            # as "<a>meadow</a>.", where the target word aligned is "meadow." whole
            inner = src[n.start:n.end]
            te -= max(0, _edge_punctuation(tgt[ts:te], -1) - _edge_punctuation(inner, -1))
            ts += max(0, _edge_punctuation(tgt[ts:te], 1) - _edge_punctuation(inner, 1))
            return ts, te

        def ws(text: str, i: int) -> bool:
            return 0 <= i < len(text) and text[i] in _WS

        def mark(text: str) -> bool:
            """A footnote mark, a number, a symbol: at most one letter."""
            return sum(c.isalpha() for c in text) <= 1

        def unplaced(n: _Node) -> str | None:
            """The text of a mark the translation has nothing of, which goes in as written: it holds no
            aligned source word wholly (dropped, or glued into a word: `Hund<sup>1</sup>`, whose
            translation is the word's). None for anything else: an element of words the model dropped
            stays, empty, where they stood (written as they were, they would put the source language,
            or a word twice, into the translation)."""
            text = src[n.start:n.end]
            if n.anchor or not text.strip(_WS) or not mark(text):
                return None
            return None if any(n.start <= s0 and s1 <= n.end for _, (s0, s1) in pairs) else text

        def fits(n: _Node, a: int, b: int) -> bool:
            """Whether target chars a..b can be the element's own: not glued to a word on a side where
            the source sets it apart (the "a" of "apple" is no footnote mark "a")."""
            return ((0 < n.start and not ws(src, n.start - 1)) or a == 0 or not tgt[a - 1].isalnum()) and (
                (n.end < len(src) and not ws(src, n.end)) or b == len(tgt) or not tgt[b].isalnum())

        def translated_as(p: int, t: int) -> bool:
            """Whether target char t stands in a word aligned to the source word holding char p."""
            return any(t0 <= t < t1 and s0 <= p < s1 for (t0, t1), (s0, s1) in pairs)

        def as_written(n: _Node) -> str:
            """The element's markup and text as the source has them."""
            out, cur = [n.open], n.start
            for c in n.children:
                out += self._pieces[cur:c.start] + [c.open if c.anchor else as_written(c)]
                cur = c.end
            return "".join(out + self._pieces[cur:n.end] + [n.close])

        def emit(nodes: list[_Node], lo: int, hi: int) -> str:
            # source order and clamping keep the tag sequence (hence the tree) as in the source
            out, cur = [], lo
            for n in nodes:
                kept = unplaced(n)
                ts, te = (at(n.start),) * 2 if n.anchor or kept is not None else span(n)
                ts = min(max(ts, cur), hi)
                te = min(max(te, ts), hi)
                if kept is not None:  # the translation has the mark right there (the model kept "1"): wrap it
                    if tgt[ts - len(kept):ts] == kept and ts - len(kept) >= cur and fits(n, ts - len(kept), ts):
                        ts -= len(kept)
                    elif tgt[ts:ts + len(kept)] == kept and ts + len(kept) <= hi and fits(n, ts, ts + len(kept)):
                        te = ts + len(kept)
                    else:
                        kept = ""
                text = "".join(pieces[cur:ts])
                if kept == "":  # not in the translation: the element goes in as written, never lost
                    tag = as_written(n)
                else:
                    tag = n.open + (emit(n.children, ts, te) + n.close if not n.anchor else "")
                if n.anchor or kept == "":
                    # content set apart from the words around it in the source stays apart from the
                    # words around it here, side by side, even where the translation has one space
                    # for both sides, none at an end, or a word where the source had punctuation; content
                    # glued to a word stays glued only to that word's translation
                    if 0 < ts and not ws(tgt, ts - 1) and (ws(src, n.start - 1) or tgt[ts - 1].isalnum() and (
                            0 < n.start and src[n.start - 1].isalnum() and not translated_as(n.start - 1, ts - 1))):
                        tag = " " + tag
                    if ts < len(tgt) and not ws(tgt, ts) and (ws(src, n.end) or tgt[ts].isalnum() and not (
                            n.end < len(src) and src[n.end].isalnum() and translated_as(n.end, ts))):
                        tag += " "
                out += [text, tag]
                cur = te
            return "".join(out) + "".join(pieces[cur:hi])

        return emit(self._nodes, 0, len(tgt))


def _segment(source: str, items: list[_Event]) -> Segment | None:
    full, pieces, root = [], [], _Node(0)
    stack = [root]
    for it in items:
        raw = source[it.start:it.end]
        pos = len(pieces)
        if it.kind == "text":
            text, p = _decode(raw)
            full.append(text)
            pieces += p
        elif it.kind == "anchor":
            stack[-1].children.append(_Node(pos, pos, raw, anchor=True))
        elif it.kind == "open":
            stack[-1].children.append(_Node(pos, open=raw))
            stack.append(stack[-1].children[-1])
        else:
            node = stack.pop()
            node.end, node.close = pos, raw
    full_text = "".join(full)
    text = full_text.strip(_WS)
    if not text:
        return None
    lead = len(full_text) - len(full_text.lstrip(_WS))
    return Segment(text, bool(root.children), full_text, lead, pieces, root.children)


@dataclass
class _Attribute:
    """An attribute value parse_html took out of the source (a mark stands in its place)."""

    raw: str  # as written, its quotes included
    kind: str  # "text": translated (segment); "lang": the root's language
    segment: Segment | None = None  # its text, where it has a letter to translate


class HtmlDocument:
    def __init__(self, parts: list[str | Segment], attributes: list[_Attribute] | None = None):
        self._parts = parts
        self._attributes = attributes or []
        self._texts = [p for p in parts if isinstance(p, Segment)]
        # the text's segments, then the attribute values'
        self.segments: list[Segment] = self._texts + [a.segment for a in self._attributes if a.segment is not None]

    def rebuild(self, translations: list[AlignedText | str], lang: str | None = None) -> str:
        """The document with the segments' translations in place; lang: the translation's language (a BCP 47
        tag), written in the root element's lang where it has one."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        done = iter(t if isinstance(t, AlignedText) else AlignedText(t) for t in translations)
        out = "".join(p.render(next(done)) if isinstance(p, Segment) else p for p in self._parts)
        if not self._attributes:
            return out
        values = []
        for attribute in self._attributes:
            if attribute.kind == "lang":
                values.append(f'"{lang}"' if lang else attribute.raw)
            elif attribute.segment is None:
                values.append(attribute.raw)
            else:
                seg, text = attribute.segment, next(done).text
                whole = seg._full[:seg._lead] + text + seg._full[seg._lead + len(seg.text):]
                values.append(attribute.raw if whole == seg._full else _quoted(whole, attribute.raw[:1]))
        return _MARK.sub(lambda m: values[int(m.group(1))], out)


def _quoted(value: str, quote: str) -> str:
    """An attribute value written with the source's quotes (double where it had none and the value needs them)."""
    escaped = value.replace("&", "&amp;")
    if quote == "'":
        return "'" + escaped.replace("'", "&#39;") + "'"
    if quote != '"' and escaped and not re.search(r"""[\s"'=<>`]""", escaped):
        return escaped
    return '"' + escaped.replace('"', "&quot;") + '"'


def translatable_attributes(tag: str, attrs: dict[str, str]) -> list[str]:
    """The names of an element's attributes whose values are text for people (names in lower case, values
    decoded): the HTML standard's translatable attributes, and aria-label."""
    kind = lambda name: (attrs.get(name) or "").strip().lower()  # noqa: E731
    return [name for name in attrs
            if name in _TRANSLATABLE and (_TRANSLATABLE[name] is None or tag in _TRANSLATABLE[name])
            or name == "content" and tag == "meta" and (kind("name") or kind("property")) in _META_TEXT
            or name == "value" and tag == "input" and kind("type") in _BUTTONS]


def _attribute_values(source: str, events: list[_Event]) -> list[tuple[int, int, _Attribute]]:
    """Where the values of the attributes to translate stand (outside untouched elements), and the root's lang."""
    found: list[tuple[int, int, _Attribute]] = []
    root = True
    i = 0
    while i < len(events):
        ev = events[i]
        if ev.kind not in ("start", "startend"):
            i += 1
            continue
        if _untouched(ev):
            i = _region_end(events, i)[0]
            continue
        raw = source[ev.start:ev.end]
        raw = raw[:raw.rfind(">") + 1] or raw
        attrs: dict[str, re.Match] = {}
        for m in _ATTRIBUTE.finditer(raw):
            attrs.setdefault(m.group(1).lower(), m)

        def value(name: str) -> str:
            written = attrs[name].group(2) if name in attrs else ""
            return _html.unescape(written[1:-1] if written[:1] in "\"'" and len(written) > 1 else written)

        people = translatable_attributes(ev.tag, {name: value(name) for name in attrs})
        for name, m in attrs.items():
            if name in ("lang", "xml:lang") and root and ev.tag == "html":
                found.append((ev.start + m.start(2), ev.start + m.end(2), _Attribute(m.group(2), "lang")))
            elif name in people:
                full = value(name)
                text = full.strip(_WS)
                segment = None
                if any(c.isalpha() for c in text):
                    lead = len(full) - len(full.lstrip(_WS))
                    segment = Segment(text, False, full, lead, list(full))
                found.append((ev.start + m.start(2), ev.start + m.end(2), _Attribute(m.group(2), "text", segment)))
        root = False
        i += 1
    return found


def _flush(source: str, run: list[_Event], parts: list) -> None:
    """Turn a run of text and inline markup into segments; markup that does not nest cleanly inside
    the run (stray or missing end tags, misnesting) splits it and is copied where it stands."""
    stack, match, cut = [], {}, set()
    for k, it in enumerate(run):
        if it.kind == "open":
            stack.append(k)
        elif it.kind == "close":
            if stack and run[stack[-1]].tag == it.tag:
                match[stack.pop()] = k
            else:
                cut.update(stack + [k])
                stack.clear()
    cut.update(stack)

    def outside(it: _Event) -> bool:  # whitespace, a comment or an anchor at the edge of a segment
        return it.kind == "anchor" or it.kind == "text" and not source[it.start:it.end].strip(_WS)

    piece: list[_Event] = []
    for k, it in enumerate(run + [None]):
        if it is not None and k not in cut:
            piece.append(it)
            continue
        if piece:
            base = k - len(piece)
            a, b = 0, len(piece)
            # markup wrapping the whole text (or at its edges) stays outside: no alignment needed
            while a < b:
                if outside(piece[a]):
                    a += 1
                elif outside(piece[b - 1]):
                    b -= 1
                elif piece[a].kind == "open" and match.get(base + a) == base + b - 1:
                    a, b = a + 1, b - 1
                else:
                    break
            seg = _segment(source, piece[a:b]) if a < b else None
            if seg is None:
                parts.append(source[piece[0].start:piece[-1].end])
            else:
                parts += [source[piece[0].start:piece[a].start], seg,
                          source[piece[b - 1].end:piece[-1].end]]
        if it is not None:
            parts.append(source[it.start:it.end])
        piece = []


def parse_html(source: str) -> HtmlDocument:
    events = _events(source)
    # attribute values to translate are taken out of the source, a mark in each one's place, so that the
    # markup copied as written carries the marks to where rebuild writes the translated values
    found = _attribute_values(source, events) if "\ue000" not in source else []
    if found:
        masked, cur = [], 0
        for k, (start, end, _) in enumerate(found):
            masked += [source[cur:start], f"\ue000{k}\ue001"]
            cur = end
        source = "".join(masked) + source[cur:]
        events = _events(source)
    parts: list[str | Segment] = []
    run: list[_Event] = []

    def boundary(start: int, end: int) -> None:
        _flush(source, run, parts)
        run.clear()
        parts.append(source[start:end])

    i = 0
    while i < len(events):
        ev = events[i]
        inline = ev.tag in INLINE
        if ev.kind in ("start", "startend") and _untouched(ev):
            j, closed = _region_end(events, i)
            if closed and (inline or ev.tag in INLINE_VOID):
                run.append(_Event("anchor", ev.start, events[j - 1].end))
            else:
                boundary(ev.start, events[j - 1].end)
            i = j
            continue
        if ev.kind == "text":
            if run and run[-1].kind == "text" and run[-1].end == ev.start:
                run[-1].end = ev.end
            else:
                run.append(_Event("text", ev.start, ev.end))
        elif ev.kind == "other" or (ev.kind == "startend" and inline) or ev.tag in INLINE_VOID:
            run.append(_Event("anchor", ev.start, ev.end))
        elif inline and ev.kind in ("start", "end"):
            run.append(_Event("open" if ev.kind == "start" else "close", ev.start, ev.end, ev.tag))
        else:
            boundary(ev.start, ev.end)
        i += 1
    _flush(source, run, parts)
    return HtmlDocument([p for p in parts if p != ""], [attribute for _, _, attribute in found])
