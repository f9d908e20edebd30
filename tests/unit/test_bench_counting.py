"""bench.common's instruction count under callgrind: every thread's work between the child's two marker calls,
and nothing any thread ran before them."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import CALLGRIND, counted_instructions

CHILD = """
import os, sys, threading
before, inside = int(sys.argv[1]), int(sys.argv[2])
def work(n):
    return sorted(str(i) for i in range(n))
thread = threading.Thread(target=work, args=(before,))  # before the count, on a thread of its own
thread.start()
thread.join()
os.getloadavg()
thread = threading.Thread(target=work, args=(inside,))  # in the count, on another thread
thread.start()
thread.join()
os.times()
"""


def count(tmp_path: Path, before: int, inside: int) -> int:
    out = tmp_path / f"{before}-{inside}"
    out.mkdir()
    subprocess.run([*CALLGRIND, f"--callgrind-out-file={out}/callgrind.%p", sys.executable, "-c", CHILD, str(before), str(inside)],
                   check=True, capture_output=True, timeout=300)
    [dump] = out.glob("callgrind.*.1")
    return counted_instructions(dump)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_the_count_holds_every_threads_work_in_it_and_none_from_before(tmp_path):
    alone = count(tmp_path, 0, 20_000)
    after_work = count(tmp_path, 200_000, 20_000)
    doubled = count(tmp_path, 0, 40_000)
    assert 1.6 < doubled / alone < 2.4  # the thread's work in the count is counted
    assert 0.8 < after_work / alone < 1.25  # ten times as much before it is not (the dump's summary line has it)
