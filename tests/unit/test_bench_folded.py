"""bench.folded: py-spy's raw stacks summed per frame, once per stack and as the innermost frame."""
from bench.folded import frame_name, summarize


def test_frames_are_counted_once_per_stack_and_as_the_innermost():
    raw = ["main (a/run.py:3);step (b/core.py:10);step (b/core.py:12);matmul (c/ops.py:5) 6\n",
           "main (a/run.py:3);poll (d/zmq.py:1) 2\n",
           "garbage\n"]
    out = summarize(raw, top=10)
    assert out.startswith("8 samples")
    inclusive, own = out.split("self:")
    assert "100.0%  main run.py" in inclusive and " 75.0%  step core.py" in inclusive  # recursion counted once
    assert " 75.0%  matmul ops.py" in own and " 25.0%  poll zmq.py" in own
    assert frame_name("process 12") == "process 12" and frame_name("run (x/y/core.py:7)") == "run core.py"


def test_within_keeps_the_stacks_through_a_frame_from_that_frame_in():
    raw = ["main (a/run.py:3);load (a/run.py:9);step (b/core.py:10) 5\n",
           "main (a/run.py:3);measured (a/run.py:20);step (b/core.py:10);wait (c/copy.py:4) 3\n",
           "main (a/run.py:3);measured (a/run.py:20);pad (d/masks.py:2) 1\n"]
    out = summarize(raw, top=10, within="measured run.py")
    assert out.startswith("4 samples")
    inclusive, own = out.split("self:")
    assert "100.0%  measured run.py" in inclusive and "main run.py" not in inclusive and "load run.py" not in inclusive
    assert " 75.0%  wait copy.py" in own and " 25.0%  pad masks.py" in own
    assert summarize(raw, within="absent x.py") == "no samples"
