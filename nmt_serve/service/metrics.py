"""Prometheus metrics, on a registry of the app's own (several apps in one process stay apart).

With several API workers (PROMETHEUS_MULTIPROC_DIR set by their parent) each worker writes its
values to files there and a scrape, whichever worker answers it, sums them; the engine's figures,
which every worker hears alike, are exported once.

The HTTP side (requests, latency, drops) is measured here; the engine's side (steps, occupancy,
busy share, queue, admission, tokens) comes from the statistics the engine process publishes with
its status a few times a second, exported as they were last heard (EngineCollector).
"""
from __future__ import annotations

import os
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# engine statistic -> (metric name, help); counters get Prometheus' _total suffix
ENGINE_COUNTERS = {
    "steps": ("nmt_engine_steps", "decoder steps run (one token for every running row)"),
    "step_seconds": ("nmt_engine_step_seconds", "time spent in decoder steps"),
    "join_seconds": ("nmt_engine_join_seconds", "time spent joining sentences to running batches (their encoder)"),
    "busy_seconds": ("nmt_engine_busy_seconds", "time spent computing (steps and encoders of joining sentences); "
                                                 "rate() of it is the engine's busy share"),
    "rows_computed": ("nmt_engine_rows_computed", "rows computed by steps (sentences x beams, empty slots included)"),
    "rows_live": ("nmt_engine_rows_live", "rows of running sentences computed by steps; / rows_computed = occupancy, "
                                          "1 - that = padding share"),
    "call_seconds": ("nmt_engine_call_seconds", "time spent taking calls in (checks, admission, queueing)"),
    "result_seconds": ("nmt_engine_result_seconds", "time spent turning finished sentences into replies"),
    "io_seconds": ("nmt_engine_io_seconds", "main-thread time spent passing replies to the I/O thread (pickling, ZeroMQ); "
                                                 "receiving and screening calls runs on the I/O thread, not counted here"),
    "attention_calls": ("nmt_engine_attention_calls", "attention calls answered (the `detached` check's forced decodings, /v1/attention)"),
    "attention_seconds": ("nmt_engine_attention_seconds", "time spent on attention calls (on a thread of their own beside the lanes' steps on CPU)"),
    "sentences_joined": ("nmt_engine_sentences_joined", "sentences that joined a running batch"),
    "joins": ("nmt_engine_joins", "step boundaries at which sentences joined"),
    "admitted_units": ("nmt_admitted_work_units", "work admitted, in decode units (beam x (source + expected output tokens))"),
    "refused_units": ("nmt_refused_work_units", "work refused with 503 because it could not finish before its deadline"),
    "refused_calls": ("nmt_engine_refused_calls", "calls refused by admission or a full queue"),
    "expired_calls": ("nmt_engine_expired_calls", "calls whose deadline passed in the engine"),
    "failed_calls": ("nmt_engine_failed_calls", "calls that failed in the engine"),
    "cache_hits": ("nmt_engine_cache_hits", "sentences the engine answered from its translation cache (workers > 1: "
                                            "translation_cache_entries)"),
    "shared_sentences": ("nmt_engine_shared_sentences", "sentences the engine answered with another call's translation of the "
                                                         "same, still being searched when they came (translation cache on)"),
    "wide_steps": ("nmt_engine_wide_steps", "steps a search stepped alone ran with more than one torch thread, on cores the "
                                            "other processes left idle (CPU, threads 0)"),
    "gc_seconds": ("nmt_engine_gc_seconds", "time the engine process spent in Python's cyclic garbage collector since it "
                                            "was ready (every thread waits meanwhile)"),
    "gc_full_collections": ("nmt_engine_gc_full_collections", "full collections of the engine process since it was ready"),
}
ENGINE_GAUGES = {
    "waiting_sentences": ("nmt_queue_depth", "sentences waiting to join a batch"),
    "running_sentences": ("nmt_engine_running_sentences", "sentences in running batches"),
    "calls_in_flight": ("nmt_engine_calls_in_flight", "calls admitted and not finished"),
    "pending_units": ("nmt_pending_work_units", "admitted decode units not finished yet"),
    "rate_units_per_second": ("nmt_engine_rate_units_per_second", "measured decode units per second (what admission predicts with)"),
    "busy_share": ("nmt_engine_busy_share", "share of the last seconds the engine spent computing"),
    "rows_per_step": ("nmt_engine_rows_per_step", "rows of running sentences per step, recent average (batch occupancy)"),
    "padding_share": ("nmt_engine_padding_share", "share of computed rows that were empty slots, recent average"),
    "step_ms": ("nmt_engine_step_milliseconds", "time of one decoder step, recent average"),
    "lone_search_threads": ("nmt_engine_lone_search_threads", "torch threads a search stepped alone takes now: the usable "
                                                              "cores less those other processes keep busy (CPU, threads 0)"),
    "other_processes_cores": ("nmt_engine_other_processes_cores", "cores the other processes kept busy over the last half "
                                                                  "second, of those the engine may run on (CPU, threads 0)"),
    "device_memory_bytes": ("nmt_device_memory_bytes", "GPU memory allocated by torch in the engine"),
    "uptime_seconds": ("nmt_engine_uptime_seconds", "seconds since this engine's models were loaded"),
    "startup_seconds": ("nmt_engine_startup_seconds", "seconds this engine took from its process's start to serving "
                                                      "(importing torch, loading, checking and timing its models)"),
    "gc_frozen_objects": ("nmt_engine_gc_frozen_objects", "objects start-up built (models, modules, captured programs) that "
                                                          "the garbage collector no longer walks"),
}
MODEL_COUNTERS = {
    "source_tokens": ("nmt_source_tokens", "source tokens translated"),
    "generated_tokens": ("nmt_generated_tokens", "target tokens generated (best hypotheses)"),
    "sentences": ("nmt_sentences", "sentences translated"),
}


