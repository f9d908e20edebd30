"""Markdown (.md, .markdown), parsed with markdown-it-py (CommonMark, with GitHub's tables and strikethrough):
each paragraph, heading and table cell translated in place, and each HTML block as HTML (a README's centred
logo's alt text, a `<details>` summary; in a list or a quote, behind its markers); every other line kept as it was (code blocks, link reference
definitions, blank lines, a YAML front matter block).

A block's inline Markdown goes to the HTML path as inline HTML and comes back as Markdown: emphasis,
strong emphasis and strikethrough as `<i>`, `<b>`, `<s>` placed on the target words by the alignment and
written back with the source's own markers (`*` or `_`, `**` or `__`); a link as `<a>` (its title
translated, its destination kept); an image as `<img>` (its alt text and title translated); code spans,
autolinks, placeholders and URLs in the text (protected_spans.py) and GitHub's marks (a footnote's `[^1]`,
an alert's `[!NOTE]`, a task's `[ ]`) kept as written, out of what the model reads; inline HTML (`<kbd>`)
as itself. A paragraph comes back on one line (its line breaks were
soft: Markdown joins them) behind its first line's container markers (`> `, `- `, `1. `), a hard break
as a backslash at the end of a line; characters that Markdown would read as markup are escaped. A
reference link or image (`[text][ref]`, `[text][]`, `[text]`) comes back as a reference to the same
definition (`[translation][ref]`; a collapsed or shortcut one names its label, which was its text), so
the definitions at the end still serve and a translated README's links stay where its own were. A
table's rows are rebuilt from their own pipes (in a quote or a list behind its markers), and a table whose
pipes lined up in the source is padded to line up again at the translation's widths.
"""
from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser

from markdown_it import MarkdownIt
from markdown_it.helpers import parseLinkLabel
from markdown_it.rules_inline.image import image as image_rule
from markdown_it.rules_inline.link import link as link_rule

from nmt_serve.text import protected_spans
from nmt_serve.text.documents.document import Document, DocumentError
from nmt_serve.text.html_markup import parse_html

_ATTRIBUTE = "data-md"
_TAG = re.compile(r"<[^<>]*>")
_WRAPS = {"em_open": "i", "strong_open": "b", "s_open": "s"}
_FENCE = re.compile(r"^(---|\.\.\.)\s*$")
_HARD_BREAK = "\x00"  # stands for a hard break until the soft ones are folded
_LINE_BREAK = "\x01"  # a soft break kept: after an alert's kind, which GitHub reads on a line of its own
# brackets that mean something on GitHub though CommonMark reads them as text: a footnote's mark ([^1]), an
# alert's kind (> [!NOTE]), a task list item's box (- [ ] / - [x]); kept as written, never escaped
_GITHUB_MARKS = re.compile(r"\[\^[^\]\s]+\]|\[![A-Za-z]+\]")
_TASK_BOX = re.compile(r"\[[ xX]\](?=\s)")  # at a block's start


def _as_written(rule: Callable, skip: int) -> Callable:
    """markdown-it's link (or image) rule, which also notes on the token it makes how the source wrote a
    reference link (`[text][label]`, `[text][]`, `[text]`): meta["reference"], its label, so that it goes
    back as a reference to the same definition (a collapsed or shortcut one names its label: the text it
    was is not the translation). skip: the characters before the link text's bracket ("!" of an image)."""
    def parse(state, silent: bool) -> bool:
        start, first = state.pos, len(state.tokens)
        if not rule(state, silent):
            return False
        # the link's first token (the text before it may have gone in first)
        made = next((t for t in state.tokens[first:] if t.type in ("link_open", "image")), None)
        if not silent and made is not None and not state.src[start:state.pos].endswith(")"):
            end = parseLinkLabel(state, start + skip, True)  # the text's closing bracket (state.pos is kept)
            rest = state.src[end + 1:state.pos]  # "[label]", "[]" or nothing
            made.meta["reference"] = rest[1:-1] if len(rest) > 2 else state.src[start + skip + 1:end]
        return True
    return parse


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    # destinations as written (markdown-it percent-encodes them for HTML; they go back into Markdown)
    md.normalizeLink = lambda url: url
    md.normalizeLinkText = lambda url: url
    md.inline.ruler.at("link", _as_written(link_rule, 0))
    md.inline.ruler.at("image", _as_written(image_rule, 1))
    return md


