"""CpuRoom: how many cores a lone search may take, from what the other processes used (fake counters)."""
from __future__ import annotations

import pytest

from nmt_serve.engine import cpu_room
from nmt_serve.engine.cpu_room import WINDOW_S, CpuRoom, cgroup_busy_seconds, cpus_busy_seconds


class Counters:
    """A clock, the busy seconds of the cores (every process) and this process's CPU seconds, moved by hand."""

    def __init__(self):
        self.now, self.busy, self.own = 100.0, 5000.0, 10.0

    def run(self, seconds: float, *, own: float, others: float) -> None:
        """`seconds` pass with this process using `own` cores and the others `others`."""
        self.now += seconds
        self.own += own * seconds
        self.busy += (own + others) * seconds


def room_of(counters: Counters, cores: int = 2) -> CpuRoom:
    return CpuRoom(cores, read_busy=lambda: counters.busy, own_seconds=lambda: counters.own, clock=lambda: counters.now)


@pytest.mark.parametrize("others, free", [(0.0, 2), (0.2, 2), (0.6, 1), (1.0, 1), (2.0, 1)])
def test_a_lone_search_takes_the_cores_the_others_leave(others, free):
    counters = Counters()
    room = room_of(counters)
    assert room.free_cores() == 1  # nothing measured yet
    counters.run(WINDOW_S, own=1.0, others=others)
    room.refresh()
    assert room.others == pytest.approx(others)
    assert room.free_cores() == free


def test_many_cores_less_the_busy_ones():
    counters = Counters()
    room = room_of(counters, cores=8)
    counters.run(1.0, own=1.0, others=2.5)
    room.refresh()
    assert room.free_cores() == 5  # 8 - 2.5, and 0.3 short of a sixth


def test_it_measures_again_only_after_a_window_and_follows_a_neighbour():
    counters = Counters()
    room = room_of(counters)
    counters.run(WINDOW_S, own=2.0, others=0.0)
    room.refresh()
    assert room.free_cores() == 2
    counters.run(WINDOW_S / 2, own=1.0, others=1.0)  # a neighbour starts
    room.refresh()
    assert room.free_cores() == 2  # within the window: the last measurement holds
    counters.run(WINDOW_S / 2, own=1.0, others=1.0)
    room.refresh()
    assert room.others == pytest.approx(1.0) and room.free_cores() == 1
    counters.run(WINDOW_S, own=2.0, others=0.0)  # and stops
    room.refresh()
    assert room.free_cores() == 2


def test_without_counters_a_lone_search_keeps_one_thread():
    counters = Counters()
    room = CpuRoom(4, read_busy=lambda: None, own_seconds=lambda: counters.own, clock=lambda: counters.now)
    counters.run(WINDOW_S, own=1.0, others=0.0)
    room.refresh()
    assert room.free_cores() == 1


def test_proc_stat_and_cgroup_counters(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  400 10 100 9000 50 5 5 20 0 0\n"
                    "cpu0 100 0 50 4500 25 0 0 10 0 0\n"
                    "cpu1 300 10 50 4500 25 5 5 10 7 0\n"
                    "intr 12345\n")
    tick = cpu_room.os.sysconf("SC_CLK_TCK")
    assert cpus_busy_seconds(None, str(stat)) == pytest.approx((160 + 380) / tick)  # idle and iowait left out, steal in
    assert cpus_busy_seconds({1}, str(stat)) == pytest.approx(380 / tick)
    assert cpus_busy_seconds(None, str(tmp_path / "missing")) is None
    cgroup = tmp_path / "cpu.stat"
    cgroup.write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    assert cgroup_busy_seconds(str(cgroup)) == 2.5
    assert cgroup_busy_seconds(str(tmp_path / "missing")) is None


def test_under_a_quota_narrower_than_its_cpus_the_others_are_its_cgroups(monkeypatch):
    """A pod limited to 2 cores on a 16-CPU node: what takes its quota is the processes of its cgroup (the API beside
    the engine), not the node's others; with the quota as wide as its CPUs, those CPUs' busy time."""
    monkeypatch.setattr(cpu_room.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(cpu_room, "cgroup_busy_seconds", lambda path=None: 42.0)
    monkeypatch.setattr(cpu_room, "cpus_busy_seconds", lambda cpus=None, path=None: 7.0)
    assert cpu_room.busy_reader(2)() == 42.0
    assert cpu_room.busy_reader(16)() == 7.0
