"""Notebook 12's given kernel: which key blocks each query block of a tree sees, as lists.

`tree_attention_kernel` (notebook 12) walks only the key blocks in its query block's list. Building
the list compares the same (query, key) pairs as the mask that notebook asks you to write, so this
kernel is kept out of your lessons/triton_attention.py: read it once your check passes."""

from __future__ import annotations

import triton
import triton.language as tl

from course.core import interpreter


@triton.jit
def visible_blocks_kernel(start, end, kv_count, kv_list, N, TM, TN,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """kv_list[b, i, :kv_count[b, i]] = the key blocks that some query of query block i sees.

    One program per (query block, tree). Key block j is visible when the BLOCK_M x BLOCK_N
    comparison of the two blocks' DFS intervals has any true entry: exact, not a bound.
    """
    i = tl.program_id(0)
    b = tl.program_id(1)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    # A row past N gets the interval [-1, -1]: no key's interval contains it.
    row_start = tl.load(start + b * N + rows, mask=rows < N, other=-1)
    row_end = tl.load(end + b * N + rows, mask=rows < N, other=-1)
    out = (b * TM + i) * TN
    count = 0
    for j in range(0, TN):
        keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
        # A key past N gets the empty interval [N, -1], which contains no row.
        key_start = tl.load(start + b * N + keys, mask=keys < N, other=N)
        key_end = tl.load(end + b * N + keys, mask=keys < N, other=-1)
        sees = (key_start[None, :] <= row_start[:, None]) & (row_end[:, None] <= key_end[None, :])
        seen = tl.max(tl.max(sees.to(tl.int32), axis=1), axis=0)
        tl.store(kv_list + out + count, j, mask=seen > 0)
        count += seen
    tl.store(kv_count + b * TM + i, count)


interpreter.prepare(visible_blocks_kernel)