@dataclass
class _Code:
    kind: str  # "wrap": open and close markers; "link": its destination; "image": its source; "verbatim": as written
    markup: str = ""
    target: str = ""
    title: str | None = None
    reference: str | None = None  # a reference link's or image's label: written back as a reference to it


def _title(title: str | None) -> str:
    return "" if title is None else ' "' + title.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _destination(url: str) -> str:
    return f"<{url}>" if re.search(r"[\s()<>]", url) else url


def _inline_html(children: list, codes: list[_Code]) -> str:
    """A block's inline tokens as HTML for the HTML path; each construct's Markdown in `codes`."""
    out: list[str] = []
    closing: list[str] = []
    skip_to = None  # an autolink's tokens after its opening: written with it
    alert = bool(children) and children[0].type == "text" and re.fullmatch(r"\[![A-Za-z]+\]", children[0].content.strip())
    for k, token in enumerate(children):
        if skip_to is not None:
            if token.type == skip_to:
                skip_to = None
            continue
        kind = token.type
        if kind == "text":
            # placeholders, URLs (protected_spans.py) and GitHub's marks: each a verbatim code, written back as it is
            spans = sorted([m.span() for m in protected_spans.PROTECTED.finditer(token.content)]
                           + [m.span() for m in _GITHUB_MARKS.finditer(token.content)]
                           + ([m.span()] if not out and (m := _TASK_BOX.match(token.content)) else []))
            cur = 0
            for start, end in spans:
                if start < cur:
                    continue
                text = token.content[start:end]
                codes.append(_Code("verbatim", text))
                out += [html.escape(token.content[cur:start], quote=False),
                        f'<span translate="no" {_ATTRIBUTE}="{len(codes) - 1}">{html.escape(text, quote=False)}</span>']
                cur = end
            out.append(html.escape(token.content[cur:], quote=False))
        elif kind == "softbreak" and alert and k == 1:
            codes.append(_Code("verbatim", _LINE_BREAK))
            out.append(f'<br {_ATTRIBUTE}="{len(codes) - 1}">')
        elif kind == "softbreak":
            out.append("\n")
        elif kind == "hardbreak":
            codes.append(_Code("verbatim", _HARD_BREAK))
            out.append(f'<br {_ATTRIBUTE}="{len(codes) - 1}">')
        elif kind == "code_inline":
            ticks = token.markup
            padded = token.content.startswith("`") or token.content.endswith("`")
            codes.append(_Code("verbatim", ticks + (" " if padded else "") + token.content + (" " if padded else "") + ticks))
            out.append(f'<code {_ATTRIBUTE}="{len(codes) - 1}">{html.escape(token.content, quote=False)}</code>')
        elif kind in _WRAPS:
            codes.append(_Code("wrap", token.markup))
            out.append(f'<{_WRAPS[kind]} {_ATTRIBUTE}="{len(codes) - 1}">')
            closing.append(f"</{_WRAPS[kind]}>")
        elif kind in ("em_close", "strong_close", "s_close", "link_close"):
            out.append(closing.pop() if closing else "")
        elif kind == "link_open" and token.markup in ("autolink", "linkify"):
            # as written: its text (an e-mail address's href has a mailto: the source does not)
            shown = children[k + 1].content if k + 1 < len(children) and children[k + 1].type == "text" else token.attrGet("href") or ""
            codes.append(_Code("verbatim", f"<{shown}>"))
            out.append(f'<span translate="no" {_ATTRIBUTE}="{len(codes) - 1}">{html.escape(shown)}</span>')
            skip_to = "link_close"
        elif kind == "link_open":
            title = token.attrGet("title")
            codes.append(_Code("link", target=token.attrGet("href") or "", title=title, reference=token.meta.get("reference")))
            title_attr = "" if title is None else f' title="{html.escape(title)}"'
            out.append(f'<a {_ATTRIBUTE}="{len(codes) - 1}"{title_attr}>')
            closing.append("</a>")
        elif kind == "image":
            title = token.attrGet("title")
            codes.append(_Code("image", target=token.attrGet("src") or "", title=title, reference=token.meta.get("reference")))
            title_attr = "" if title is None else f' title="{html.escape(title)}"'
            out.append(f'<img {_ATTRIBUTE}="{len(codes) - 1}" alt="{html.escape(token.content)}"{title_attr}>')
        elif kind == "html_inline":
            out.append(token.content)
        else:  # (none other in CommonMark's inline set)
            out.append(html.escape(token.content, quote=False))
    return "".join(out)


