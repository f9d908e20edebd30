"""How many of the engine's usable cores the other processes leave idle, measured as the engine runs.

On the CPU the engine steps its searches on lanes of one torch thread each: beside busy neighbours an
OpenMP team waits at every op for a thread the scheduler gave away (a loop of 2 threads ran 2.3-3.7x
slower than one beside a single CPU-bound process; BENCHMARKS.md, "Beside busy neighbours"). A lone
search, the load of a server that translates one request at a time, then left the other cores idle:
one sentence at a time took 1.12-1.22x as long as on both cores of this project's 2-core CPU (BENCHMARKS.md). The engine gives such a search the cores nobody else uses (`free_cores`), and one thread again as
soon as other processes take them.

What the others use is measured, not guessed: the busy time of the CPUs this process may run on
(/proc/stat: user, nice, system, irq, softirq and a hypervisor's steal), or, under a cgroup CPU quota
narrower than those CPUs (a pod's limit), the cgroup's own usage (what the API process beside the
engine takes from the same quota), less this process's own CPU time, over the last window of at least
WINDOW_S seconds. Where neither can be read, a lone search keeps one thread.
"""
from __future__ import annotations

import os
import time
from typing import Callable

WINDOW_S = 0.5  # the measurement's window: short enough to follow a neighbour that starts, long enough for /proc's ticks
# a lone search takes the usable cores less those the others kept busy, rounded up from 0.7 of a core: the API
# process's few percent and a load generator's leave both cores of a 2-core machine, a neighbour spinning on one
# (0.7-1.0 of a core while it shares the machine) takes one away
SPARE_ROUNDING = 0.3

CPU_STAT = "/proc/stat"
CGROUP_STAT = "/sys/fs/cgroup/cpu.stat"


def cpus_busy_seconds(cpus: set[int] | None = None, path: str = CPU_STAT) -> float | None:
    """Busy seconds since boot of these CPUs (None: all of them), from /proc/stat; None where unreadable."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = 0
    try:
        with open(path) as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                if cpus is not None and int(name[3:]) not in cpus:
                    continue
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
                busy += user + nice + system + irq + softirq + steal  # guest time is inside user already
    except (OSError, ValueError):
        return None
    return busy / tick


def cgroup_busy_seconds(path: str = CGROUP_STAT) -> float | None:
    """CPU seconds used by this process's cgroup (v2) since it began; None where unreadable."""
    try:
        with open(path) as f:
            for line in f:
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def busy_reader(cores: int) -> Callable[[], float | None]:
    """What to read for the others' use of `cores` usable cores: the cgroup's usage where its quota is what
    limits them (fewer cores than the CPUs this process may run on), else the busy time of those CPUs."""
    cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if cpus is not None and cores < len(cpus) and cgroup_busy_seconds() is not None:
        return cgroup_busy_seconds
    return lambda: cpus_busy_seconds(cpus)


class CpuRoom:
    """free_cores(): how many threads a lone search may take now, 1 to `cores`."""

    def __init__(self, cores: int, *, read_busy: Callable[[], float | None] | None = None,
                 own_seconds: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic):
        """cores: the engine's usable cores (core.usable_cores); read_busy: the busy seconds of those cores
        by every process (busy_reader's); own_seconds: this process's CPU seconds, all its threads."""
        self.cores = max(1, cores)
        self._read_busy = read_busy or busy_reader(self.cores)
        self._own, self._clock = own_seconds, clock
        self._sample = self._take()
        self.others = float(self.cores)  # cores the other processes kept busy over the last window; none measured yet
        self._free = 1

    def _take(self) -> tuple[float, float | None, float]:
        return self._clock(), self._read_busy(), self._own()

    def refresh(self) -> None:
        """Measure again once WINDOW_S has passed since the last measurement (cheap otherwise: call it often)."""
        now = self._clock()
        if now - self._sample[0] < WINDOW_S:
            return
        sample = self._take()
        (then, busy_then, own_then), (now, busy, own) = self._sample, sample
        self._sample = sample
        if busy is None or busy_then is None:
            self.others, self._free = float(self.cores), 1
            return
        self.others = max(0.0, ((busy - busy_then) - (own - own_then)) / (now - then))
        self._free = max(1, min(self.cores, int(self.cores - self.others + SPARE_ROUNDING)))

    def free_cores(self) -> int:
        """Threads for a lone search: the usable cores less those the others kept busy over the last window."""
        return self._free
