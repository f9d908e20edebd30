"""The rows a model card measures, kept beside the checkpoint as each one is measured: a measurement cut
short (a converted NLLB-200 on a CPU measures for hours) starts again where it stopped, as long as its
settings and the weights are the same. The file goes once the card is written."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

PARTIAL = "model_card.partial.json"


def row_key(row: dict) -> tuple:
    """What a row measured: the same key is the same measurement (the direction is None for a bilingual model)."""
    return (row.get("direction"), row["split"], row["beam_size"], row.get("pivot"), row.get("quantization", "none"))


class MeasuredRows:
    def __init__(self, directory: Path | None = None, settings: dict | None = None):
        """directory None: nothing is kept (the rows live in memory only)."""
        self.path = directory / PARTIAL if directory is not None else None
        self.rows: list[dict] = []
        if self.path is None:
            return
        weights = directory / "model.safetensors"
        # the weights' size and time: a checkpoint trained or converted again since is measured again
        self.settings = {**(settings or {}), "weights": [weights.stat().st_size, weights.stat().st_mtime_ns]}
        if not self.path.is_file():
            return
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            saved = {}
        if saved.get("settings") == self.settings:
            self.rows = saved.get("rows", [])
            print(f"{self.path}: {len(self.rows)} rows an earlier run measured are kept; measuring the rest", flush=True)
        else:
            print(f"{self.path}: an earlier run's rows, of other settings or weights: measuring anew", flush=True)

    def row(self, key: dict, measure: Callable[[], dict]) -> dict:
        """The row of `key` ({split, beam_size, and direction, pivot, quantization where they apply}): kept from
        an earlier run, or measured now (`measure` returns the whole row) and kept at once."""
        wanted = row_key(key)
        found = next((r for r in self.rows if row_key(r) == wanted), None)
        if found is not None:
            return found
        row = measure()
        self.rows.append(row)
        if self.path is not None:
            scratch = self.path.with_suffix(".tmp")
            scratch.write_text(json.dumps({"settings": self.settings, "rows": self.rows}, indent=1) + "\n")
            os.replace(scratch, self.path)  # a run killed while writing leaves the last whole file
        return row

    def done(self) -> None:
        """The card is written: nothing to resume."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
