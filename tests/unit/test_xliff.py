"""XLIFF 1.2 and 2.x files translated in place (nmt_serve/text/documents/xliff.py), with the stand-in
translator of test_document_formats (every word upper-cased, inline tags placed by the HTML path)."""
from __future__ import annotations

import pytest
from lxml import etree
from test_document_formats import reversed_words, translator

from nmt_serve.text.documents import DocumentError, read_document, translate_document
from nmt_serve.text.documents.document import MAX_MARKUP_BYTES

NS_1 = "urn:oasis:names:tc:xliff:document:1.2"
NS_2 = "urn:oasis:names:tc:xliff:document:2.0"

XLIFF_1 = f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- made by a tool -->
<xliff version="1.2" xmlns="{NS_1}" xmlns:x="urn:example:tool">
  <file original="app.properties" source-language="de" datatype="plaintext">
    <header><note>kept</note></header>
    <body>
      <trans-unit id="1" resname="greeting" x:extra="kept">
        <source>Ein <g id="1" ctype="bold">roter</g> Hund<x id="2"/> rennt.</source>
        <note>a translator's note</note>
      </trans-unit>
      <trans-unit id="2">
        <source xml:space="preserve">  Datei %s nicht <bpt id="3">&lt;b&gt;</bpt>gefunden<ept id="3">&lt;/b&gt;</ept>. </source>
        <target xml:lang="en"/>
      </trans-unit>
      <trans-unit id="3"><source>Schon übersetzt</source><target state="final">Translated already</target></trans-unit>
      <group id="g" translate="no">
        <trans-unit id="4"><source>Nicht anfassen</source></trans-unit>
        <trans-unit id="5" translate="yes"><source>Doch übersetzen</source></trans-unit>
      </group>
      <trans-unit id="6"><source><x id="7"/> 42 <x id="8"/></source></trans-unit>
      <trans-unit id="7">
        <source>Zwei Sätze. Noch einer.</source>
        <seg-source><mrk mtype="seg" mid="1">Zwei Sätze.</mrk> <mrk mtype="seg" mid="2">Noch <mrk mtype="protected">ACME</mrk> einer.</mrk></seg-source>
      </trans-unit>
    </body>
  </file>
</xliff>
"""


def unit(root, uid: str, ns: str = NS_1):
    return next(u for u in root.iter(f"{{{ns}}}trans-unit", f"{{{ns}}}segment") if u.get("id") == uid)


def inner(element) -> str:
    """An element's content as written, without its own tags."""
    xml = etree.tostring(element, encoding="unicode", with_tail=False)
    return xml[xml.index(">") + 1:xml.rindex("<")] if not xml.endswith("/>") else ""


def test_an_xliff_1_file_gets_a_target_for_each_untranslated_unit_with_its_codes():
    document = read_document(XLIFF_1.encode(), "app.xlf")
    # codes as spans and anchors; a placeholder and a protected mark out of what the model reads; a unit of
    # codes and a number alone, a translated one and one marked translate="no" are not units
    assert document.texts == ['Ein <span data-xliff="0">roter</span> Hund<img data-xliff="1"> rennt.',
                              'Datei <span translate="no">%s</span> nicht <span data-xliff="0">gefunden</span>.',
                              "Doch übersetzen", "Zwei Sätze.",
                              'Noch <span translate="no" data-xliff="0">ACME</span> einer.']
    assert [u.text for u in document.units][1] == "Datei %s nicht gefunden."
    out = translate_document(XLIFF_1.encode(), "app.xlf", translator(), "en")
    root = etree.fromstring(out)
    first = unit(root, "1")
    target = first.find(f"{{{NS_1}}}target")
    assert inner(target) == 'EIN <g id="1" ctype="bold">ROTER</g> HUND<x id="2"/> RENNT.'
    # a machine's suggestion, for review; after the source, on a line of its own; the rest of the unit kept
    assert (target.get("state"), target.get("state-qualifier")) == ("needs-review-translation", "mt-suggestion")
    assert [etree.QName(c).localname for c in first] == ["source", "target", "note"]
    assert first.get("{urn:example:tool}extra") == "kept" and first.get("resname") == "greeting"
    assert b'</source>\n        <target state=' in out
    # an empty target filled where it stood, its attributes kept; the source's edge spaces kept; a pair of
    # native codes around a word stays around it
    second = unit(root, "2").find(f"{{{NS_1}}}target")
    assert second.get("{http://www.w3.org/XML/1998/namespace}lang") == "en"
    assert inner(second) == '  DATEI %s NICHT <bpt id="3">&lt;b&gt;</bpt>GEFUNDEN<ept id="3">&lt;/b&gt;</ept>. '
    assert unit(root, "3").find(f"{{{NS_1}}}target").text == "Translated already"
    assert unit(root, "4").find(f"{{{NS_1}}}target") is None and unit(root, "6").find(f"{{{NS_1}}}target") is None
    assert unit(root, "5").find(f"{{{NS_1}}}target").text == "DOCH ÜBERSETZEN"
    # segmented: a target of the same segments, each translated on its own
    assert inner(unit(root, "7").find(f"{{{NS_1}}}target")) == (
        '<mrk mtype="seg" mid="1">ZWEI SÄTZE.</mrk> <mrk mtype="seg" mid="2">NOCH <mrk mtype="protected">ACME</mrk> EINER.</mrk>')
    assert root.find(f"{{{NS_1}}}file").get("target-language") == "en"
    assert out.startswith(b"<?xml version='1.0' encoding='UTF-8'?>\n<!-- made by a tool -->")
    assert b"<header><note>kept</note></header>" in out


