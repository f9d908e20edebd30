"""bench.real_shapes, which the GPU script's shapes stage runs: a random OPUS-MT at its real shape, converted,
decodes as transformers' generate does, and the report has every setting and one sentence's latency."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_random_opus_mt_decodes_as_generate_and_the_report_has_every_setting(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.real_shapes", "--shape", "opus-mt", "--batch", "3", "--sentences-b1", "2",
                           "--max-new-tokens", "4", "--threads", "1", "--work", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines() if line.startswith("| ")]
    settings = [r for r in rows if r[0].startswith(("greedy,", "beam 4,"))]
    assert [(r[0], r[1]) for r in settings] == [(f"{s}, batch {b}, {n} sentences", e) for s, b, n in
                                                (("greedy", 1, 2), ("beam 4", 1, 2), ("greedy", 3, 3), ("beam 4", 3, 3))
                                                for e in ("ours", "transformers")]
    assert all(r[4] == ("reference" if r[1] == "ours" else "identical") for r in settings)
    latency = [r for r in rows if r[0] in ("greedy", "beam 4")]
    assert len(latency) == 4 and all(float(r[2]) <= float(r[3]) for r in latency)  # p50 <= p99
    from bench import real_shapes  # refused before any model is built: in this process

    with pytest.raises(SystemExit, match="CTranslate2"):
        real_shapes.main(["--shape", "opus-mt", "--engines", "CTranslate2 int8"])
