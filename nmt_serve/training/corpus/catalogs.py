"""Software message catalogs: the gettext `.mo` files a binary package ships for each language
(`.../{lang}/LC_MESSAGES/{domain}.mo`, under /usr/share/locale or an application's own resource tree,
as LibreOffice has), read without installing anything: `dpkg-deb --fsys-tarfile` streams the
package's files and only the catalogs of the wanted languages (and the copyright file) are kept.

A catalog maps an English msgid to its translation; two languages' catalogs of the same package and
domain pair up by (msgctxt, msgid). Only the singular form of a plural message is used (msgid with
msgstr[0]): the other forms answer to counts the English has no form for. Regional catalogs
(`de_CH`, `fr_CA`) are left out: the corpus is about the base languages.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polib

from nmt_serve.training.corpus import deb_files
from nmt_serve.training.corpus.alignment import message_units
from nmt_serve.training.corpus.apt import DebFile
from nmt_serve.training.corpus.heldout import split_of
from nmt_serve.training.corpus.segments import Collector

_CATALOG = re.compile(r"(?:^|/)([a-z]{2,3})/LC_MESSAGES/([^/]+)\.mo$")

Key = tuple[str, str, str]  # domain, msgctxt, msgid


@dataclass
class PackageCatalogs:
    package: str
    version: str
    licenses: tuple[str, ...]
    messages: dict[str, dict[Key, str]] = field(default_factory=dict)  # language -> {key: translation}


def extract(deb: DebFile, languages: list[str], cache_dir: Path) -> Path:
    """The package's catalogs for `languages` (as `{lang}/{domain}.mo`) and its copyright file."""
    def target_of(name: str) -> str | None:
        match = _CATALOG.search(name)
        return f"{match.group(1)}/{match.group(2)}.mo" if match and match.group(1) in languages else None

    return deb_files.extract(deb, cache_dir, target_of, selection=f"LC_MESSAGES/*.mo {','.join(languages)}")


def read_catalog(path: str | Path) -> dict[tuple[str, str], str]:
    """{(msgctxt, msgid): translation} of a .mo or .po file; untranslated, fuzzy and obsolete entries left out."""
    path = Path(path)
    catalog = polib.mofile(str(path)) if path.suffix == ".mo" else polib.pofile(str(path))
    out = {}
    for entry in catalog:
        if not entry.msgid or entry.obsolete or "fuzzy" in entry.flags:
            continue
        text = entry.msgstr or (entry.msgstr_plural or {}).get(0, "")
        if text:
            out.setdefault((entry.msgctxt or "", entry.msgid), text)
    return out


def package_catalogs(deb: DebFile, languages: list[str], cache_dir: Path) -> PackageCatalogs:
    root = extract(deb, languages, cache_dir)
    result = PackageCatalogs(deb.package, deb.version, deb_files.licenses_in(root))
    for language in languages:
        messages: dict[Key, str] = {}
        for path in sorted((root / language).glob("*.mo")) if (root / language).is_dir() else []:
            domain = re.sub(r"\.\d+$", "", path.stem)  # foo.2.mo: a second foo.mo in the package
            for (context, msgid), text in read_catalog(path).items():
                messages.setdefault((domain, context, msgid), text)
        if messages:
            result.messages[language] = messages
    return result


def group_of(package: str, languages: list[str]) -> str:
    """Packages that ship one language each of the same program (libreoffice-l10n-de, -fr) form one
    group, whose languages pair up with each other."""
    base, _, suffix = package.rpartition("-")
    return base if base and suffix in languages else package


def catalog_segments(catalogs: list[PackageCatalogs], languages: list[str], pairs: list[tuple[str, str]],
                     release: str, collector: Collector) -> None:
    """Collect every message translated into both languages of a pair (English: the msgid itself),
    into the split of the package(s) the translations come from."""
    groups: dict[str, dict[str, tuple[str, dict[Key, str]]]] = {}
    for pc in sorted(catalogs, key=lambda c: c.package):
        group = groups.setdefault(group_of(pc.package, languages), {})
        for language, messages in sorted(pc.messages.items()):
            group.setdefault(language, (pc.package, messages))
    for name in sorted(groups):
        group = groups[name]
        for x, y in pairs:
            if y not in group or (x != "en" and x not in group):
                continue
            package_y, messages_y = group[y]
            if x == "en":
                sources, keys, packages = None, sorted(messages_y), [package_y]
            else:
                package_x, sources = group[x]
                keys, packages = sorted(sources.keys() & messages_y.keys()), sorted({package_x, package_y})
            split = split_of(packages)
            for key in keys:
                a = key[2] if sources is None else sources[key]
                collector.add(split, (x, y), "catalog", packages[0], release, message_units(a, messages_y[key]),
                              accelerators=True)
