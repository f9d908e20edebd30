"""Admission by predicted work: refuse at once what could not finish before its deadline.

A queue bounded by a sentence count admits more work than the engine can finish when the sentences
are long or the beams wide: under a flood every admitted request then waits past its deadline, the
engine computes translations nobody receives, and everyone gets 504. Here each request's cost is
estimated in decode units, beam x (source tokens + expected output tokens) per text, and the engine's
rate in units per second is measured as the engine works (a moving average over windows of its busy
time, seeded by a calibration batch at start-up). A request is admitted when the work already admitted and not yet done, plus its
own, would finish at that rate within `margin` of its deadline; otherwise it gets 503 with a
Retry-After of when the work ahead of it should have drained. A request that finds nothing ahead of
it is always admitted (its own deadline still bounds it). So admitted work completes, and a flood
gets fast refusals while the engine keeps delivering at its capacity.

Background work (a job's chunks, protocol.BACKGROUND) yields to interactive calls in the engine's
queue, so it is not counted ahead of them: an interactive call's wait is predicted from the interactive
work admitted, a background call's from all of it. `pending` (what the status reports, and the API
refuses early by) is the interactive work.
"""
from __future__ import annotations

import math
import threading

# expected output tokens per source token before any batch was measured (Multi30k de<->en is ~1:1)
OUTPUT_RATIO = 1.1
SMOOTHING = 0.3  # weight of the newest batch in the moving averages


class Admission:
    def __init__(self, rate: float, margin: float = 0.8):
        """rate: decode units per second to assume until batches are measured; margin: the share of a
        request's deadline that the predicted wait may take."""
        self.rate = max(rate, 1e-6)
        self.margin = margin
        self.output_ratio = OUTPUT_RATIO
        self.pending = 0.0  # interactive units admitted and not finished
        self.background = 0.0  # background units admitted and not finished
        self.admitted_units = 0.0
        self.refused_units = 0.0
        # the engine process admits on its I/O thread and releases and learns on its main thread
        self.lock = threading.RLock()

    @staticmethod
    def units(texts: int, source_tokens: float, output_tokens: float, beam_size: int) -> float:
        """Decode units: source and output tokens (plus bos/eos per text), times the beam."""
        return float(beam_size * (source_tokens + output_tokens + 2 * texts))

    def cost(self, token_counts: list[int], beam_size: int) -> float:
        """Decode units of one request, its output expected at the learned output/source ratio."""
        source = sum(token_counts)
        return self.units(len(token_counts), source, self.output_ratio * source, beam_size)

    def admit(self, cost: float, timeout: float, background: bool = False) -> float | None:
        """Admit `cost` units (returns None) or refuse them: returns the seconds after which a retry
        should find room (the Retry-After)."""
        with self.lock:
            ahead = self.pending + (self.background if background else 0.0)
            if ahead > 0 and (ahead + cost) / self.rate > self.margin * timeout:
                self.refused_units += cost
                return max(1.0, math.ceil(ahead / self.rate))
            if background:
                self.background += cost
            else:
                self.pending += cost
            self.admitted_units += cost
            return None

    def release(self, cost: float, background: bool = False) -> None:
        """The work of an admitted request is over (done, failed or dropped)."""
        with self.lock:
            if background:
                self.background = self.background - cost if self.background - cost >= 1e-6 else 0.0
            else:  # float sums of costs do not cancel exactly
                self.pending = self.pending - cost if self.pending - cost >= 1e-6 else 0.0

    def observe(self, texts: int, source_tokens: int, output_tokens: int, beam_size: int, seconds: float) -> None:
        """A batch ran: learn the engine's rate and the output/source length ratio."""
        self.learn(self.units(texts, source_tokens, output_tokens, beam_size), seconds, source_tokens, output_tokens)

    def learn(self, units: float, seconds: float, source_tokens: int, output_tokens: int) -> None:
        """`units` of work finished in `seconds` of engine time, from so many source and output tokens."""
        if seconds <= 0 or source_tokens <= 0:
            return
        with self.lock:
            self.rate += SMOOTHING * (units / seconds - self.rate)
            self.output_ratio += SMOOTHING * (output_tokens / source_tokens - self.output_ratio)