class EngineCollector:
    """Exports the engine's last published statistics."""

    def __init__(self) -> None:
        self.stats: dict[str, float] = {}
        self.model_stats: dict[str, dict[str, float]] = {}
        self.up = False
        self.ready = 0  # engines ready
        self.stalled = 0  # of those, engines silent past EnginePool's STALE_S
        self.restarts = 0
        # read at each scrape where set (the engine client's view: it knows at once when an engine is lost,
        # where the last status, from before, would still say up): (engines ready, of those stalled, losses)
        self.liveness: Callable[[], tuple[int, int, int]] | None = None
        # where set (several engines), read at each scrape: their statistics merged, rather than at every status
        self.statistics: Callable[[], tuple[dict[str, float], dict[str, dict[str, float]]]] | None = None

    def collect(self):
        if self.liveness is not None:
            self.ready, self.stalled, self.restarts = self.liveness()
            self.up = self.ready > 0
        if self.statistics is not None:
            self.stats, self.model_stats = self.statistics()
        for key, (name, doc) in ENGINE_COUNTERS.items():
            if key in self.stats:
                yield CounterMetricFamily(name, doc, value=self.stats[key])
        for key, (name, doc) in ENGINE_GAUGES.items():
            if key in self.stats:
                yield GaugeMetricFamily(name, doc, value=self.stats[key])
        for key, (name, doc) in MODEL_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=["model"])
            for model, values in sorted(self.model_stats.items()):
                family.add_metric([model], values.get(key, 0.0))
            yield family
        yield GaugeMetricFamily("nmt_engine_up", "1 while an engine process answers and is ready", value=float(self.up))
        yield GaugeMetricFamily("nmt_engines_ready", "engine processes that answer and are ready (Settings.engines)", value=float(self.ready))
        yield GaugeMetricFamily("nmt_engines_stalled", "of the ready engines, those silent for over a second (stopped, starved "
                                "of CPU, stuck in a long step); with several engines new calls pass them by, and after "
                                "engine_stall_s the calls they hold go to the others", value=float(self.stalled))
        yield CounterMetricFamily("nmt_engine_restarts", "times an engine was lost (died or stopped answering)", value=self.restarts)


class JobsCollector:
    """The jobs kept in the jobs directory by state, counted at each scrape (any API process sees them all:
    the directory is shared)."""

    def __init__(self) -> None:
        self.counts: Callable[[], dict[str, int]] | None = None

    def collect(self):
        family = GaugeMetricFamily("nmt_jobs", "jobs kept in the jobs directory, by state (finished ones until job_ttl_s)",
                                   labels=["state"])
        for state, count in (self.counts() if self.counts is not None else {}).items():
            family.add_metric([state], count)
        yield family


class Metrics:
    def __init__(self) -> None:
        r = CollectorRegistry()
        self.requests = Counter("nmt_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r)
        self.latency = Histogram("nmt_request_latency_seconds", "HTTP request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("nmt_requests_in_flight", "HTTP requests being served", registry=r, multiprocess_mode="livesum")
        self.model_load_seconds = Gauge("nmt_model_load_seconds", "time taken to load each model", ["model"], registry=r,
                                        multiprocess_mode="max")
        self.dropped = Counter("nmt_dropped_requests", "requests given up before their result (timeout or client disconnect)", ["reason"], registry=r)
        self.refused_early = Counter("nmt_refused_early_requests", "requests refused with 503 by this API process, before "
                                     "tokenizing them, because the engine's last status showed more work than fits their deadline", registry=r)
        self.flags = Counter("nmt_translation_flags", "translated sentences flagged as doubtful, by flag (see quality.py)",
                             ["flag"], registry=r)
        self.job_texts = Counter("nmt_job_texts", "texts translated by jobs (counted once their chunk is written)", registry=r)
        self.pivoted = Counter("nmt_pivoted_texts", "texts translated through the pivot language (two translations), "
                               "their direction served by no model itself", registry=r)
        self.cache = Counter("nmt_translation_cache_sentences", "sentences answered without the engine (hit: a repeat "
                             "within the call, or kept by the translation cache; shared: in flight for another call, with the "
                             "cache on) or translated by it (miss)", ["result"], registry=r)
        self.resent = Counter("nmt_engine_calls_resent", "calls sent again to another engine after theirs was lost with them, or stalled "
                              "(Settings.engines > 1)", registry=r)
        self.engine = EngineCollector()
        self.jobs = JobsCollector()
        shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if shared:
            self.registry = CollectorRegistry()  # what a scrape reads: every worker's files, summed
            MultiProcessCollector(self.registry, path=shared)
        else:
            self.registry = r
        self.registry.register(self.engine)
        self.registry.register(self.jobs)
