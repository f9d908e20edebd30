"""bench.routing_cost, which backs cpu_cost_limit's default in BENCHMARKS.md: every shape runs the same forced
number of steps, and the table gives each shape's decode_cost beside its latency."""
from __future__ import annotations

from bench.routing_cost import main, shape_configs
from nmt_serve.network.routing import decode_cost


def test_the_shapes_are_the_shipped_the_gpu_recipes_and_opus_mts():
    configs = shape_configs()
    assert round(decode_cost(configs["gpu-recipe"]) / decode_cost(configs["shipped"]), 2) == 2.96
    assert configs["opus-mt"].d_model == 512 and configs["opus-mt"].tgt_vocab_size == 58101


def test_the_benchmark_times_each_shape_and_reports_both_ratios(tmp_path, capsys):
    out = tmp_path / "report.md"
    assert main(["--shapes", "shipped,gpu-recipe", "--sentences", "2", "--rounds", "1", "--tokens", "3", "--output", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| shipped") or line.startswith("| gpu-recipe")]
    assert len(rows) == 2
    shipped, recipe = ([c.strip() for c in row.strip("|").split("|")] for row in rows)
    assert shipped[3] == "1.00" and shipped[5] == "1.00" and recipe[3] == "2.96"
    assert float(recipe[5]) > 0  # a latency ratio was measured (its size is this machine's)
