"""The corpus builder on tiny fixtures written here, with no network: DDTP descriptions aligned by
md5, catalogs read from .mo files (and from a .deb built here), held-out splits, rule counts, the
files and the manifest, and a second build that writes the same bytes."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import polib
import pytest
from conftest import build_deb, deb_tree

from nmt_serve.training.corpus import ddtp
from nmt_serve.training.corpus.apt import Apt, DebFile
from nmt_serve.training.corpus.build import BuildConfig, _each_package, build
from nmt_serve.training.corpus.catalogs import PackageCatalogs, catalog_segments, group_of, read_catalog
from nmt_serve.training.corpus.filters import Counts, LanguageCheck
from nmt_serve.training.corpus.heldout import is_held_out
from nmt_serve.training.corpus.segments import Collector

A, B, C, D, E = ("a" * 32, "b" * 32, "c" * 32, "d" * 32, "e" * 32)
assert is_held_out("less") and is_held_out("pkg32") and not any(is_held_out(p) for p in ("hello", "widget", "pkg1", "pkg2"))

TRANSLATIONS = {
    "en": [
        ("hello", A, "example package based on GNU hello\n"
                     " The GNU hello program produces a familiar, friendly greeting. It allows\n"
                     " non-programmers to use a classic computer science tool.\n .\n Features:\n"
                     "  * greets the world\n  * is friendly and kind"),
        ("less", B, "pager program similar to more\n This package provides a file pager. It is like more,\n but better."),
        ("widget", C, "a tool with two paragraphs\n It has one paragraph.\n .\n And a second one."),
        ("pkg1", D, "shared helper files"),
        ("pkg32", D, "shared helper files"),
        ("pkg2", E, "pager program similar to more\n A different long text about paging files."),
    ],
    "de": [
        ("hello", A, "Beispielpaket, das auf GNU hello basiert\n"
                     " Das Programm GNU hello erzeugt einen vertrauten, freundlichen Gruß. Es erlaubt\n"
                     " Nicht-Programmierern, ein klassisches Werkzeug der Informatik zu benutzen.\n .\n"
                     " Funktionen:\n  * grüßt die Welt\n  * ist freundlich und nett"),
        ("less", B, "Pager-Programm ähnlich wie more\n Dieses Paket stellt einen Datei-Pager bereit. Es ist wie\n"
                    " more, aber besser."),
        ("widget", C, "ein Werkzeug mit zwei Absätzen\n Es hat einen Absatz und einen zweiten."),
        ("pkg1", D, "gemeinsame Hilfsdateien"),
        ("pkg2", E, "Pager-Programm ähnlich wie more\n Ein anderer langer Text über das Blättern in Dateien."),
    ],
    "fr": [
        ("hello", A, "paquet d'exemple basé sur GNU hello\n"
                     " Le programme GNU hello produit un salut familier et amical. Il permet aux\n"
                     " non-programmeurs d'utiliser un outil classique de l'informatique.\n .\n"
                     " Fonctionnalités :\n  * salue le monde\n  * est amical et gentil"),
    ],
}


def write_translation(path: Path, language: str, stanzas) -> None:
    path.write_text("".join(f"Package: {p}\nDescription-md5: {md5}\nDescription-{language}: {text}\n\n"
                            for p, md5, text in stanzas), encoding="utf-8")


def fake_lists(cache: Path) -> None:
    """What `apt-get update` would leave in the private tree, so that the build downloads nothing."""
    lists = cache / "apt" / "state" / "lists"
    lists.mkdir(parents=True)
    (lists / "deb.debian.org_debian_dists_bookworm_InRelease").write_text(
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\nOrigin: Debian\nSuite: stable\nVersion: 12.99\n"
        "Codename: bookworm\nDate: Sat, 10 May 2025 09:00:00 UTC\nSHA256:\n 0123 10 main/i18n/Translation-en\n")
    for language, stanzas in TRANSLATIONS.items():
        write_translation(lists / f"deb.debian.org_debian_dists_bookworm_main_i18n_Translation-{language}", language, stanzas)


def test_descriptions_parse_into_short_paragraphs_and_items(tmp_path):
    write_translation(tmp_path / "Translation-en", "en", TRANSLATIONS["en"])
    found = ddtp.read_translation(tmp_path / "Translation-en", "en")
    assert sorted(found) == [A, B, C, D, E]
    hello = found[A]
    assert hello.short == "example package based on GNU hello"
    assert hello.paragraphs == (("The GNU hello program produces a familiar, friendly greeting. It allows "
                                 "non-programmers to use a classic computer science tool.",),
                                ("Features:", "greets the world", "is friendly and kind"))
    assert hello.shape == (1, 3)
    assert found[D].packages == ("pkg1", "pkg32") and found[D].paragraphs == ()
    french = ddtp.parse_description(A, ["x"], "court\n Fonctionnalités :\n  –\xa0première, sur\n    deux lignes ;\n  –\xa0seconde.")
    assert french.paragraphs == (("Fonctionnalités :", "première, sur deux lignes ;", "seconde."),)


def test_build_aligns_by_md5_holds_out_and_counts_every_rule(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "corpus"
    fake_lists(cache)
    config = BuildConfig(output=out, cache=cache, releases=["bookworm"], packages=(), dictionaries=(), help_packages=(),
                         language_filter=False)
    manifest = build(config)

    counts = manifest["counts"]
    # hello: short + 2 sentences + 3 items; tool: short (its long part is shaped differently); pkg2: its
    # long sentence (its short one repeats the held-out less's)
    assert counts["train"]["en-de"] == {"pairs": 8, "ddtp-long": 6, "ddtp-short": 2}
    assert counts["eval"]["en-de"] == {"pairs": 4, "ddtp-long": 2, "ddtp-short": 2}  # less, and pkg1 shared with pkg32
    assert counts["eval-short"]["en-de"]["pairs"] == 2
    assert counts["train"]["en-fr"]["pairs"] == 6 and counts["train"]["de-fr"]["pairs"] == 6
    assert counts["train"]["en-cs"]["pairs"] == 0
    rules = manifest["rules"]
    assert rules["structure_mismatch"]["dropped"] == {"train en-de": 1}
    assert rules["in_eval"]["dropped"] == {"train en-de": 1}
    assert manifest["sources"]["ddtp"]["paired_descriptions"]["en-de"] == {"eval": 2, "train": 3}
    assert manifest["archive"]["releases"] == [{"codename": "bookworm", "suite": "stable", "version": "12.99",
                                                "date": "Sat, 10 May 2025 09:00:00 UTC"}]

    en = (out / "train.en-de.en").read_text().splitlines()
    de = (out / "train.en-de.de").read_text().splitlines()
    assert en[:3] == ["example package based on GNU hello", "The GNU hello program produces a familiar, friendly greeting.",
                      "It allows non-programmers to use a classic computer science tool."]
    assert de[:3] == ["Beispielpaket, das auf GNU hello basiert",
                      "Das Programm GNU hello erzeugt einen vertrauten, freundlichen Gruß.",
                      "Es erlaubt Nicht-Programmierern, ein klassisches Werkzeug der Informatik zu benutzen."]
    assert "pager program similar to more" not in en  # held out, also where another package repeats it
    assert (out / "eval-short.en-de.en").read_text().splitlines() == ["pager program similar to more", "shared helper files"]
    assert (out / "train.en-de.origin").read_text().splitlines()[0] == "ddtp-short\thello\tbookworm"
    assert not (out / "train.en-cs.en").exists()
    for name, facts in manifest["files"].items():
        assert len((out / name).read_text().splitlines()) == facts["lines"]
    assert manifest["files"]["train.en-de.de"]["lines"] == 8

    first = (out / "manifest.json").read_bytes()
    build(config)  # everything sorted: a rebuild writes the same bytes
    assert (out / "manifest.json").read_bytes() == first
    assert json.loads(first)["files"] == manifest["files"]


def test_apt_state_stays_in_the_private_tree(tmp_path):
    apt = Apt(tmp_path, ["bookworm"], ["en", "de"])
    options = apt.options()
    settings = dict(o.split("=", 1) for o in options[1::2])
    assert settings["Acquire::Languages"] == "en,de"
    for key in ("Dir::State", "Dir::State::Lists", "Dir::State::status", "Dir::Cache", "Dir::Etc::SourceList",
                "Dir::Etc::SourceParts", "Dir::Etc::Preferences", "Dir::Etc::PreferencesParts"):
        assert settings[key].startswith(str(tmp_path.resolve())), key
    assert not apt.has_lists()


def write_catalog(path: Path, entries: list[dict]) -> None:
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
    for entry in entries:
        po.append(polib.POEntry(**entry))
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save_as_mofile(str(path)) if path.suffix == ".mo" else po.save(str(path))


def test_catalogs_read_singular_forms_and_skip_fuzzy_entries(tmp_path):
    entries = [{"msgid": "_Open", "msgstr": "Ö_ffnen"},
               {"msgid": "%d file", "msgid_plural": "%d files", "msgstr_plural": {0: "%d Datei", 1: "%d Dateien"}},
               {"msgid": "Close", "msgstr": "Schließen", "msgctxt": "menu"},
               {"msgid": "Untranslated", "msgstr": ""},
               {"msgid": "Doubtful", "msgstr": "Zweifelhaft", "flags": ["fuzzy"]}]
    write_catalog(tmp_path / "de.po", entries)
    write_catalog(tmp_path / "de.mo", [e for e in entries if "flags" not in e])
    expected = {("", "_Open"): "Ö_ffnen", ("", "%d file"): "%d Datei", ("menu", "Close"): "Schließen"}
    assert read_catalog(tmp_path / "de.po") == expected
    assert read_catalog(tmp_path / "de.mo") == expected


def test_catalog_segments_clean_accelerators_pair_languages_and_hold_out():
    assert group_of("libreoffice-l10n-de", ["en", "de"]) == "libreoffice-l10n"
    assert group_of("gnupg-l10n", ["en", "de"]) == "gnupg-l10n"
    catalogs = [
        PackageCatalogs("libreoffice-l10n-de", "1", ("MPL-2.0",), {"de": {
            ("sw", "", "~Open File"): "Datei ~öffnen", ("sw", "", "Delete %s?"): "Löschen?",
            ("sw", "", "Save the document.\nClose it."): "Dokument speichern.\nSchließen."}}),
        PackageCatalogs("libreoffice-l10n-fr", "1", ("MPL-2.0",), {"fr": {
            ("sw", "", "~Open File"): "~Ouvrir le fichier"}}),
        PackageCatalogs("less", "1", ("GPL-3",), {"de": {("less", "", "Pattern not found"): "Muster nicht gefunden"}}),
    ]
    collector = Collector(Counts())
    catalog_segments(catalogs, ["en", "de", "fr"], [("en", "de"), ("en", "fr"), ("de", "fr")], "bookworm", collector)
    got = Counter((s.split, s.pair, s.a, s.b) for s in collector.segments)
    assert got == Counter({
        ("train", ("en", "de"), "Open File", "Datei öffnen"): 1,
        ("train", ("en", "de"), "Save the document.", "Dokument speichern."): 1,
        ("train", ("en", "de"), "Close it.", "Schließen."): 1,
        ("train", ("en", "fr"), "Open File", "Ouvrir le fichier"): 1,
        ("train", ("de", "fr"), "Datei öffnen", "Ouvrir le fichier"): 1,
        ("eval", ("en", "de"), "Pattern not found", "Muster nicht gefunden"): 1,
    })
    assert collector.counts.dropped["placeholder_mismatch"] == Counter({"train en-de": 1})


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_catalogs_and_licenses_come_out_of_a_deb_without_installing_it(tmp_path):
    root = deb_tree(tmp_path, "demo", "Files: *\nCopyright: 2025 Nobody\nLicense: GPL-2+\n\nFiles: debian/*\nLicense: MIT\n")
    write_catalog(root / "usr/share/locale/de/LC_MESSAGES/demo.mo", [{"msgid": "Hello", "msgstr": "Hallo"}])
    write_catalog(root / "usr/share/locale/de_CH/LC_MESSAGES/demo.mo", [{"msgid": "Hello", "msgstr": "Grüezi"}])
    write_catalog(root / "usr/lib/demo/resource/fr/LC_MESSAGES/ui.mo", [{"msgid": "Hello", "msgstr": "Bonjour"}])
    deb = build_deb(root, "demo")
    from nmt_serve.training.corpus.catalogs import package_catalogs

    pc = package_catalogs(deb, ["en", "de", "fr"], tmp_path / "cache")
    assert pc.licenses == ("GPL-2+", "MIT")
    assert pc.messages == {"de": {("demo", "", "Hello"): "Hallo"}, "fr": {("ui", "", "Hello"): "Bonjour"}}
    assert (tmp_path / "cache" / "extracted" / "demo_1.0-1" / ".done").is_file()  # reused by the next build
    # ... as long as it asks for the same: another language list extracts again
    assert package_catalogs(deb, ["en", "fr"], tmp_path / "cache2").messages == {
        "fr": {("ui", "", "Hello"): "Bonjour"}}
    assert package_catalogs(deb, ["en", "de"], tmp_path / "cache2").messages == {
        "de": {("demo", "", "Hello"): "Hallo"}}


def test_wrong_language_is_judged_between_the_pairs_languages_on_long_enough_texts():
    check = LanguageCheck()
    english = ["tools for translating DocBook XML files with Gettext", "This is a perfectly ordinary English sentence.",
               "Help", "Dies ist ein ganz gewöhnlicher deutscher Satz über Pakete."]
    german = ["Werkzeuge zur Übersetzung von DocBook-XML-Dateien mittels Gettext",
              "This is a perfectly ordinary English sentence, left untranslated.", "Hilfe", "Ein deutscher Satz."]
    assert check.wrong(("en", "de"), english, german) == [False, True, False, True]


def test_each_package_of_a_source_is_read_in_name_order_and_one_the_release_lacks_is_recorded():
    class Archive:
        def download(self, package: str, release: str):
            return None if package == "gone" else DebFile(package, "1.0-1", Path(f"{package}.deb"), "0")

    collector = Collector(Counts())
    entries = _each_package(Archive(), ("b", "gone", "a"), "bookworm", collector, "help",
                            lambda deb: {"package": deb.package, "version": deb.version})
    assert entries == [{"package": "a", "version": "1.0-1"}, {"package": "b", "version": "1.0-1"},
                       {"package": "gone", "missing": "not in bookworm"}]
