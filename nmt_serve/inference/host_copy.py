"""Small tensors between host and device without waiting for the device's queue.

A GPU search queues its steps and reads back, every few steps, which sentences still run and what the
finished ones found. A plain read (`tensor.tolist()`, `torch.tensor(values, device=...)`) synchronizes the
stream: the host waits for everything queued, the step just launched included, and the GPU then waits
while the host works on what it read. Here a read is a copy into pinned memory queued behind the work
before it, with an event: `wait()` waits for that point of the queue only, so a step queued after the copy
keeps the GPU busy while the host waits and then works (DeviceSearch's and ContinuousDeviceSearch's
`lookahead`). Ids going the other way are copied from pinned memory, asynchronously, for the same reason.
Off CUDA, work is done when it is queued: the copies are made at once.
"""
from __future__ import annotations

from typing import Sequence

import torch


class HostCopy:
    """Copies of device tensors on the host, as they are at this point of the device's queue."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        device = tensors[0].device
        self._event = None
        if device.type != "cuda":
            self.host = [t.clone() for t in tensors]  # the originals may be views that later steps change
            return
        self.host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for host, t in zip(self.host, tensors):
            host.copy_(t, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(device))

    def wait(self) -> list[torch.Tensor]:
        """The host copies, once the device has made them (the work queued after them may still run)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self.host


def device_ids(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """A long tensor of these values on the device, its copy queued rather than waited for (from pinned
    memory on CUDA: a copy from pageable memory would wait for the whole queue)."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
