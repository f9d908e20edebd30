"""manifest.json: what a corpus was built from and what each rule did, enough to rebuild it and to
check that the rebuild matches (the counts, and each file's line count and SHA-256).

It holds no time of its own (no build date, no durations), so two builds from the same archive
state write the same manifest; the archive's state is the Release files' dates it records.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from nmt_serve.training.corpus.ddtp import DDTP_LICENSE
from nmt_serve.training.corpus.dictionary import __doc__ as DICTIONARY_SELECTION
from nmt_serve.training.corpus.help_pages import __doc__ as HELP_SELECTION
from nmt_serve.training.corpus.filters import (LANGUAGE_MIN_LETTERS, MAX_CHARS, MAX_LENGTH_RATIO, MIN_LETTERS,
                                               RATIO_SMOOTHING, WRONG_CONFIDENCE, Counts)
from nmt_serve.training.corpus.package_list import __doc__ as PACKAGE_SELECTION

if TYPE_CHECKING:
    from nmt_serve.training.corpus.apt import Apt, ReleaseInfo

# bump when a change to the builder changes what it writes from the same sources
BUILDER_VERSION = "3"

HELD_OUT_RULE = ('packages whose name\'s SHA-1 hex digest ends in "0" (hashlib.sha1(name.encode()).hexdigest()'
                 '.endswith("0")) form the eval split; a description shared with such a package goes there too; '
                 'so do a dictionary\'s entries (lines) whose text\'s SHA-1 hex digest ends in "0", and the help pages '
                 'whose "DOCUMENT/FILE" SHA-1 hex digest ends in "0"')


def manifest(config, apt: "Apt", releases: list["ReleaseInfo"], translation_files: dict,
             paired: dict, packages: list[dict], dictionaries: list[dict], helps: list[dict], counts: Counts, sets: dict,
             files: dict) -> dict:
    """The manifest of a build of `config` (a build.BuildConfig)."""
    return {
        "name": config.output.name,
        "builder": "nmt-corpus (nmt_serve/training/corpus)",
        "builder_version": BUILDER_VERSION,
        "languages": list(config.languages),
        "pairs": [f"{x}-{y}" for x, y in config.pairs],
        "archive": {"mirror": apt.mirror, "component": apt.component, "keyring": apt.keyring,
                    "releases": [{"codename": r.codename, "suite": r.suite, "version": r.version, "date": r.date}
                                 for r in releases]},
        "held_out": HELD_OUT_RULE,
        "sources": {
            "ddtp": {"license": DDTP_LICENSE, "translation_files": translation_files,
                     "paired_descriptions": paired},
            "catalogs": {"selection": " ".join(PACKAGE_SELECTION.split()), "packages": packages},
            "dictionaries": {"selection": " ".join(DICTIONARY_SELECTION.split()), "packages": dictionaries},
            "help": {"selection": " ".join(HELP_SELECTION.split()), "packages": helps},
        },
        "parameters": {"max_chars": MAX_CHARS, "min_letters": MIN_LETTERS, "max_length_ratio": MAX_LENGTH_RATIO,
                       "ratio_smoothing": RATIO_SMOOTHING, "language_min_letters": LANGUAGE_MIN_LETTERS,
                       "wrong_language_confidence": WRONG_CONFIDENCE,
                       "language_filter": config.language_filter},
        "rules": counts.as_dict(),
        "counts": sets,
        "files": files,
    }