def _escaped(text: str, table: bool) -> str:
    """Text as Markdown that reads as this text: the characters that would be markup escaped."""
    text = re.sub(r"([\\`*\[\]<])", r"\\\1", text)
    text = re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", text)
    text = re.sub(r"&(?=#?\w+;)", "&amp;", text)
    return text.replace("|", "\\|") if table else text


def _line_starts(text: str) -> str:
    """Each line's start escaped where Markdown would read it as a block's marker (a heading, a quote, a list)."""
    def fix(line: str) -> str:
        if m := re.match(r"(\s*\d{1,9})([.)])(\s|$)", line):
            return m.group(1) + "\\" + line[m.end(1):]
        if m := re.match(r"(\s*)([#>+=-])", line):
            return m.group(1) + "\\" + line[m.end(1):]
        return line
    return "\n".join(fix(line) for line in text.split("\n"))


class _Markdown(HTMLParser):
    """A block's translated HTML written as Markdown. An emphasis or a link's text keeps no space at its
    edges (the HTML path may put the space between two words inside the element; `Die** [x]**` is no
    emphasis in Markdown, `Die **[x]**` is), and an emphasis the translation left empty goes (`****` would
    be text)."""

    def __init__(self, codes: list[_Code], table: bool):
        super().__init__(convert_charrefs=True)
        self.codes, self.table = codes, table
        self.out: list[str] = []
        self.closing: list[tuple[str, int | None]] = []  # per open element: its closing text, its opening's index
        self.skipping = 0

    def _open(self, markup: str, closing: str) -> None:
        self.out.append(markup)
        self.closing.append((closing, len(self.out) - 1))

    def _code(self, attrs) -> _Code | None:
        value = dict(attrs).get(_ATTRIBUTE)
        return self.codes[int(value)] if value is not None and value.isdigit() and int(value) < len(self.codes) else None

    def handle_starttag(self, tag, attrs):
        if self.skipping:
            self.skipping += tag not in ("img", "br")
            return
        code, given = self._code(attrs), dict(attrs)
        if code is None:
            self.out.append(self.get_starttag_text())  # the source's own inline HTML
            if tag not in ("img", "br", "wbr"):
                self.closing.append((f"</{tag}>", None))
        elif code.kind == "verbatim":
            if code.markup.startswith("`") and next((piece for piece in reversed(self.out) if piece), "").endswith("`"):
                self.out.append(" ")  # two code spans the translation put side by side: `a` `b`, not `a``b`
            # (in a table cell a pipe ends the cell even inside a code span: GitHub's tables take it escaped)
            self.out.append(code.markup.replace("|", "\\|") if self.table else code.markup)
            self.skipping = tag not in ("img", "br")
        elif code.kind == "wrap":
            self._open(code.markup, code.markup)
        elif code.kind == "link":
            self._open("[", f"][{code.reference}]" if code.reference is not None
                       else f"]({_destination(code.target)}{_title(given.get('title') if code.title is not None else None)})")
        elif code.kind == "image":
            alt = _escaped(given.get("alt") or "", self.table)
            self.out.append(f"![{alt}][{code.reference}]" if code.reference is not None
                            else f"![{alt}]({_destination(code.target)}{_title(given.get('title') if code.title is not None else None)})")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in ("img", "br", "wbr"):
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.skipping:
            self.skipping -= 1
            return
        if tag in ("img", "br", "wbr") or not self.closing:
            return
        closing, opened = self.closing.pop()
        if opened is None:
            self.out.append(closing)
            return
        inner = "".join(self.out[opened + 1:])
        if not inner.strip() and closing[:1] != "]":  # an emphasis of nothing: its markers go, its spaces stay
            self.out[opened] = ""
            return
        # spaces at the edges of its content move outside its markers
        lead, trail = inner[:len(inner) - len(inner.lstrip())], inner[len(inner.rstrip()):]
        self.out[opened + 1:] = [inner.strip()]
        self.out[opened] = lead + self.out[opened]
        self.out.append(closing + trail)

    def handle_data(self, data):
        if not self.skipping:
            self.out.append(_escaped(data, self.table))


def _as_markdown(translated_html: str, codes: list[_Code], table: bool) -> str:
    writer = _Markdown(codes, table)
    writer.feed(translated_html)
    writer.close()
    # a soft break the HTML path kept is a space (the block comes back on one line); a hard break a backslash
    # at a line's end
    text = re.sub(r"\s*\n\s*", " ", "".join(writer.out).strip())
    text = re.sub(f"[ \t]*{_LINE_BREAK}[ \t]*", "\n", re.sub(f"[ \t]*{_HARD_BREAK}[ \t]*", "\\\\\n", text))
    return _line_starts(text)