XLIFF_2 = f"""<xliff xmlns="{NS_2}" version="2.0" srcLang="de">
 <file id="f1">
  <unit id="u1">
   <segment id="s1"><source>Ein <pc id="1">roter</pc> Hund <ph id="2"/>rennt <sc id="3"/>schnell<ec startRef="3"/> <mrk id="m" translate="no">ACME</mrk>.</source></segment>
   <ignorable><source> </source></ignorable>
   <segment id="s2" state="final"><source>Ja</source><target>Yes</target></segment>
   <segment id="s3"><source>Ein <sc id="4"/>kleiner <pc id="5">Hund<ec startRef="4"/> bellt</pc>.</source><target/></segment>
  </unit>
  <unit id="u2" translate="no"><segment id="s4"><source>Nein</source></segment></unit>
 </file>
</xliff>"""


def test_an_xliff_2_file_gets_a_target_for_each_untranslated_segment():
    document = read_document(XLIFF_2.encode(), "app.xliff")
    # a begin and end code around a word: one span; a pair crossing another code's edge: two anchors
    assert document.texts == ['Ein <span data-xliff="0">roter</span> Hund <img data-xliff="1">rennt '
                              '<span data-xliff="2">schnell</span> <span translate="no" data-xliff="3">ACME</span>.',
                              'Ein <img data-xliff="0">kleiner <span data-xliff="1">Hund<img data-xliff="2"> bellt</span>.']
    root = etree.fromstring(document.write(translator()(document.texts), "en"))
    assert root.get("trgLang") == "en"
    s1 = unit(root, "s1", NS_2)
    assert inner(s1.find(f"{{{NS_2}}}target")) == (
        'EIN <pc id="1">ROTER</pc> HUND <ph id="2"/>RENNT <sc id="3"/>SCHNELL<ec startRef="3"/> <mrk id="m" translate="no">ACME</mrk>.')
    assert s1.get("state") == "translated"
    assert inner(unit(root, "s3", NS_2).find(f"{{{NS_2}}}target")) == (
        'EIN <sc id="4"/>KLEINER <pc id="5">HUND<ec startRef="4"/> BELLT</pc>.')
    assert unit(root, "s2", NS_2).find(f"{{{NS_2}}}target").text == "Yes" and unit(root, "s2", NS_2).get("state") == "final"
    assert unit(root, "s4", NS_2).find(f"{{{NS_2}}}target") is None


