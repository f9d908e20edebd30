"""The machine a training run or a measurement ran on, as the model card names it."""
from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """"AMD EPYC 9B14, 2 cores": the CPU's model name (/proc/cpuinfo) and how many cores this process sees."""
    model = platform.processor() or platform.machine()
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"
