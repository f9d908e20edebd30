"""The admission rate an engine learned, kept in its socket directory for the engine that replaces it.

An engine restarted by its supervisor (it crashed, was killed, or stopped answering) serves the same models
on the same machine, and its predecessor's rate, followed from the work it did, is a better start than a
calibration: that costs up to CALIBRATION_SECONDS before the engine serves again, and it is measured at the
worst time, when whatever took the engine down may still load the machine (a calibration under load read
365x below a quiet one's). So a restarted engine starts from the remembered rate and skips the calibration,
and the rate then follows its work as before. The file lives in the supervisor's private socket directory:
a new service (a new directory) calibrates, and an operator's `admission_rate` comes before either.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("engine")
FILE = "admission_rate.json"
SAVE_INTERVAL_S = 5.0  # at most one write this often
SAVE_CHANGE = 0.02  # and only when the rate or the output ratio moved by more than this share


@dataclass(frozen=True)
class RememberedRate:
    rate: float  # decode units per second
    output_ratio: float  # output tokens per source token, as admission learned it

    @classmethod
    def load(cls, directory: str | Path) -> RememberedRate | None:
        """The previous engine's, or None (none yet, or a file that cannot be read: calibrate instead)."""
        try:
            payload = json.loads((Path(directory) / FILE).read_text())
            remembered = cls(float(payload["rate"]), float(payload["output_ratio"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("the previous engine's admission rate could not be read; calibrating", exc_info=True)
            return None
        return remembered if remembered.rate > 0 and remembered.output_ratio > 0 else None

    def save(self, directory: str | Path) -> None:
        """Written whole, then renamed: a reader never sees half of it."""
        path = Path(directory) / FILE
        partial = path.with_name(f".{FILE}.{os.getpid()}")
        partial.write_text(json.dumps({"rate": self.rate, "output_ratio": self.output_ratio}))
        os.replace(partial, path)

    def near(self, other: RememberedRate | None) -> bool:
        return other is not None and all(abs(a - b) <= SAVE_CHANGE * max(abs(b), 1e-9) for a, b in
                                         ((self.rate, other.rate), (self.output_ratio, other.output_ratio)))


class RateKeeper:
    """Saves the engine's rate every SAVE_INTERVAL_S where it moved (called from the main loop)."""

    def __init__(self, directory: str | Path, saved: RememberedRate | None = None):
        self.directory, self.saved, self._at = directory, saved, float("-inf")

    def __call__(self, rate: float, output_ratio: float, now: float) -> None:
        if now - self._at < SAVE_INTERVAL_S:
            return
        self._at = now
        current = RememberedRate(rate, output_ratio)
        if rate > 0 and not current.near(self.saved):
            try:
                current.save(self.directory)
                self.saved = current
            except OSError:  # a full disk must not stop the engine; the next engine calibrates
                log.warning("could not keep the admission rate for the next engine", exc_info=True)
