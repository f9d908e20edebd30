"""The directory where a server's engine processes keep one copy of each model's weights (inference/shared_weights.py).

The process that starts the engines makes it and removes it when they stop. It is in /dev/shm where there is
one: memory that no disk write-back touches (the page cache of a disk's file would be shared as well, but
written out to the disk). A directory left by a server that was killed (no chance to remove it) is removed by
the next one that starts: its name carries the pid of its owner.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("nmt_serve.engine.weights_dir")
PREFIX = "nmt-weights-"
SHARED_MEMORY = Path("/dev/shm")


def parent_of_weights() -> Path:
    if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK | os.X_OK):
        return SHARED_MEMORY
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_orphans(parent: Path) -> None:
    """The directories of owners that are gone (killed before they could remove theirs)."""
    for path in parent.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX).split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s, left by a server that is gone", path)


def make_weights_dir(engines: int, device: str, enabled: bool = True) -> str:
    """A new private directory for the weights of `engines` engine processes; "" where nothing is to be shared (one
    engine, engines on a GPU, or sharing turned off)."""
    if not enabled or engines < 2 or device.startswith("cuda"):
        return ""
    parent = parent_of_weights()
    try:
        remove_orphans(parent)
        return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent)  # 0700: only this user maps the weights
    except OSError as exc:  # no room, no inode left: the engines serve all the same, a copy each
        log.warning("no directory for the engines' shared weights in %s (%s); each engine keeps its own copy", parent, exc)
        return ""


def remove_weights_dir(path: str) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def weights_room(path: str) -> int:
    """Bytes of weights the directory can hold: its filesystem's free space, and what its files hold already (an
    engine that restarts maps those)."""
    try:
        stats = os.statvfs(path)
        held = sum(f.stat().st_size for f in Path(path).glob("*.weights"))
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize + held
