"""What a translated string carries besides words: character entities, markup tags, keyboard
accelerators and placeholders, and how the corpus treats each of them (the same way on both sides).

- Entities (`&amp;`, `&#233;`) are unescaped. Only the complete form with its semicolon counts: HTML's
  legacy forms without one would turn an accelerator `&notice` into `¬ice`.
- Markup tags (`<b>`, `<a href="...">`, `<br/>`) are compared by name, then removed: a pair whose
  tags differ is dropped, the text between them is kept.
- Accelerators (GTK `_Save`, Qt/KDE `&File`, LibreOffice `~Open`) mark the letter of a keyboard
  shortcut; they are removed from both sides (a translation often puts its own on another letter, or
  none). A marker counts as one when it appears exactly once before a letter or digit in the string,
  so `file_name_list` is left alone; `&&` (a literal `&` in Qt) becomes `&`.
- Placeholders (`%s`, `%1$d`, `%(name)s`, `{0}`, `{name}`, `$HOME`) stay in the text for the model to
  copy; a pair whose placeholders differ (as multisets, `%2$s` counted as `%s`) is dropped. printf's
  space flag is not read: `50 % de` is French typography, not a `% d` conversion.
"""
from __future__ import annotations

import html
import re
from collections import Counter

_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
_TAG = re.compile(r"</?([A-Za-z][A-Za-z0-9]*)(?:\s[^<>]*)?/?>")
_PLACEHOLDER = re.compile(
    r"%(?:[0-9]+\$)?[-+#0]*(?:\*|[0-9]+)?(?:\.(?:\*|[0-9]+))?(?:hh|h|ll|l|L|q|j|z|t|I64|I32)?[diouxXeEfFgGcsSpaA@]"
    r"|%\([A-Za-z_][A-Za-z0-9_]*\)[-+ #0]*[0-9]*(?:\.[0-9]+)?[diouxXeEfFgGcrsa]"
    r"|\{[A-Za-z0-9_]*(?::[^{}]*)?\}"
    r"|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
_POSITION = re.compile(r"^%[0-9]+\$")
ACCELERATOR_MARKERS = "_&~"
_WHITESPACE = re.compile(r"\s+")


def unescape_entities(text: str) -> str:
    """`&amp;` -> `&`, `&#233;` -> `é`; an `&` not starting a complete entity stays as it is."""
    if "&" not in text:
        return text
    return _ENTITY.sub(lambda m: html.unescape(m.group()), text)


def tags(text: str) -> Counter:
    """The markup tags of a text by name and kind ("b", "/b", "br"), as a multiset."""
    return Counter(("/" if m.group().startswith("</") else "") + m.group(1).lower() for m in _TAG.finditer(text))


def strip_tags(text: str) -> str:
    return collapse_whitespace(_TAG.sub(" ", text)) if "<" in text else text


def placeholders(text: str) -> Counter:
    """The placeholders of a text as a multiset, positional printf specs counted without their position."""
    return Counter(_POSITION.sub("%", m.group()) for m in _PLACEHOLDER.finditer(text))


def _accelerator(marker: str) -> re.Pattern:
    if marker == "&":  # not an entity's ampersand
        return re.compile(r"&(?!&)(?!#?[A-Za-z0-9]+;)(?=[^\W_])")
    return re.compile(re.escape(marker) + r"(?=[^\W_])")


_ACCELERATORS = {m: _accelerator(m) for m in ACCELERATOR_MARKERS}


def remove_accelerator(text: str) -> str:
    """The text without its keyboard accelerator markers (each kind removed only where it occurs once)."""
    for marker, pattern in _ACCELERATORS.items():
        if marker in text and len(pattern.findall(text)) == 1:
            text = pattern.sub("", text)
    return text.replace("&&", "&")


def collapse_whitespace(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()
