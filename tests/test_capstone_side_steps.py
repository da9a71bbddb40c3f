"""The staging of notebook 20's passes (`course.capstone.side_steps`): a pass's ints reach torch
unchanged, and host-made inputs sent through the pinned ring reach the device buffer in stream
order, each pass reading its own, however far the host runs ahead of the GPU."""

from __future__ import annotations

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone.side_steps import PinnedRing, host_ints
from course.core import runtime


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_host_ints_hold_the_values(dtype):
    values = [0, -1, 7, 2**31 - 1, -(2**31)]
    got = host_ints(values, dtype)
    assert got.dtype == dtype and got.tolist() == values


def _sends(device: str, slots: int, passes: int) -> list[torch.Tensor]:
    """What each of `passes` consumers, queued after each send, read from the ring's target."""
    target = torch.zeros((3, 4), dtype=torch.float64, device=device)
    ring = PinnedRing(target, slots)
    seen = []
    for k in range(passes):
        rows = 1 + k % 3
        ring.send(rows, lambda buffer, k=k: buffer.fill_(float(k)))
        seen.append(target[:rows].clone())  # queued behind the copy, as a pass's graph is
    return seen


def test_each_send_reaches_the_target_in_order():
    seen = _sends(runtime.torch_device(), 2, 7)
    for k, got in enumerate(seen):
        assert got.shape == (1 + k % 3, 4) and bool((got.cpu() == k).all())


@pytest.mark.skipif(not runtime.on_gpu(), reason="pinned memory and asynchronous copies need a GPU")
def test_on_a_gpu_the_host_runs_ahead_and_every_pass_reads_its_own():
    """A long kernel first, so that the host queues every send before the GPU reaches the first:
    a slot must not be refilled before its copy has run."""
    ahead = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):
        ahead = ahead @ ahead.T / 4096
    seen = _sends("cuda", 2, 9)
    torch.cuda.synchronize()
    assert [int(got[0, 0]) for got in seen] == list(range(9))