def test_a_doubtful_translation_gets_a_note_for_the_reviewer_in_its_unit():
    """1.2: a note after what the unit holds, from this service, on the target (a segmented unit's note says
    which segment); 2.x: in the unit's notes, which come before its segments."""
    document = read_document(XLIFF_1.encode(), "app.xlf")
    flags = [("low_confidence",), (), (), ("repetition",), ()]
    root = etree.fromstring(document.write(translator()(document.texts), "en", flags))
    first = unit(root, "1")
    assert [etree.QName(c).localname for c in first] == ["source", "target", "note", "note"]
    note = first.findall(f"{{{NS_1}}}note")[1]
    assert (note.get("from"), note.get("annotates")) == ("nmt-serve", "target")
    assert note.text.startswith("Machine translation flagged: low_confidence (the model was unsure")
    assert unit(root, "2").find(f"{{{NS_1}}}note") is None
    [segmented] = unit(root, "7").findall(f"{{{NS_1}}}note")
    assert segmented.text.startswith('"Zwei Sätze.": Machine translation flagged: repetition (')
    document = read_document(XLIFF_2.encode(), "app.xliff")
    root = etree.fromstring(document.write(translator()(document.texts), "en", [(), ("constraint_unmet", "long")]))
    u1 = root.find(f".//{{{NS_2}}}unit")
    assert etree.QName(u1[0]).localname == "notes"
    [note] = u1[0]
    assert (note.get("category"), note.get("appliesTo")) == ("nmt-serve", "target")
    assert note.text.startswith('"Ein kleiner Hund bellt.": Machine translation flagged: constraint_unmet (') and "; long (" in note.text
    # a unit's own notes kept, ours after them
    document = read_document(XLIFF_2.replace('<unit id="u1">', '<unit id="u1"><notes><note>mine</note></notes>').encode(), "a.xliff")
    root = etree.fromstring(document.write(translator()(document.texts), "en", [("repetition",), ()]))
    notes = root.find(f".//{{{NS_2}}}notes")
    assert [n.text[:20] for n in notes] == ["mine", '"Ein roter Hund renn'] and len(root.findall(f".//{{{NS_2}}}notes")) == 1


def test_codes_follow_their_words_when_the_translation_reorders_them():
    data = f'<xliff xmlns="{NS_2}" version="2.1" srcLang="de"><file id="f"><unit id="u"><segment id="s">' \
           f'<source><pc id="1">Rote</pc> Hunde <ph id="2"/>rennen</source></segment></unit></file></xliff>'
    out = etree.fromstring(translate_document(data.encode(), "a.xlf", translator(reversed_words), "en"))
    target = inner(out.find(f".//{{{NS_2}}}target"))
    assert target.startswith("RENNEN HUNDE <pc id=\"1\">ROTE</pc>") and target.count('<ph id="2"/>') == 1, target


def test_a_partial_result_leaves_the_segments_not_translated_yet_without_a_target():
    document = read_document(XLIFF_2.encode(), "app.xliff")
    # a job's result before it is done: its first text translated, the other as it was, no language named
    root = etree.fromstring(document.write([translator()(document.texts[:1])[0], document.texts[1]]))
    assert unit(root, "s1", NS_2).find(f"{{{NS_2}}}target") is not None
    assert not len(unit(root, "s3", NS_2).find(f"{{{NS_2}}}target")) and unit(root, "s3", NS_2).get("state") is None


def test_an_external_entity_is_not_read():
    data = (f'<?xml version="1.0"?><!DOCTYPE xliff [<!ENTITY secret SYSTEM "file:///etc/hostname">]>'
            f'<xliff xmlns="{NS_1}" version="1.2"><file><body><trans-unit id="1"><source>Ein &secret; Hund</source>'
            f'</trans-unit></body></file></xliff>').encode()
    document = read_document(data, "a.xlf")
    assert document.texts == ['Ein <img data-xliff="0"> Hund']
    assert b"&secret;" in document.write(["A <img data-xliff=\"0\"> dog"], "en")


@pytest.mark.parametrize("data, reason", [
    (b"<xliff version='1.2'><file>", "not well-formed XML"),
    (b"<html><body>Hallo</body></html>", "not XLIFF"),
    (b"<xliff version='3.0'/>", "version"),
    (b" " * (MAX_MARKUP_BYTES + 1), "split the file")])
def test_a_file_that_is_no_xliff_is_refused_saying_why(data, reason):
    with pytest.raises(DocumentError, match=reason):
        read_document(data, "a.xliff")
