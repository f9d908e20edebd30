"""Debian's archive through apt, by package name, in a private apt tree: nothing of the system's apt
state (its lists, caches, sources, pins or dpkg status) is read or written, and no root is needed
beyond what the user already has.

The tree lives under the corpus cache directory:

    apt/sources.list        the releases asked for (signed by Debian's archive keyring)
    apt/state/lists/        InRelease, Packages and i18n/Translation-{en,de,fr,cs} of each release
    apt/state/status        an empty dpkg status: candidates do not depend on what is installed here
    debs/                   downloaded .deb files, checked against the archive's SHA-256 before reuse

`update()` runs only when a release's lists are missing (or `refresh`), so a second build downloads
nothing; a .deb already in `debs/` with the right hash is not downloaded again.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("nmt_serve.training.corpus")

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class AptError(RuntimeError):
    pass


@dataclass(frozen=True)
class ReleaseInfo:
    codename: str
    suite: str
    version: str
    date: str  # the Release file's Date field


@dataclass(frozen=True)
class DebFile:
    package: str
    version: str
    path: Path
    sha256: str


class Apt:
    def __init__(self, cache_dir: Path, releases: list[str], languages: list[str], mirror: str = DEFAULT_MIRROR,
                 keyring: str = DEFAULT_KEYRING, component: str = "main"):
        self.root = Path(cache_dir).resolve() / "apt"
        self.debs = Path(cache_dir).resolve() / "debs"
        self.releases, self.languages, self.mirror, self.keyring, self.component = (
            list(releases), list(languages), mirror.rstrip("/"), keyring, component)

    @property
    def lists(self) -> Path:
        return self.root / "state" / "lists"

    def _prepare(self) -> None:
        for d in (self.lists / "partial", self.root / "cache" / "archives" / "partial", self.root / "sources.list.d",
                  self.root / "preferences.d", self.debs):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "state" / "status").touch()
        sources = "".join(f"deb [signed-by={self.keyring}] {self.mirror} {r} {self.component}\n" for r in self.releases)
        path = self.root / "sources.list"
        if not path.exists() or path.read_text() != sources:
            path.write_text(sources)

    def options(self) -> list[str]:
        """apt-get/apt-cache options that point every piece of state into the private tree."""
        settings = {
            "Dir::State": self.root / "state",
            "Dir::State::Lists": self.lists,
            "Dir::State::status": self.root / "state" / "status",
            "Dir::Cache": self.root / "cache",
            "Dir::Cache::pkgcache": "",
            "Dir::Cache::srcpkgcache": "",
            "Dir::Etc::SourceList": self.root / "sources.list",
            "Dir::Etc::SourceParts": self.root / "sources.list.d",
            "Dir::Etc::Preferences": self.root / "preferences",
            "Dir::Etc::PreferencesParts": self.root / "preferences.d",
            "Acquire::Languages": ",".join(self.languages),
            "Acquire::GzipIndexes": "false",  # plain lists: the Translation files are read directly
            "APT::Architectures": "amd64",
            "APT::Architecture": "amd64",
            # a snapshot mirror's Release files are past their Valid-Until; their signatures are still checked
            "Acquire::Check-Valid-Until": "false",
        }
        if os.geteuid() == 0:  # apt's _apt sandbox user cannot write into a private tree owned by root
            settings["APT::Sandbox::User"] = "root"
        out = []
        for key, value in settings.items():
            out += ["-o", f"{key}={value}"]
        return out

    def _run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        command = [*args[:1], *self.options(), *args[1:]]
        log.debug("%s", shlex.join(command))
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            raise AptError(f"{shlex.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done

    def _list_file(self, release: str, name: str) -> Path | None:
        prefix = re.sub(r"^[a-z]+://", "", self.mirror).replace("/", "_")
        path = self.lists / f"{prefix}_dists_{release}_{name}"
        return path if path.is_file() else None

    def has_lists(self) -> bool:
        return all(self._list_file(r, "InRelease") and self.translation(r, "en") for r in self.releases)

    def update(self, refresh: bool = False) -> bool:
        """apt-get update into the private tree; False when the lists were there already."""
        self._prepare()
        if self.has_lists() and not refresh:
            return False
        log.info("apt-get update: %s (%s)", ", ".join(self.releases), ",".join(self.languages))
        done = self._run("apt-get", "update", "-q")
        if not self.has_lists():  # apt only warns when a mirror cannot be reached
            raise AptError(f"apt-get update left no InRelease/Translation-en for {self.releases} in {self.lists}: "
                           f"{done.stderr.strip()[-2000:]}")
        return True

    def translation(self, release: str, language: str) -> Path | None:
        """The release's i18n/Translation-{language} list, when the archive has one."""
        return self._list_file(release, f"{self.component}_i18n_Translation-{language}")

    def release_info(self, release: str) -> ReleaseInfo:
        path = self._list_file(release, "InRelease")
        if path is None:
            raise AptError(f"no InRelease for {release}; run update first")
        fields = {}
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(" ") or ":" not in line:
                if fields and line.startswith(" "):
                    break  # the checksum lists begin: the header fields are all read
                continue
            key, _, value = line.partition(":")
            fields.setdefault(key, value.strip())
        return ReleaseInfo(fields.get("Codename", release), fields.get("Suite", ""), fields.get("Version", ""),
                           fields.get("Date", ""))

    def download(self, package: str, release: str | None = None) -> DebFile | None:
        """The .deb of a package in `release` (else the releases' candidate), from the cache when its
        hash matches; None when there is no such package."""
        self._prepare()
        wanted = f"{package}/{release}" if release else package
        try:
            uris = self._run("apt-get", "download", "--print-uris", "-q", wanted).stdout
        except AptError as exc:
            if any(m in str(exc) for m in ("Unable to locate package", "has no installation candidate", "not found")):
                return None
            raise
        match = re.search(r"^'[^']+' (\S+) (\d+) SHA256:([0-9a-f]+)", uris, re.M)
        if match is None:
            raise AptError(f"apt-get download --print-uris {package}: unexpected output {uris!r}")
        name, sha256 = match.group(1), match.group(3)
        path = self.debs / name
        if not (path.is_file() and _sha256(path) == sha256):
            log.info("downloading %s", name)
            self._run("apt-get", "download", "-q", wanted, cwd=self.debs)
            if not path.is_file() or _sha256(path) != sha256:
                raise AptError(f"{package}: apt-get download did not leave {path} with SHA-256 {sha256}")
        version = name.split("_")[1].replace("%3a", ":")
        return DebFile(package, version, path, sha256)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
