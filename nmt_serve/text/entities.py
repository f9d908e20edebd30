"""Character references that a model writes into its output, decoded once.

Multi30k's English side holds `&amp;` where its captions had `&`, so the shipped models learned to
write "Tom &amp; Jerry" for "Tom & Jerry": in text format that `&amp;` is wrong, and in HTML format the
markup layer escapes the `&` of it again ("&amp;amp;"). The output is therefore decoded once, as
html.unescape decodes, before it is put back into a text or a document; a reference that the source
sentence itself holds as written (a text about HTML: "write &amp; for &") is the user's, and stays, as is
one in a glossary target that applies to the sentence (service/pipeline.py passes both).
"""
from __future__ import annotations

import html
import re
from html.entities import html5

# complete references only (with their ";"): "AT&T" or "&c" in a text is left alone
REFERENCE = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


def unescape_output(source: str, output: str) -> str:
    """The model's output with the character references it wrote decoded, once; those that appear as
    written in the source are kept."""
    if "&" not in output:
        return output
    kept = set(REFERENCE.findall(source))
    return REFERENCE.sub(lambda m: m.group() if m.group() in kept else _decoded(m.group()), output)


def _decoded(reference: str) -> str:
    if reference[1] == "#":
        return html.unescape(reference)
    # a whole name only: html.unescape would read "&notanentity;" as "&not" + "anentity;"
    return html5.get(reference[1:], reference)
