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
