"""Prometheus metrics, on a registry of the app's own (several apps in one process stay apart)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("nmt_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r)
        self.latency = Histogram("nmt_request_latency_seconds", "HTTP request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("nmt_requests_in_flight", "HTTP requests being served", registry=r)
        self.queue_wait = Histogram("nmt_queue_wait_seconds", "time a sentence waits before its batch starts", buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("nmt_queue_depth", "sentences waiting for a batch", registry=r)
        self.batch_sentences = Histogram("nmt_batch_sentences", "sentences per model batch", buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("nmt_batch_tokens", "source tokens per model batch", buckets=SIZE_BUCKETS, registry=r)
        self.batches = Counter("nmt_batches", "model batches run", ["model"], registry=r)
        self.source_tokens = Counter("nmt_source_tokens", "source tokens translated", ["model"], registry=r)
        self.generated_tokens = Counter("nmt_generated_tokens", "target tokens generated (best hypotheses)", ["model"], registry=r)
        self.model_load_seconds = Gauge("nmt_model_load_seconds", "time taken to load each model", ["model"], registry=r)
        self.dropped = Counter("nmt_dropped_requests", "requests given up before their result (timeout or client disconnect)", ["reason"], registry=r)
        self.admitted_units = Counter("nmt_admitted_work_units", "work admitted, in decode units (beam x (source + expected output tokens))", registry=r)
        self.refused_units = Counter("nmt_refused_work_units", "work refused with 503 because it could not finish before its deadline", registry=r)
        self.engine_rate = Gauge("nmt_engine_rate_units_per_second", "measured decode units per second (what admission predicts with)", registry=r)
        self.pending_units = Gauge("nmt_pending_work_units", "admitted decode units not finished yet", registry=r)
        self.device_memory = Gauge("nmt_device_memory_bytes", "GPU memory allocated by torch", ["device"], registry=r)

    def update_device_memory(self) -> None:
        import torch

        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                self.device_memory.labels(device=f"cuda:{i}").set(torch.cuda.memory_allocated(i))
