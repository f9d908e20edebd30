"""keep_freed_memory: glibc's malloc serves the blocks a decoding step frees and takes again from its heap."""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from nmt_serve.inference.host_allocator import keep_freed_memory

ROOT = Path(__file__).resolve().parents[2]

# glibc's malloc and its statistics (mallinfo2), for the probes below
MALLOC = """
import ctypes, sys
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
"""
# In a fresh process (nothing large freed yet, so glibc's thresholds are its first ones): whether a block of 8 MiB,
# and then one of 40 MiB, is a mapping of its own (mallinfo2's hblks) rather than heap memory, and whether the 8 MiB
# stayed free at the top of the heap once freed (keepcost) rather than going back to the kernel.
PROBE = MALLOC + """
if sys.argv[1] == "keep":
    from nmt_serve.inference.host_allocator import keep_freed_memory
    assert keep_freed_memory()
def mapped(size):
    before = libc.mallinfo2().hblks
    block = libc.malloc(size)
    after = libc.mallinfo2().hblks
    libc.free(block)
    return after - before
small = mapped(8 << 20)
kept = int(libc.mallinfo2().keepcost >= 8 << 20)
print(small, mapped(40 << 20), kept)
"""


def probe(mode: str) -> str:
    return subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_blocks_up_to_32_mib_come_from_the_heap_once_kept():
    if not keep_freed_memory() or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc's malloc (2.33 or later) only")
    assert keep_freed_memory()  # once per process; asking again changes nothing
    assert probe("default") == "1 1 0"  # glibc's first threshold (128 KiB): both are mappings of their own
    assert probe("keep") == "0 1 1"  # 8 MiB from the heap, where it stays once freed; 40 MiB past the threshold


def test_a_translator_on_the_cpu_keeps_freed_memory(tiny_checkpoint, monkeypatch):
    import nmt_serve.inference.translator as translator

    calls = []
    monkeypatch.setattr(translator, "keep_freed_memory", lambda: calls.append(True) or True)
    translator.Translator.load(tiny_checkpoint, device="cpu")
    assert calls == [True]


RELEASE_PROBE = MALLOC + """
from nmt_serve.inference.host_allocator import keep_freed_memory, release_freed_memory
assert keep_freed_memory()
libc.free(libc.malloc(8 << 20))
kept = libc.mallinfo2().keepcost >= 8 << 20
released = release_freed_memory()
print(int(kept), int(released), int(libc.mallinfo2().keepcost >= 8 << 20))
"""


def test_freed_memory_the_heap_keeps_goes_back_when_released():
    """release_freed_memory: what keep_freed_memory keeps for the next step, given back once (shared_weights frees a
    runner's own copy of the weights, which no step takes again)."""
    if not keep_freed_memory() or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc's malloc (2.33 or later) only")
    out = subprocess.run([sys.executable, "-c", RELEASE_PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1 1 0"  # kept at the top of the heap, then given back
