"""The API process's connections to the server's engine processes (Settings.engines; one by default).

Every engine loads the same models (one that restarted after the directory changed, or one on a GPU with less
room, may serve others: a call goes only to engines whose status names its model). A call goes to the ready
engine with the least of this process's work in it, the source tokens of its calls (each API process sees only
its own, and the engines' statuses are up to a status interval old; a long text weighs what its sentences do,
where a count of calls would weigh it as one short sentence). A lost engine fails the calls it held;
EngineClient sends those again to another ready engine (a translation has no side effects, so doing one twice
costs time, not correctness), and the calls after it go to the others while it restarts: with two engines or
more, an engine's death answers no request with 503. An engine silent for a second (stopped, starved, stuck in
a long step) is passed over for new calls while another answers, long before its heartbeat says it is lost; once
it has been silent for `stall_s` (Settings.engine_stall_s), the calls it holds go to another engine too, each once.
Where the engines keep the translation cache (several API workers), a call goes to its content's own engine, the
same from every API process, so that a repeat finds the engine that keeps it.
The engines' statistics are one set for /metrics: counters and amounts added up, the recent averages (busy
share, rows per step, step time) averaged.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Iterable

from nmt_serve.engine.protocol import EngineStatus
from nmt_serve.service.engine_connection import EngineConnection, EngineUnavailable

log = logging.getLogger("nmt_serve.service.engine_calls")
# An engine whose last status is older than this is passed over while another has spoken since: it sends one
# every STATUS_INTERVAL_S (0.1 s) from its loop, so it is stalled (stopped, starved of CPU, inside a step that
# long). It is not lost (the heartbeat decides that, much later); a call sent to it would wait with it.
STALE_S = 1.0
STALL_CHECK_S = 0.25  # how often the engines' silence is looked at for calls to move (stall_s)
# where the engines keep a translation cache, a call goes to its content's own engine while that engine has at most
# this much more work in flight (source tokens) than the least busy: about ten short sentences
AFFINITY_SLACK = 256.0
# statistics of one engine's recent work, averaged over the engines rather than added up
AVERAGED = frozenset({"busy_share", "rows_per_step", "padding_share", "step_ms"})
# since the youngest engine's start; the cores the others left the engine that sees the fewest of them busy
LEAST = frozenset({"uptime_seconds", "other_processes_cores"})
MOST = frozenset({"startup_seconds", "lone_search_threads"})  # the slowest engine's; the most threads a lone search takes


def merged_stats(stats: Iterable[dict[str, float]]) -> dict[str, float]:
    """One engine's statistics from several engines' (EngineStatus.stats, or a model's model_stats)."""
    stats = list(stats)
    if len(stats) == 1:
        return stats[0]
    merged: dict[str, float] = {}
    for key in {k for s in stats for k in s}:
        values = [s[key] for s in stats if key in s]
        if key in AVERAGED:
            merged[key] = sum(values) / len(values)
        elif key in LEAST:
            merged[key] = min(values)
        elif key in MOST:
            merged[key] = max(values)
        else:
            merged[key] = sum(values)
    return merged


def affinity_key(sources: list[list[int]]) -> int:
    """A call's content as one number, the same in every API process (ints and tuples of them hash without the
    per-process seed of strings): a repeat of the call gets the same key."""
    return hash(tuple(map(tuple, sources)))


class EnginePool:
    """The engines' connections: which one a call goes to, and their state as one."""

    def __init__(self, connections: list[EngineConnection], stall_s: float = 0.0):
        """stall_s: an engine silent this long has the calls it holds taken to the others (move_stalled); 0: never."""
        assert connections, "at least one engine"
        self.connections = connections
        self.stall_s = stall_s
        self._watch: asyncio.Task | None = None
        self._models: dict[int, tuple[str, frozenset[str]]] = {}  # per engine: (incarnation, the models it serves)

    def __len__(self) -> int:
        return len(self.connections)

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        for connection in self.connections:
            await connection.start()
        if len(self.connections) > 1 and self.stall_s > 0:
            self._watch = asyncio.create_task(self._watch_stalls(), name="engine-stalls")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            try:
                await self._watch
            except asyncio.CancelledError:
                pass
        for connection in self.connections:
            await connection.stop()

    async def _watch_stalls(self) -> None:
        while True:
            await asyncio.sleep(min(STALL_CHECK_S, self.stall_s / 4))
            try:
                self.move_stalled()
            except Exception:  # noqa: BLE001 - the watch goes on: the next look may move them
                log.exception("the calls of a stalled engine could not be moved")

    def move_stalled(self) -> int:
        """The calls waiting on a ready engine silent for stall_s (stopped, starved, stuck in a step: not yet lost,
        which its heartbeat decides much later) that another engine still speaking serves: failed there, so that their
        callers send them to it (EngineClient: a call that was already sent again stays where it is). The stalled
        engine drops their work when it runs again. The number of calls moved."""
        now = time.monotonic()
        speaking = [i for i, c in enumerate(self.connections) if c.ready and now - c.last_status_at < self.stall_s]
        moved = 0
        for i, connection in enumerate(self.connections):
            silent = now - connection.last_status_at
            if not connection.in_flight or not connection.ready or silent < self.stall_s or not speaking:
                continue
            n = connection.move_waiting(lambda model: any(self.serves(j, model) for j in speaking),
                                        f"engine {i} has been silent for {silent:.1f}s")
            if n:
                log.warning("engine %d has been silent for %.1fs: %d of its waiting calls go to the others", i, silent, n)
            moved += n
        return moved

    async def wait_for_settled(self, timeout: float) -> bool:
        """Wait (up to timeout seconds) until some engine has said that it serves, or that its models cannot load."""
        waits = [asyncio.ensure_future(c.wait_for_settled(timeout)) for c in self.connections]
        try:
            for finished in asyncio.as_completed(waits):
                if await finished:
                    return True
            return False
        finally:
            for wait in waits:
                wait.cancel()

    def engine_lost(self, index: int, why: str, *, down: bool = False) -> None:
        """Engine `index` is gone (its supervisor saw its process exit): its waiting calls fail."""
        self.connections[index].engine_lost(why, down=down)

    # ------------------------------------------------------------------ state
    @property
    def ready(self) -> bool:
        return any(c.ready for c in self.connections)

    @property
    def losses(self) -> int:
        """Times an engine was lost while this process ran, all engines together."""
        return sum(c.losses for c in self.connections)

    @property
    def status(self) -> EngineStatus | None:
        """The status that says how the server stands: a ready engine's, else the first heard of."""
        ready = self.ready_statuses()
        return ready[0] if ready else next((c.status for c in self.connections if c.status is not None), None)

    def stalled(self) -> int:
        """Ready engines silent for over STALE_S: new calls pass them by while another speaks."""
        now = time.monotonic()
        return sum(1 for c in self.connections if c.ready and now - c.last_status_at >= STALE_S)

    def ready_statuses(self) -> list[EngineStatus]:
        return [c.status for c in self.connections if c.ready]

    def stats(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """The engines' last statistics, and each model's, merged (merged_stats) over the engines heard of."""
        statuses = [c.status for c in self.connections if c.status is not None]
        if not statuses:
            return {}, {}
        models = {m for s in statuses for m in s.model_stats}
        return (merged_stats(s.stats for s in statuses),
                {m: merged_stats(s.model_stats[m] for s in statuses if m in s.model_stats) for m in sorted(models)})

    def in_flight(self) -> int:
        """This process's calls waiting on an engine."""
        return sum(c.in_flight for c in self.connections)

    def pending_ids(self) -> set:
        """The ids of this process's calls waiting on an engine."""
        return {call_id for c in self.connections for call_id in c.pending_ids()}

    # ------------------------------------------------------------------ calls
    def serves(self, index: int, model_id: str) -> bool:
        """Whether engine `index`'s last status names the model (engines load the same directory with the same
        settings, but one that restarted after it changed, or one on a GPU with less room, may serve others)."""
        status = self.connections[index].status
        kept = self._models.get(index)
        if kept is None or kept[0] != status.incarnation:
            kept = self._models[index] = (status.incarnation, frozenset(m["id"] for m in status.models))
        return model_id in kept[1]

    def serving(self, model_id: str) -> int:
        """The ready engines that serve the model."""
        n = len(self.connections)
        return sum(1 for i, c in enumerate(self.connections) if c.ready and (n == 1 or self.serves(i, model_id)))

    def pick(self, avoid: EngineConnection | None = None, model_id: str | None = None, key: int | None = None) -> EngineConnection:
        """The ready engine with the least of this process's work in flight (not `avoid`, the one that just lost
        a call, where another is ready; only those that serve `model_id`), among those heard from within STALE_S
        where there are any; EngineUnavailable if none is ready. key: the call's content (`affinity_key`), where the
        engines keep a translation cache: the call goes to that content's own engine among the candidates, the same
        in every API process, unless that engine has AFFINITY_SLACK more work in flight than the least busy."""
        n = len(self.connections)
        if n == 1:
            if not self.connections[0].ready:
                raise EngineUnavailable("the engine is not ready")
            return self.connections[0]
        now = time.monotonic()
        best, best_fresh, home, home_rank = None, False, None, None
        # ties go to the first engine: one request at a time then runs on one engine, whose search stepping alone takes
        # the cores the others leave idle (engine/cpu_room.py); taken in turn, every engine saw the others use them
        for index, c in enumerate(self.connections):
            if not c.ready or c is avoid or (model_id is not None and not self.serves(index, model_id)):
                continue
            fresh = now - c.last_status_at < STALE_S
            if best is None or (fresh, -c.work_in_flight) > (best_fresh, -best.work_in_flight):
                best, best_fresh = c, fresh
            if key is not None and fresh:
                # rendezvous hashing: an engine that comes or goes moves only the content whose own engine it is
                rank = hash((key, index))  # a tuple of ints hashes alike in every process
                if home_rank is None or rank > home_rank:
                    home, home_rank = c, rank
        if best is None:
            raise EngineUnavailable(f"no ready engine serves {model_id}" if model_id is not None and self.ready else "no engine is ready")
        if home is not None and home.work_in_flight <= best.work_in_flight + AFFINITY_SLACK:
            return home
        return best
