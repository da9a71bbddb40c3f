"""Notebook 01's measurements: `python -m course bench trees` on a GPU writes results/<device>/trees.json.

Section "masks": for batches of B random trees of N nodes (fan-out 1-10, numbered breadth first),
each of notebook 01's launchers timed with `course.measure.timing.bench` on the same trees:
  dfs_times         the DFS start/end times, one thread per tree
  tree_mask         the dense (B, N, N) mask from the times, one thread per (query, key) pair
  tree_bitmask      SpecInfer's 64-bit words from the times
  torch_dense_mask  the torch reference of the dense mask (`course.oracle.dense_tree_mask`): one
                    broadcast comparison, the baseline
max_abs_err is the fraction of outputs that differ from the reference (0.0: all agree); the rows
carry B, H = 1, N, d = 1 (the schema's sizes) and "bytes", what the output occupies.
"""

from __future__ import annotations

import random

import torch

from course import oracle
from course.core import inputs, runtime
from course.core.impl import bench_impl, load
from course.measure import timing

SUITE = "trees"
SIZES = ((1, 64), (1, 1024), (64, 64), (64, 256), (64, 1024))  # (B, N)
SEED = 2024


def _trees(batch: int, n: int) -> list[list[int]]:
    rng = random.Random(SEED + batch * n)
    return [inputs.random_tree(n, rng, max_children=rng.randint(1, 10)) for _ in range(batch)]


def _differs(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.cpu() != want.cpu()).double().mean())


def _row(name: str, batch: int, n: int, median_ms: float, error: float, output: torch.Tensor) -> dict:
    return {"name": name, "B": batch, "H": 1, "N": n, "d": 1, "median_ms": median_ms, "max_abs_err": error,
            "bytes": output.numel() * output.element_size()}


def measure_size(batch: int, n: int) -> list[dict]:
    """The four rows of one (B, N)."""
    trees = load("trees", bench_impl())
    device = runtime.torch_device()
    parents = inputs.batch_of_trees(_trees(batch, n), device)
    start, end = trees.dfs_times(parents)
    want_start, want_end = inputs.dfs_times_tensors(parents.tolist(), device)
    mask = oracle.dense_tree_mask(want_start, want_end)
    times_error = max(_differs(start, want_start), _differs(end, want_end))
    words = trees.tree_bitmask(start, end)
    bits = (words.unsqueeze(-1) >> torch.arange(64, device=device)) & 1  # (B, N, words, 64)
    from_bits = bits.flatten(-2)[..., :n].bool()
    return [
        _row("dfs_times", batch, n, timing.bench(lambda: trees.dfs_times(parents)), times_error, start),
        _row("tree_mask", batch, n, timing.bench(lambda: trees.tree_mask(start, end)),
             _differs(trees.tree_mask(start, end), mask), mask),
        _row("tree_bitmask", batch, n, timing.bench(lambda: trees.tree_bitmask(start, end)),
             _differs(from_bits, mask), words),
        _row("torch_dense_mask", batch, n, timing.bench(lambda: oracle.dense_tree_mask(start, end)), 0.0,
             mask),
    ]


def mask_rows() -> list[dict]:
    return [row for batch, n in SIZES for row in measure_size(batch, n)]


SECTIONS = {"masks": mask_rows}


def section_of(row: dict) -> str:
    """Every row of trees.json comes from the one section."""
    return "masks"
