"""What a plain text holds that no translation may change: URLs, e-mail addresses, placeholders and
code in backticks.

A model rewrites them as words ("https://a.com/?b=1&c=2" came out as "...?b=1 andc=2", a closing
backtick as an apostrophe). So a plain text that holds one is translated as HTML in which each of
them is an element marked `translate="no"`: the markup layer (html_markup.py) takes it out of the
sentence the model reads and puts it back, as written, after the target word aligned with the
source word before it, exactly as it treats `<code>` in a web page. The result is then plain text
again. A text without any of them is translated as before.
"""
from __future__ import annotations

import html
import re

# a URL ends before trailing punctuation, but keeps a closing bracket it opened itself ("wiki/Hund_(Tier)")
_URL = (r"(?:\b(?:https?|ftp)://|\bwww\.)(?:\([^\s()<>\"`]*\)|[^\s()<>\"`])*"
        r"(?:\([^\s()<>\"`]*\)|[^\s()<>\"`.,;:!?\]}'\u2019\u201d])")
_EMAIL = r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"
# printf (%s, %1$d, %(name)s, %.2f: no letter right after, so "10%ig" stays text), format ({0}, {name}),
# shell (${HOME}, $HOME: capitals only, so "$5" stays text), templates' ({{ name }}, {{{html}}}: Twig, Jinja,
# Mustache, i18next, Angular; as Symfony's, Rails' and Laravel's messages write them: %count%, %{count}, :count
# is left out, a colon before a word being common text)
_PLACEHOLDER = (r"\{\{\{[^{}\n]{1,80}\}\}\}|\{\{[^{}\n]{1,80}\}\}|%\{[A-Za-z_]\w*\}|%[A-Za-z_][\w.]*%"
                r"|%(?:\d+\$)?(?:\([A-Za-z_]\w*\))?[-+0#]*\d*(?:\.\d+)?[sdifux](?![A-Za-z])"
                r"|\{[A-Za-z_0-9]*\}|\$\{[A-Za-z_]\w*\}|\$[A-Z_][A-Z0-9_]*\b")
_CODE = r"`[^`\n]+`"
PROTECTED = re.compile("|".join(f"(?:{p})" for p in (_CODE, _URL, _EMAIL, _PLACEHOLDER)))
# every pattern above needs one of these: a text without any holds nothing to protect (most texts: 0.7 us
# a test sentence this way, 4.8 us through the pattern)
_NEEDED = ("`", "://", "www.", "@", "{", "%", "$")
_MARK_OPEN = '<span translate="no">'
_MARK_CLOSE = "</span>"


def as_html(text: str) -> str | None:
    """The text as HTML with each protected span in an element that is not translated; None when it
    holds none."""
    if not any(needed in text for needed in _NEEDED):
        return None
    spans = [m.span() for m in PROTECTED.finditer(text)]
    if not spans:
        return None
    out, cur = [], 0
    for start, end in spans:
        out += [html.escape(text[cur:start], quote=False), _MARK_OPEN, html.escape(text[start:end], quote=False), _MARK_CLOSE]
        cur = end
    out.append(html.escape(text[cur:], quote=False))
    return "".join(out)


def from_html(translated: str) -> str:
    """as_html's document translated, as plain text again: its marks removed, its text unescaped (the rest
    of the markup was the text itself, escaped)."""
    return html.unescape(translated.replace(_MARK_OPEN, "").replace(_MARK_CLOSE, ""))
