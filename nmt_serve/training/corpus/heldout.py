"""Which packages are held out: their descriptions and catalogs form the evaluation split and never
reach training. The rule depends on nothing but the package's name, so every build, release and
future source agrees on it without a list to keep: about one package in sixteen."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable


def is_held_out(package: str) -> bool:
    """Whether the SHA-1 hex digest of the package's name ends in 0."""
    return hashlib.sha1(package.encode()).hexdigest().endswith("0")


def split_of(packages: Iterable[str]) -> str:
    """"eval" when any of the packages is held out (a description shared by several packages goes
    with its held-out one, so that its text never reaches training), else "train"."""
    return "eval" if any(is_held_out(p) for p in packages) else "train"


def entry_split(package: str, entry: str) -> str:
    """The split of one entry of a source that is a single package's long list (a dictionary): "eval"
    when the package is held out or the SHA-1 hex digest of the entry's text ends in 0 (about one entry
    in sixteen: an evaluation set of that source's own kind of text), else "train"."""
    return "eval" if is_held_out(package) or hashlib.sha1(entry.encode()).hexdigest().endswith("0") else "train"
