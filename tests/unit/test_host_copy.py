"""HostCopy holds a tensor as it was at its point of the device's queue, whatever runs after it; device_ids
puts ids on the device. On CUDA the copy is asynchronous (pinned memory and an event): the CUDA test
queues work behind the copy that changes the tensor and checks that the copy holds the values before it
and that waiting did not wait for that work. A join's tables go the other way the same way, and the
next join does not wait for the last one's copies (DeviceSearch's JoinTables, two halves of host memory)."""
from __future__ import annotations

import pytest
import torch

from nmt_serve.inference.device_search import JOIN_INFO, JoinTables
from nmt_serve.inference.host_copy import HostCopy, device_ids

# GPU clock cycles a queued spin takes (torch.cuda._sleep): a second or more at any GPU's clock (<= 2 GHz), where the
# host needs microseconds to reach the checks that the spin is still running
GPU_SPIN = 2 * 10**9


def test_a_copy_holds_the_values_of_its_moment():
    alive = torch.tensor([True, False, True])
    scores = torch.arange(6.0).view(2, 3)
    copy = HostCopy([alive[:2], scores[:, 1]])
    alive.fill_(False)
    scores.zero_()
    kept_alive, kept_scores = copy.wait()
    assert kept_alive.tolist() == [True, False] and kept_scores.tolist() == [1.0, 4.0]
    assert copy.wait()[0] is kept_alive  # a second wait returns the same copies


def test_device_ids():
    ids = device_ids([3, 1, 2], torch.device("cpu"))
    assert ids.dtype == torch.long and ids.tolist() == [3, 1, 2]


@pytest.mark.cuda
def test_on_cuda_the_copy_is_queued_and_the_work_behind_it_is_not_waited_for():
    device = torch.device("cuda")
    x = torch.arange(1024, device=device, dtype=torch.float32)
    copy = HostCopy([x[:4]])
    assert copy.host[0].is_pinned()
    # work behind the copy that keeps the GPU busy for a second or more (GPU_SPIN cycles), then changes x:
    # the copy must hold x as it was before it, and waiting for it must not wait for that work
    torch.cuda._sleep(GPU_SPIN)
    x.add_(1)
    kept = copy.wait()[0]
    behind = torch.cuda.Event()
    behind.record()
    assert not behind.query()  # the spin behind the copy was still running when the wait returned
    assert kept.tolist() == [0.0, 1.0, 2.0, 3.0]
    torch.cuda.synchronize()
    assert x[:4].tolist() == [1.0, 2.0, 3.0, 4.0]
    ids = device_ids([5, 6, 7], device)
    assert ids.device.type == "cuda" and ids.tolist() == [5, 6, 7]


@pytest.mark.cuda
def test_on_cuda_a_join_does_not_wait_for_the_copies_of_the_join_before():
    device = torch.device("cuda")
    tables = JoinTables(device, rows=8, max_length=16)
    torch.cuda._sleep(GPU_SPIN)  # a second or more of GPU work, then the first join's copy behind it
    tables.begin()
    tables.put([0, 1], [[5, 3], [6, 7, 3]], [(2, 4, -1, 0, 0), (3, 5, -1, 0, 0)], 3, 0)
    tables.begin()  # the second join: the other half of the host memory, nothing to wait for
    behind = torch.cuda.Event()
    behind.record()
    assert not behind.query()  # the spin and the first join's copy were still queued
    tables.put([2], [[9, 3]], [(2, 6, -1, 0, 0)], 2, 0)
    torch.cuda.synchronize()
    assert tables.table(1, 2).tolist() == [[2, 2, 6, -1, 0, 0, 9, 3]]
    tables.begin()  # the third reuses the first join's half: its copy is done
    assert tables.table(1, 2).shape == (1, JOIN_INFO + 2)