@dataclass
class _Block:
    """One paragraph, heading or table cell."""

    html: str
    text: str
    put: Callable[[str], None]  # its Markdown written into the document
    codes: list[_Code]
    table: bool

    def write(self, translated_html: str) -> None:
        if translated_html == self.html:  # not translated (a partial job's result): the lines as they were
            return
        self.put(_as_markdown(translated_html, self.codes, self.table))


@dataclass
class _HtmlBlock:
    """An HTML block, translated as HTML."""

    html: str
    text: str
    put: Callable[[str], None]

    def write(self, translated_html: str) -> None:
        if translated_html != self.html:
            self.put(translated_html)


_PIPE = re.compile(r"(?<!\\)\|")  # a cell's edge: a pipe not escaped


def _container(line: str) -> tuple[str, str]:
    """A table row's line as its container's markers (indentation, a quote's `>`) and the row itself."""
    prefix = re.match(r"[ \t]*(?:>[ \t]?)*[ \t]*", line).group()
    return prefix, line[len(prefix):]


def _width(text: str) -> int:
    """Columns a text takes in a monospaced font: wide (East Asian) characters two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _aligned(rows: list[str]) -> bool:
    """Whether a table's rows were padded so that their pipes line up (as formatters and editors write them)."""
    edges = [[_width(row[:m.start()]) for m in _PIPE.finditer(row)] for row in rows]
    return len(rows) > 1 and len(edges[0]) > 1 and all(e == edges[0] for e in edges)


def _align(rows: list[str]) -> list[str]:
    """A table's rows padded again so that their pipes line up: each column as wide as its widest cell (three
    at least), the delimiter row's dashes (its colons kept) filling the width as they filled it before."""
    split = [_PIPE.split(row) for row in rows]
    columns = max(len(cells) for cells in split)
    widths = [max([3] + [_width(cells[c].strip()) for k, cells in enumerate(split) if k != 1 and c < len(cells)])
              for c in range(columns)]
    out = []
    for k, cells in enumerate(split):
        padded = []
        for c, cell in enumerate(cells):
            text = cell.strip()
            if c in (0, len(cells) - 1) and not text:  # before a leading pipe, after a trailing one
                padded.append(cell)
            elif k == 1:  # the delimiter row: `---`, `:--`, `--:`, `:-:`, with spaces around or filling the cell
                spaced = cell.startswith(" ")
                left, right = text.startswith(":"), text.endswith(":") and len(text) > 1
                dashes = "-" * (widths[c] + (0 if spaced else 2) - left - right)
                marks = (":" if left else "") + dashes + (":" if right else "")
                padded.append(f" {marks} " if spaced else marks)
            else:
                padded.append(" " + text + " " * (widths[c] - _width(text)) + " ")
        out.append("|".join(padded))
    return out


def _front_matter(lines: list[str]) -> int:
    """How many lines a YAML front matter block at the start takes (0: none)."""
    if not lines or lines[0].rstrip() != "---":
        return 0
    for k in range(1, len(lines)):
        if _FENCE.match(lines[k]):
            return k + 1
    return 0


