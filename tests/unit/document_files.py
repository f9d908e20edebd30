"""Small OpenDocument and EPUB files for the document tests, written as the minimal XML their
formats need (the unit tests and the API tests share them)."""
from __future__ import annotations

import io
import zipfile

from lxml import etree

ODF_NS = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
          'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
          'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0" '
          'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0" xmlns:dc="http://purl.org/dc/elements/1.1/" '
          'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0" office:version="1.3"')
STYLES = ('<office:automatic-styles><style:style style:name="Bold" style:family="text"><style:text-properties fo:font-weight="bold"/>'
          '</style:style><style:style style:name="Italic" style:family="text"><style:text-properties fo:font-style="italic"/></style:style>'
          '</office:automatic-styles>')


def odf(mimetype: str, content: str, styles: str = "") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), mimetype)  # first and stored, as ODF asks
        z.writestr("content.xml", f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {ODF_NS}>{STYLES}{content}</office:document-content>')
        z.writestr("styles.xml", f'<?xml version="1.0" encoding="UTF-8"?><office:document-styles {ODF_NS}>{styles}</office:document-styles>')
        z.writestr("META-INF/manifest.xml", '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"/>')
    return out.getvalue()


SENTENCE = ('Ein <text:span text:style-name="Bold">brauner Hund</text:span> rennt<text:s/>über die '
            '<text:span text:style-name="Italic">grüne Wiese</text:span> am Haus.')


def build_odt() -> bytes:
    body = ('<office:body><office:text>'
            f'<text:h text:outline-level="1">Ein Bericht</text:h><text:p>{SENTENCE}'
            '<text:note text:id="n1" text:note-class="footnote"><text:note-citation>1</text:note-citation>'
            '<text:note-body><text:p>Eine Fußnote hier.</text:p></text:note-body></text:note></text:p>'
            '<text:p><office:annotation><dc:creator>Anna</dc:creator><text:p>Ein Kommentar</text:p></office:annotation>Zwei Kinder.</text:p>'
            '<table:table><table:table-column table:number-columns-repeated="2"/>'
            '<table:table-row><table:table-cell><text:p>zelle eins</text:p></table:table-cell><table:table-cell><text:p>zelle zwei</text:p></table:table-cell></table:table-row>'
            '</table:table></office:text></office:body>')
    styles = ('<office:master-styles><style:master-page style:name="Standard"><style:header><text:p>Kopfzeile hier</text:p></style:header>'
              '<style:footer><text:p>Seite <text:page-number>1</text:page-number> von allen</text:p></style:footer></style:master-page></office:master-styles>')
    return odf("application/vnd.oasis.opendocument.text", body, styles)


def odf_texts(data: bytes, member: str = "content.xml") -> list[str]:
    root = etree.fromstring(zipfile.ZipFile(io.BytesIO(data)).read(member))
    return [t for t in root.xpath("//text()") if t.strip()]


def build_odp() -> bytes:
    frame = '<draw:frame><draw:text-box><text:p>{}</text:p></draw:text-box></draw:frame>'
    body = ('<office:body><office:presentation><draw:page draw:name="s1">' + frame.format(SENTENCE)
            + '<draw:frame><table:table><table:table-row><table:table-cell><text:p>Zwei Kinder spielen.</text:p></table:table-cell>'
            '</table:table-row></table:table></draw:frame>'
            '<presentation:notes>' + frame.format("Eine Frau liest ein Buch.") + '</presentation:notes>'
            '</draw:page></office:presentation></office:body>')
    return odf("application/vnd.oasis.opendocument.presentation", body)


def build_epub() -> bytes:
    chapter = ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml" '
               'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>Erstes Kapitel</title><style>p { margin: 0 }</style></head>'
               '<body><h1>Erstes Kapitel</h1><p>Ein <b>brauner Hund</b> rennt über die <i>grüne Wiese</i> am Haus.'
               '<a epub:type="noteref" href="#n1">1</a></p>'
               '<div>Zwei Kinder spielen.<p>Ein Mann lacht.</p>Eine Frau liest.</div>'
               '<pre>nicht übersetzen</pre><aside epub:type="footnote" id="n1"><p>Eine Fußnote hier.</p></aside></body></html>')
    opf = ('<?xml version="1.0" encoding="utf-8"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
           '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">x</dc:identifier><dc:title>Buch</dc:title>'
           '<dc:language>de</dc:language></metadata><manifest>'
           '<item id="c1" href="text/kapitel%201.xhtml" media-type="application/xhtml+xml"/>'
           '<item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/></manifest>'
           '<spine toc="ncx"><itemref idref="c1"/></spine></package>')
    ncx = ('<?xml version="1.0" encoding="utf-8"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">'
           '<docTitle><text>Ein Buch</text></docTitle><navMap><navPoint id="p1"><navLabel><text>Erstes Kapitel</text></navLabel>'
           '<content src="text/kapitel%201.xhtml"/></navPoint></navMap></ncx>')
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        z.writestr("META-INF/container.xml", '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                                             '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>')
        z.writestr("OEBPS/content.opf", opf)
        z.writestr("OEBPS/text/kapitel 1.xhtml", chapter)
        z.writestr("OEBPS/toc.ncx", ncx)
    return out.getvalue()
