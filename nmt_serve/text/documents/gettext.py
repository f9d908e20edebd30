"""Gettext catalogs (.po), read and written by polib: every entry that has no translation gets one, marked
`fuzzy` (a machine's guess, for a translator to review, as msgmerge marks its own); entries with a
translation (fuzzy ones too), obsolete ones and the header are kept as they are, except the header's
Language, which becomes the translation's, and its charset: the catalog is read in the charset its header
names and written in UTF-8.

A message is translated line by line (a catalog's line breaks are the program's: a usage text, a list),
each line's leading and trailing spaces kept, and its placeholders and markup-like spans (%s, {name},
`code`, URLs: text/protected_spans.py) kept out of what the model reads and put back as written. A plural
entry's first form is translated from msgid, the others from msgid_plural, as many as the catalog's
Plural-Forms says (two where it says nothing, as a template does). A translation the service flags as
doubtful (text/quality_flags.py) gets a translator comment that says which flags and what they mean.
"""
from __future__ import annotations

import codecs
import html
import re
from dataclasses import dataclass, field

import polib

from nmt_serve.text import protected_spans
from nmt_serve.text.documents.document import Document, DocumentError
from nmt_serve.text.quality_flags import review_note


@dataclass
class _Message:
    """One message to fill: its source's lines, and their translations as they come."""

    lines: list[str]
    put: object  # called with the message translated
    entry: polib.POEntry | None = None
    translated: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # its lines' quality flags

    def __post_init__(self) -> None:
        self.translated = list(self.lines)  # an empty line stays empty

    def done(self) -> str:
        return "\n".join(self.translated)


@dataclass
class _Line:
    message: _Message
    index: int
    html: str
    text: str

    def write(self, translated_html: str) -> None:
        line = self.message.lines[self.index]
        lead, trail = line[: len(line) - len(line.lstrip())], line[len(line.rstrip()):]
        self.message.translated[self.index] = lead + protected_spans.from_html(translated_html).strip() + trail


def _forms(catalog: polib.POFile) -> int:
    found = re.search(r"nplurals\s*=\s*(\d+)", catalog.metadata.get("Plural-Forms", ""))
    return max(1, int(found.group(1))) if found else 2


def read_po(data: bytes) -> Document:
    # the charset its header names (ISO-8859-2, KOI8-R, ... in older catalogs); UTF-8 where it names none
    # or a template's placeholder (charset=CHARSET)
    charset = polib.detect_encoding(data)
    utf8 = codecs.lookup(charset).name == "utf-8"
    try:
        text = data.decode("utf-8-sig" if utf8 else charset)
    except UnicodeDecodeError as exc:
        what = "UTF-8 text" if utf8 else f"{charset} text, the charset its header names"
        raise DocumentError(f"it is not {what} ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise DocumentError("it is empty")
    try:
        catalog = polib.pofile(text, wrapwidth=0)  # (its content, not a path: polib takes either)
    except (OSError, ValueError) as exc:
        raise DocumentError(f"it is not a gettext catalog ({exc})") from None
    if not len(catalog) and not catalog.metadata:
        raise DocumentError("it is not a gettext catalog (no entry in it)")

    messages: list[_Message] = []
    for entry in catalog:
        # a translation already there is kept, fuzzy or not: an outdated one is a translator's to mend
        if entry.obsolete or not entry.msgid or entry.msgstr or any(entry.msgstr_plural.values()):
            continue
        if entry.msgid_plural:
            entry.msgstr_plural = {}
            for form in range(_forms(catalog)):
                source = entry.msgid if form == 0 else entry.msgid_plural
                messages.append(_Message(source.split("\n"), lambda t, e=entry, f=form: e.msgstr_plural.__setitem__(f, t), entry))
        else:
            messages.append(_Message(entry.msgid.split("\n"), lambda t, e=entry: setattr(e, "msgstr", t), entry))
        if "fuzzy" not in entry.flags:
            entry.flags.append("fuzzy")

    units = []
    for message in messages:
        for k, line in enumerate(message.lines):
            if line.strip():
                marked = protected_spans.as_html(line.strip())
                units.append(_Line(message, k, marked if marked is not None else html.escape(line.strip(), quote=False),
                                   line.strip()))

    def save() -> bytes:
        noted: dict[int, tuple[polib.POEntry, list[str]]] = {}  # an entry's flags, over its messages (plural forms)
        for message in messages:
            message.put(message.done())
            if message.flags:
                entry, found = noted.setdefault(id(message.entry), (message.entry, []))
                found.extend(f for f in message.flags if f not in found)
        for entry, found in noted.values():
            # a translator comment (#), as a reviewer would leave one; the entry is fuzzy already
            note = review_note(found)
            entry.tcomment = f"{entry.tcomment}\n{note}" if entry.tcomment else note
        # written in UTF-8, whatever it was read in: a translation may hold characters the catalog's own
        # charset lacks (Czech into ISO-8859-1), and a template's header names none
        catalog.metadata["Content-Type"] = "text/plain; charset=UTF-8"
        catalog.metadata.setdefault("Content-Transfer-Encoding", "8bit")
        return catalog.__unicode__().encode("utf-8")

    def relabel(tag: str) -> None:
        catalog.metadata["Language"] = tag.replace("-", "_")  # gettext's locale names: pt_BR

    def annotate(flags: list[tuple[str, ...]]) -> None:
        for unit, found in zip(units, flags):
            unit.message.flags.extend(f for f in found if f not in unit.message.flags)

    return Document(units, save, relabel, None, annotate)