def read_markdown(data: bytes) -> Document:
    try:
        source = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    bom = "\ufeff" if data.startswith(b"\xef\xbb\xbf") else ""
    eol = "\r\n" if "\r\n" in source else "\n"
    lines = source.split(eol)
    skipped = _front_matter(lines)
    tokens = _parser().parse(eol.join(lines[skipped:]))
    replaced: dict[int, tuple[int, list[str]]] = {}  # first line -> (line after the last, the new lines)
    rows: dict[int, dict[int, str]] = {}  # a table row's line -> its translated cells' Markdown, by column
    units: list[_Block | _HtmlBlock] = []

    def prefix_of(line: str, content: str) -> str:
        """What stands before a block's content on its line: indentation and container markers (> , - , 1. )."""
        head = content.rstrip()
        return line[:len(line.rstrip()) - len(head)] if head and line.rstrip().endswith(head) else line[:len(line) - len(line.lstrip())]

    def paragraph(first: int, end: int, content: str) -> Callable[[str], None]:
        contents = content.split("\n")
        prefix = prefix_of(lines[first], contents[0])
        # a line after a break: behind the source's second line's markers, or the first's with a list's
        # marker as spaces (a quote's > stays)
        after = (prefix_of(lines[first + 1], contents[1]) if len(contents) > 1 and first + 1 < end
                 else re.sub(r"[-+*]|\d{1,9}[.)]", lambda m: " " * len(m.group()), prefix))

        def put(markdown: str) -> None:
            new = markdown.split("\n")
            replaced[first] = (end, [prefix + new[0]] + [after + line for line in new[1:]])
        return put

    def heading(first: int, content: str) -> Callable[[str], None]:
        line = lines[first]
        markers = re.match(r"\s*#{1,6}[ \t]*", line).end()
        start = line.find(content, markers)
        prefix, suffix = (line[:start], line[start + len(content):]) if start >= 0 else (line[:markers], "")

        def put(markdown: str) -> None:
            replaced[first] = (first + 1, [prefix + markdown.replace("\\\n", " ") + suffix])
        return put

    def cell(row: int, index: int) -> Callable[[str], None]:
        def put(markdown: str) -> None:
            rows.setdefault(row, {})[index] = markdown.replace("\\\n", " ")
        return put

    cells_of: dict[int, int] = {}  # a table row's line -> its cells so far
    tables: list[tuple[int, int]] = []  # each table's first line and the line after its last
    block = None
    for k, token in enumerate(tokens):
        if token.type == "table_open" and token.map is not None:
            tables.append((token.map[0] + skipped, token.map[1] + skipped))
        if token.type in ("paragraph_open", "heading_open", "th_open", "td_open"):
            block = token
        if token.type == "html_block" and token.map is not None:
            # HTML as it is (a centred logo's alt text, <details>' summary): a unit for the HTML path, its lines
            # replaced by the translated HTML, each behind the markers its source line had in a list or a quote
            segments = parse_html(token.content).segments
            if any(c.isalpha() for s in segments for c in s.text):
                first, end = token.map[0] + skipped, token.map[1] + skipped
                own = token.content.rstrip("\n").split("\n")
                prefixes = [prefix_of(lines[first + i], own[i]) if own[i].strip() else _container(lines[first + i])[0]
                            for i in range(min(len(own), end - first))] or [""]

                def put(markup: str, first=first, end=end, prefixes=prefixes) -> None:
                    new = markup.split("\n")
                    replaced[first] = (end, [prefixes[min(i, len(prefixes) - 1)] + line for i, line in enumerate(new)])
                units.append(_HtmlBlock(token.content.rstrip("\n"), " ".join(s.text for s in segments), put))
            continue
        if token.type != "inline" or token.map is None or block is None:
            continue
        first, end = token.map[0] + skipped, token.map[1] + skipped
        codes: list[_Code] = []
        table = block.type in ("th_open", "td_open")
        marked = _inline_html(token.children or [], codes).strip()
        text = html.unescape(_TAG.sub("", marked))
        if table:
            cells_of[first] = cells_of.get(first, 0) + 1
            put = cell(first, cells_of[first] - 1)
        elif block.type == "heading_open" and block.markup.startswith("#"):
            put = heading(first, token.content)
        else:  # a paragraph, or a setext heading's text (its underline, the line after, kept)
            put = paragraph(first, end, token.content)
        if any(c.isalpha() for c in text):
            units.append(_Block(marked, text, put, codes, table))

    def save() -> bytes:
        for row, cells in rows.items():
            # the row's cells as written, between its unescaped pipes (a pipe in a code span ends a cell too, as
            # GitHub reads it); the translated ones replaced, the others (and cells past the header's) kept
            prefix, body = _container(lines[row])
            pieces = _PIPE.split(body)
            lead = 1 if body.startswith("|") else 0
            for column, markdown in cells.items():
                if lead + column < len(pieces):
                    pieces[lead + column] = f" {markdown} "
            replaced[row] = (row + 1, [prefix + "|".join(pieces)])
        for first, end in tables:
            if _aligned([_container(line)[1] for line in lines[first:end]]):  # padded to columns: padded to the new widths
                now = [_container(replaced[i][1][0] if i in replaced else lines[i]) for i in range(first, end)]
                for i, ((prefix, _), line) in enumerate(zip(now, _align([body for _, body in now]))):
                    replaced[first + i] = (first + i + 1, [prefix + line])
        out, i = [], 0
        while i < len(lines):
            if i in replaced:
                end, new = replaced[i]
                out += new
                i = end
            else:
                out.append(lines[i])
                i += 1
        return (bom + eol.join(out)).encode("utf-8")

    return Document(units, save)
