"""Files out of a downloaded .deb without installing it: `dpkg-deb --fsys-tarfile` streams the
package's files and only those a source asks for (and the copyright file) are kept, under a cache
directory per package and version that the next build reuses."""
from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

from nmt_serve.training.corpus.apt import DebFile

_LICENSE = re.compile(r"^License:[ \t]*(\S[^\n]*)$", re.M)


def extract(deb: DebFile, cache_dir: Path, target_of: Callable[[str], str | None], purpose: str = "",
            selection: str = "") -> Path:
    """The package's files for which `target_of(path in the package)` names a place (relative to the
    returned directory), and its copyright file as `copyright`. Two files given the same place are
    kept both, the second as `name.2.suffix`. Reused as long as the same version and `selection` (words
    that say what target_of picks: a change to them re-extracts) are asked for; a source that reads other
    files of a package another source reads too names its own `purpose` (a directory of its own)."""
    out = Path(cache_dir) / "extracted" / purpose / f"{deb.package}_{deb.version.replace(':', '%3a')}"
    done = out / ".done"
    if done.is_file() and done.read_text() == selection:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    copyright_path = f"usr/share/doc/{deb.package}/copyright"
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb.path)], stdout=subprocess.PIPE) as proc:
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
            for member in tar:
                name = member.name.lstrip("./")
                if not member.isfile():
                    continue
                place = "copyright" if name == copyright_path else target_of(name)
                if place is None:
                    continue
                base = target = out / place
                target.parent.mkdir(parents=True, exist_ok=True)
                n = 2
                while target.exists():  # one name in two places of the package
                    target = base.with_name(f"{base.stem}.{n}{base.suffix}")
                    n += 1
                target.write_bytes(tar.extractfile(member).read())
        while proc.stdout.read(1 << 20):  # the archive's end padding: dpkg-deb must not die of a closed pipe
            pass
    if proc.returncode != 0:
        raise RuntimeError(f"dpkg-deb --fsys-tarfile {deb.path} failed ({proc.returncode})")
    done.write_text(selection)
    return out


def licenses_of(copyright_text: str | None) -> tuple[str, ...]:
    """The License: lines of a machine-readable copyright file (short names, each once, sorted)."""
    if copyright_text is None:
        return ("unknown: no copyright file in the package (its doc directory is a link)",)
    found = sorted({m.group(1).strip() for m in _LICENSE.finditer(copyright_text)})
    return tuple(found) or ("unknown: the copyright file is not machine-readable",)


def licenses_in(root: Path) -> tuple[str, ...]:
    """The licenses of a package extracted by `extract`."""
    path = root / "copyright"
    return licenses_of(path.read_text(errors="replace") if path.is_file() else None)
