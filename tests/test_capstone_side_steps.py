"""The staging of notebook 20's passes: a pass's ints reach torch unchanged
(`course.capstone.side_steps`), and the parallel draft's pool of Gumbel uniforms
(`course.capstone.side_steps.UniformPool`) hands each pass the rows the host's generator yields for
it one pass at a time, across refills, however far the host runs ahead of the GPU."""

from __future__ import annotations

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone.side_steps import UniformPool, host_ints
from course.core import runtime

VOCAB = 5


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_host_ints_hold_the_values(dtype):
    values = [0, -1, 7, 2**31 - 1, -(2**31)]
    got = host_ints(values, dtype)
    assert got.dtype == dtype and got.tolist() == values


def _passes(device, sizes: list[tuple[int, int]], pool_bytes: int, monkeypatch) -> list[torch.Tensor]:
    """What each pass (n rows, skip first) takes from a pool, as a pass's graph would, queued in order."""
    monkeypatch.setattr(UniformPool, "BYTES", pool_bytes)
    pool = UniformPool(4, VOCAB, torch.Generator().manual_seed(7), device)
    pool.restart()
    taken = []
    for n, skip in sizes:
        pool.reserve(n + skip)
        taken.append(pool.take(n, skip).clone())
    return taken


def _expected(sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The rows drawn one pass at a time, as `sides.DraftSide` draws them."""
    gen = torch.Generator().manual_seed(7)
    return [torch.rand((n + skip, VOCAB), generator=gen, dtype=torch.float64)[skip:] for n, skip in sizes]


SIZES = [(1, 0), (3, 0), (1, 1), (4, 0), (2, 0), (3, 1), (1, 0), (4, 0), (2, 1), (3, 0)]


@pytest.mark.parametrize("pool_bytes", [1, 8 * VOCAB * 9, 1 << 20])  # a refill every pass, some, none
def test_each_pass_takes_the_rows_drawn_for_it(monkeypatch, pool_bytes):
    taken = _passes(runtime.torch_device(), SIZES, pool_bytes, monkeypatch)
    for got, want in zip(taken, _expected(SIZES), strict=True):
        assert torch.equal(got.cpu(), want)


@pytest.mark.skipif(not runtime.on_gpu(), reason="asynchronous copies need a GPU")
def test_on_a_gpu_the_host_runs_ahead_and_every_pass_reads_its_own(monkeypatch):
    """A long kernel first, so that the host queues every pass and refill before the GPU reaches
    the first: no refill may overwrite rows a queued pass has yet to read."""
    ahead = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):
        ahead = ahead @ ahead.T / 4096
    taken = _passes("cuda", SIZES * 3, 8 * VOCAB * 9, monkeypatch)
    torch.cuda.synchronize()
    for got, want in zip(taken, _expected(SIZES * 3), strict=True):
        assert torch.equal(got.cpu(), want)
