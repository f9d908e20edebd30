"""One copy of a CPU runner's weights for every engine process of a server.

Each engine process builds its runner (ModelRunner) from the checkpoint: its fused, transposed and blocked
layouts, in memory of its own, so N engines held N copies (the shipped model's runner 52 MB, OPUS-MT's 321 MB
besides oneDNN's packed copies). CTranslate2's workers share one model. On this project's 2-core AMD EPYC (32 MiB
of L3 for both cores) one-row products over the shipped model's matrices ran 0.7x as fast in each of two
processes with a copy each, and as fast as alone with one copy between them; whole greedy searches of one
sentence gained less (1.0-1.16x, in some rounds only: BENCHMARKS.md).

share_weights() writes the runner's tensors into one file of a directory every engine of the server reaches
(the server makes it, in /dev/shm where there is one: engine/weights_dir.py); the first process to finish
writing publishes it (os.link: no process ever maps a file half written), the others find it. Each process
then maps the file and points its tensors at the mapping, after checking that the file holds exactly the bytes
it built itself: a file from any other layout is never used. The mapping is private (copy on write): the pages
stay shared while read, and a tensor written in place gets a page of its own, as if nothing were shared.
Opaque tensors (oneDNN's packed weights, fbgemm's int8 ones) have no storage to map and stay private, as do
tensors under MIN_BYTES (norms, biases: not worth a page each).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import mmap
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nmt_serve.inference.host_allocator import release_freed_memory

log = logging.getLogger("nmt_serve.inference.shared_weights")
MIN_BYTES = 64 * 1024
PAGE = mmap.PAGESIZE


@dataclasses.dataclass(frozen=True)
class SharedWeights:
    path: Path  # the file mapped
    shared_bytes: int  # the runner's storages now in the mapping
    private_bytes: int  # the runner's small storages, which stay the process's own (opaque ones are not counted)


def runner_tensors(runner) -> list[torch.Tensor]:
    """Every tensor the runner (and the model it serves) holds, in the order of its attributes: the same order in
    every process that built the same runner."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def visit(obj) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, nn.Module):
            found.extend(obj.parameters())
            found.extend(obj.buffers())
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                visit(item)
        elif type(obj).__module__.startswith("nmt_serve.") and hasattr(obj, "__dict__"):
            for item in vars(obj).values():
                visit(item)

    visit(runner)
    return found


def _storages(runner) -> tuple[dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]], int]:
    """{storage address: (storage, the tensors viewing it)} of the storages worth mapping, in walk order, and the
    bytes of the rest."""
    storages: dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]] = {}
    private: dict[int, int] = {}
    for t in runner_tensors(runner):
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_mkldnn:  # is_mkldnn: oneDNN's packed weights
            continue
        try:
            storage = t.untyped_storage()
        except NotImplementedError:  # any other opaque tensor: no bytes of its own to reach
            continue
        if storage.nbytes() < MIN_BYTES:
            private[storage.data_ptr()] = storage.nbytes()
            continue
        storages.setdefault(storage.data_ptr(), (storage, []))[1].append(t)
    return storages, sum(private.values())


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)  # (nbytes,) uint8, no copy


def _layout(storages) -> tuple[list[int], str]:
    """Each storage's offset in the file (page-aligned) and a digest of the layout that names the file."""
    offsets, offset, digest = [], 0, hashlib.sha256()
    for storage, tensors in storages.values():
        offsets.append(offset)
        offset += -(-storage.nbytes() // PAGE) * PAGE
        t = tensors[0]
        digest.update(repr((storage.nbytes(), str(t.dtype), tuple(t.shape), t.stride(), t.storage_offset())).encode())
    offsets.append(offset)  # the file's size
    return offsets, digest.hexdigest()[:16]


def _publish(path: Path, storages, offsets: list[int]) -> None:
    """The file written whole under a name of this process's, then linked to `path` unless another process was
    first (then theirs stays: it holds the same bytes, or is not used)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as f:
            for (storage, _), offset in zip(storages.values(), offsets):
                f.seek(offset)
                f.write(_bytes_of(storage).numpy().data)
            f.truncate(offsets[-1])
        try:
            os.link(partial, path)
        except FileExistsError:
            pass
    finally:
        partial.unlink(missing_ok=True)


def _safe(part: str) -> str:
    """A file name's part: no dots (they separate the parts) and nothing a shell or another filesystem minds, each
    other character as %xx, so that two names never make one part."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "".join(f"%{b:02x}" for b in c.encode()) for c in part)


def remove_other_versions(directory: Path, name: str, version: str) -> list[Path]:
    """The files of `name` of any other version: a model replaced on disk. Processes that map one keep it (its
    pages go back once the last mapping does); no process maps it again, since each maps the version it loaded."""
    removed = []
    for path in directory.glob(f"{_safe(name)}.*.weights"):
        parts = path.name.split(".")
        if len(parts) == 4 and parts[1] != _safe(version):  # name.version.digest.weights
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def share_weights(runner, directory: str | Path, name: str, version: str = "") -> SharedWeights | None:
    """The runner's CPU tensors (and its model's) re-pointed at a file of `directory` that every process sharing
    `name` (a model's id) at `version` (its checkpoint's) maps; None where nothing was shared (no storage worth it,
    no room in the directory, or a file of other bytes under the same name). The runner computes exactly what it did
    before: the file holds this process's own bytes, checked before any tensor moves. Once it is mapped, the files
    of other versions of `name` are removed (remove_other_versions)."""
    shared = _share(runner, Path(directory), name, version)
    if shared is not None:  # the process's own copy, freed with _share's last reference to it, out of the heap
        release_freed_memory()  # that would keep it for later steps (host_allocator.keep_freed_memory)
        for path in remove_other_versions(Path(directory), name, version):
            log.info("%s: removed %s, the weights of a version no longer on disk", name, path)
    return shared


@torch.no_grad()
def _share(runner, directory: Path, name: str, version: str) -> SharedWeights | None:
    storages, private = _storages(runner)
    if not storages:
        return None
    offsets, digest = _layout(storages)
    path = directory / f"{_safe(name)}.{_safe(version)}.{digest}.weights"
    try:
        if not path.exists():
            _publish(path, storages, offsets)
        mapped = np.memmap(path, dtype=np.uint8, mode="c")  # private: a write copies the page, never reaches the file
    except (OSError, ValueError) as exc:  # ENOSPC in a small /dev/shm, a directory gone, an empty file (numpy's
        # ValueError): each process keeps its own copy
        log.warning("%s: weights not shared between engines (%s); this engine keeps its own copy", name, exc)
        return None
    if mapped.size != offsets[-1]:
        log.warning("%s: %s is %d bytes, not %d; this engine keeps its own copy", name, path, mapped.size, offsets[-1])
        return None
    regions = [torch.from_numpy(mapped[offset:offset + storage.nbytes()])
               for (storage, _), offset in zip(storages.values(), offsets)]
    for (storage, _), region in zip(storages.values(), regions):
        if not torch.equal(region, _bytes_of(storage)):
            log.warning("%s: %s holds other weights than this engine's; this engine keeps its own copy", name, path)
            return None
    for (_, tensors), region in zip(storages.values(), regions):
        shared = region.untyped_storage()  # keeps the mapping alive as long as a tensor views it
        for t in tensors:
            t.set_(shared, t.storage_offset(), t.size(), t.stride())
    runner.refresh_key()  # the model's tensors moved: the runner is still the current one
    runner.shared_weights = SharedWeights(path, sum(s.nbytes() for s, _ in storages.values()), private)
    return runner.shared_weights
