"""One corpus build: fetch (or reuse) the sources through apt, collect aligned segments, filter,
write the files and the manifest. Everything is read and written in sorted order, so two builds from
the same archive state write the same files (the manifest records their SHA-256)."""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from nmt_serve.training.corpus import ddtp
from nmt_serve.training.corpus.apt import DEFAULT_KEYRING, DEFAULT_MIRROR, Apt, DebFile
from nmt_serve.training.corpus.catalogs import catalog_segments, package_catalogs
from nmt_serve.training.corpus.dictionary import DICTIONARIES, dictionary_segments
from nmt_serve.training.corpus.filters import Counts, LanguageCheck
from nmt_serve.training.corpus.help_pages import HELP_PACKAGES, help_segments
from nmt_serve.training.corpus.heldout import is_held_out
from nmt_serve.training.corpus.manifest import manifest
from nmt_serve.training.corpus.output import counts_of, select, write
from nmt_serve.training.corpus.package_list import CATALOG_PACKAGES
from nmt_serve.training.corpus.segments import Collector

log = logging.getLogger("nmt_serve.training.corpus")


@dataclass
class BuildConfig:
    output: Path
    cache: Path
    # descriptions from every release (a digest seen twice taken from the first); catalogs from the first
    releases: list[str] = field(default_factory=lambda: ["bookworm", "trixie"])
    languages: list[str] = field(default_factory=lambda: ["en", "de", "fr", "cs"])
    mirror: str = DEFAULT_MIRROR
    keyring: str = DEFAULT_KEYRING
    packages: tuple[str, ...] = CATALOG_PACKAGES  # empty: no catalogs
    dictionaries: tuple[str, ...] = tuple(DICTIONARIES)  # empty: no dictionary sentences (the debian-v1 corpus)
    help_packages: tuple[str, ...] = HELP_PACKAGES  # empty: no help pages
    refresh: bool = False  # apt-get update even when the lists are cached
    language_filter: bool = True

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """Every pair of the languages, in their given order: en-de, en-fr, en-cs, de-fr, de-cs, fr-cs."""
        return list(combinations(self.languages, 2))


def read_descriptions(apt: Apt, config: BuildConfig) -> tuple[dict, dict, dict]:
    """{language: {md5: description}}, {language: {md5: release}} and per release and language the
    file's facts; a digest seen in several releases is taken from the first release that has it."""
    descriptions: dict[str, dict] = {lang: {} for lang in config.languages}
    releases: dict[str, dict] = {lang: {} for lang in config.languages}
    files: dict[str, dict] = {}
    for release in config.releases:
        for language in config.languages:
            path = apt.translation(release, language)
            if path is None:
                log.warning("%s has no Translation-%s", release, language)
                continue
            found = ddtp.read_translation(path, language)
            files.setdefault(release, {})[language] = {"file": path.name, "descriptions": len(found),
                                                        "sha256": _sha256(path)}
            for md5, description in found.items():
                if md5 not in descriptions[language]:
                    descriptions[language][md5] = description
                    releases[language][md5] = release
    return descriptions, releases, files


def build(config: BuildConfig) -> dict:
    """Build the corpus into config.output; returns the manifest (also written as manifest.json)."""
    if "en" not in config.languages:
        raise ValueError("the languages must include en: every source pairs translations through English")
    unknown = sorted(set(config.dictionaries) - set(DICTIONARIES))
    if unknown:  # before anything is downloaded
        raise ValueError(f"no reader for a dictionary in {', '.join(unknown)}; known: {', '.join(DICTIONARIES)}")
    apt = Apt(config.cache, config.releases, config.languages, config.mirror, config.keyring)
    apt.update(refresh=config.refresh)
    release_infos = [apt.release_info(r) for r in config.releases]
    counts = Counts()
    collector = Collector(counts)

    descriptions, description_releases, translation_files = read_descriptions(apt, config)
    paired = ddtp.description_segments(descriptions, description_releases, config.pairs, collector)
    log.info("descriptions: %d segments", len(collector.segments))

    catalogs, packages = [], []
    for package in sorted(config.packages):
        deb = apt.download(package, config.releases[0])
        if deb is None:
            packages.append({"package": package, "missing": f"not in {config.releases[0]}"})
            continue
        pc = package_catalogs(deb, config.languages, config.cache)
        catalogs.append(pc)
        packages.append({"package": package, "version": deb.version, "sha256": deb.sha256,
                         "split": "eval" if is_held_out(package) else "train", "licenses": list(pc.licenses),
                         "messages": {lang: len(m) for lang, m in sorted(pc.messages.items())}})
    before = len(collector.segments)
    catalog_segments(catalogs, config.languages, config.pairs, config.releases[0], collector)
    log.info("catalogs: %d segments from %d packages", len(collector.segments) - before, len(catalogs))

    dictionaries = _each_package(apt, config.dictionaries, config.releases[0], collector, "dictionary",
                                 lambda deb: dictionary_segments(deb, config.pairs, config.releases[0], config.cache, collector))
    helps = _each_package(apt, config.help_packages, config.releases[0], collector, "help",
                          lambda deb: help_segments(deb, config.languages, config.pairs, config.releases[0], config.cache, collector))

    check = LanguageCheck() if config.language_filter else None
    selected = select(collector.segments, config.pairs, counts, check)
    files = write(config.output, selected)
    result = manifest(config, apt, release_infos, translation_files, paired, packages, dictionaries, helps, counts,
                      counts_of(selected), files)
    (config.output / "manifest.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return result


def _each_package(apt: Apt, packages: tuple[str, ...], release: str, collector: Collector, source: str,
                  read: Callable[[DebFile], dict]) -> list[dict]:
    """Each package's manifest entry, in name order: `read` collects its segments and says what it held; a
    package the release lacks is recorded as such."""
    entries = []
    for package in sorted(packages):
        deb = apt.download(package, release)
        if deb is None:
            entries.append({"package": package, "missing": f"not in {release}"})
            continue
        before = len(collector.segments)
        entries.append(read(deb))
        log.info("%s %s: %d segments", source, package, len(collector.segments) - before)
    return entries


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
