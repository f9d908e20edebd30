"""nmt-corpus: build the Debian translation corpus (see nmt_serve/training/corpus/__init__.py).

    nmt-corpus                                   # corpora/debian-v3, cache in corpora/cache
    nmt-corpus --help-packages '' --dictionaries '' --output corpora/debian-v1   # before dictionary and help
    nmt-corpus --releases bookworm --output corpora/debian-bookworm
    nmt-corpus --packages '' --dictionaries '' --help-packages ''   # package descriptions only
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from nmt_serve.cli.common import user_errors
from nmt_serve.training.corpus.apt import DEFAULT_KEYRING, DEFAULT_MIRROR, AptError
from nmt_serve.training.corpus.build import BuildConfig, build
from nmt_serve.training.corpus.dictionary import DICTIONARIES
from nmt_serve.training.corpus.help_pages import HELP_PACKAGES
from nmt_serve.training.corpus.package_list import CATALOG_PACKAGES


def _list(spec: str) -> list[str]:
    return [item.strip() for item in spec.split(",") if item.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nmt-corpus", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="corpora/debian-v3", help="corpus directory (default: %(default)s)")
    p.add_argument("--cache", default="corpora/cache",
                   help="downloads and the private apt tree, reused by the next build (default: %(default)s)")
    p.add_argument("--releases", default="bookworm,trixie",
                   help="Debian releases, comma-separated: descriptions from all, a description in several taken "
                        "from the first that has it; catalogs from the first (default: %(default)s)")
    p.add_argument("--languages", default="en,de,fr,cs", help="languages, en first (default: %(default)s)")
    p.add_argument("--packages", default=",".join(CATALOG_PACKAGES),
                   help="packages whose message catalogs are read, comma-separated (default: the list in "
                        "nmt_serve/training/corpus/package_list.py; '' for none)")
    p.add_argument("--dictionaries", default=",".join(DICTIONARIES),
                   help="dictionary packages whose example sentences are read, comma-separated (default: "
                        "%(default)s; '' for none, as in the debian-v1 corpus)")
    p.add_argument("--help-packages", default=",".join(HELP_PACKAGES),
                   help="packages whose translated help pages are read, comma-separated (default: the list in "
                        "nmt_serve/training/corpus/help_pages.py; '' for none)")
    p.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror (default: %(default)s)")
    p.add_argument("--keyring", default=DEFAULT_KEYRING, help="archive keyring (default: %(default)s)")
    p.add_argument("--refresh", action="store_true", help="apt-get update even when the cached lists are there")
    p.add_argument("--no-language-filter", action="store_true", help="skip the lingua wrong-language rule")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(message)s",
                        stream=sys.stderr)
    config = BuildConfig(output=Path(args.output), cache=Path(args.cache), releases=_list(args.releases),
                         languages=_list(args.languages), mirror=args.mirror, keyring=args.keyring,
                         packages=tuple(_list(args.packages)),
                         dictionaries=tuple(_list(args.dictionaries)), help_packages=tuple(_list(args.help_packages)),
                         refresh=args.refresh,
                         language_filter=not args.no_language_filter)
    start = time.monotonic()
    with user_errors(p, AptError, ValueError, OSError):
        result = build(config)
    for name, pairs in result["counts"].items():
        print(f"{name}: " + ", ".join(f"{pair} {c['pairs']}" for pair, c in pairs.items()))
    print(f"{config.output}: built in {time.monotonic() - start:.0f} s (manifest.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
