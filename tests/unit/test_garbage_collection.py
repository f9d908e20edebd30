"""The serving processes' start-up heap out of the garbage collector's reach, and its pauses counted."""
from __future__ import annotations

import gc

from nmt_serve.garbage_collection import CollectorClock, freeze_startup_heap


def test_freezing_takes_live_objects_out_of_the_collectors_reach_and_collects_the_dead_first():
    class Node:
        pass

    collected = []
    gc.callbacks.append(lambda phase, info: collected.append(info.get("collected", 0)) if phase == "stop" else None)
    try:
        alive, dead = Node(), Node()
        alive.me, dead.me = alive, dead  # cycles: only the collector frees the dead one
        del dead
        frozen = freeze_startup_heap()
        assert sum(collected) >= 1  # the dead cycle, before the freeze
        assert frozen == gc.get_freeze_count() > 0
        assert not any(o is alive for o in gc.get_objects())  # frozen objects are not walked
    finally:
        gc.callbacks.pop()
        gc.unfreeze()  # the rest of the test session's objects stay collectable
    assert any(o is alive for o in gc.get_objects())


def test_the_clock_counts_the_time_in_collections_and_the_full_ones():
    clock = CollectorClock().start()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        clock.stop()
    assert clock.full_collections == 2
    assert clock.seconds > 0
    gc.collect(2)
    assert clock.full_collections == 2  # stopped
