"""Character references in model output (nmt_serve/text/entities.py), decoded once, and what the HTML layer
makes of the decoded output: escaped once."""
from __future__ import annotations

from nmt_serve.text.entities import unescape_output
from nmt_serve.text.html_markup import parse_html


def test_references_the_model_wrote_are_decoded_once():
    assert unescape_output("Tom & Jerry laufen.", "Tom &amp; Jerry are running.") == "Tom & Jerry are running."
    assert unescape_output("5 < 6", "5 &lt; 6 &gt; 4 &quot;x&quot; &#39;y&#x27;") == "5 < 6 > 4 \"x\" 'y'"
    # once: a reference to a reference stays one level down
    assert unescape_output("a", "&amp;amp; &amp;lt;") == "&amp; &lt;"
    assert unescape_output("a", "no references here") == "no references here"


def test_the_users_own_references_and_bare_ampersands_stay():
    # a text about HTML: the reference is in the source as written, so the model's copy of it is kept
    assert unescape_output("Schreib &amp; für &.", "Write &amp; for &amp;.") == "Write &amp; for &amp;."
    assert unescape_output("AT&T und M&M", "AT&T and M&M") == "AT&T and M&M"  # incomplete: no ";"
    assert unescape_output("x", "&notanentity; &c") == "&notanentity; &c"  # unknown names are left as written


def test_html_format_comes_back_escaped_once():
    document = parse_html("<p>5 &lt; 6 &amp; 7</p>")
    [segment] = document.segments
    assert segment.text == "5 < 6 & 7"  # what the model is given
    model_output = "5 &lt; 6 &amp; 7"  # what a model trained on escaped captions writes back
    out = document.rebuild([unescape_output(segment.text, model_output)])
    assert out == "<p>5 &lt; 6 &amp; 7</p>"
    assert "&amp;amp;" not in out and "&amp;lt;" not in out
    # a new word with "&" in it (not in the source): escaped once by the markup layer
    assert document.rebuild([unescape_output(segment.text, "5 &lt; 6 and Tom &amp; Jerry")]) == "<p>5 &lt; 6 and Tom &amp; Jerry</p>"
