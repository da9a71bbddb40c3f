"""Notebook 16's given kernel: a tree's parent array rebuilt from its DFS times.

It tests which intervals contain which, the test notebook 12 asks you to write for its mask, so it
is kept out of your lessons/tree_verification.py: read it once that check passes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from course.core import interpreter


@triton.jit
def parents_from_times_kernel(start, end, parents, N, BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (B, cdiv(N, BLOCK_ROWS)): parents[b, v] = the node with the tightest interval that
    strictly contains v's (FlashSpecInfer §5.1), i.e. v's proper ancestor with the largest start;
    -1 for the root."""
    b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_start = tl.load(start + b * N + rows, mask=rows < N, other=-1)
    row_end = tl.load(end + b * N + rows, mask=rows < N, other=-1)
    col_start = tl.load(start + b * N + cols, mask=cols < N, other=N)  # padding contains nothing
    col_end = tl.load(end + b * N + cols, mask=cols < N, other=-1)
    above = (col_start[None, :] < row_start[:, None]) & (row_end[:, None] <= col_end[None, :])
    nearest = tl.max(tl.where(above, col_start[None, :], -1), axis=1)
    is_parent = above & (col_start[None, :] == nearest[:, None])
    tl.store(parents + b * N + rows, tl.max(tl.where(is_parent, cols[None, :], -1), axis=1),
             mask=rows < N)


interpreter.prepare(parents_from_times_kernel)
