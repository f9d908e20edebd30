"""The serving processes' start-up heap out of the garbage collector's reach, and its pauses counted."""
from __future__ import annotations

import gc

from nmt_serve.garbage_collection import YOUNG_THRESHOLD, CollectorClock, freeze_startup_heap, rarer_young_collections


def test_freezing_takes_live_objects_out_of_the_collectors_reach_and_collects_the_dead_first():
    class Node:
        pass

    collected = []

    def count(phase, info):
        if phase == "stop":
            collected.append(info.get("collected", 0))

    gc.callbacks.append(count)
    try:
        alive, dead = Node(), Node()
        alive.me, dead.me = alive, dead  # cycles: only the collector frees the dead one
        del dead
        frozen = freeze_startup_heap()
        assert sum(collected) >= 1  # the dead cycle, before the freeze
        # a frozen object freed by its reference count leaves the permanent generation: the count only falls
        assert 0 < gc.get_freeze_count() <= frozen
        assert not any(o is alive for o in gc.get_objects())  # frozen objects are not walked
    finally:
        gc.callbacks.remove(count)
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


def test_young_collections_are_made_rarer_and_a_higher_threshold_is_kept():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        rarer_young_collections()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        gc.set_threshold(YOUNG_THRESHOLD * 5, 3, 4)
        rarer_young_collections()
        assert gc.get_threshold() == (YOUNG_THRESHOLD * 5, 3, 4)
    finally:
        gc.set_threshold(*before)
