# Student copy, generated from solutions/ladder_k7.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
# The lines under `# COPY FROM YOUR lessons/ladder_k6.py` hold your own rung 6's code: run
# `python -m course carry ladder_k7` (or pass rung 6's check) to fill rung 6's parts
# (in a hand-out, which cannot carry, copy them from your lessons/ladder_k6.py).
"""Rung 7 of the tree-attention ladder (notebook 09): coalesced writes through shared memory.

In rung 6 thread (ty, tx) writes its 4 x D/4 outputs itself: one store instruction
of the warp touches 8 rows, 4 words of each, 8 separate 16-byte pieces. Here the
threads first put the normalised output tile into shared memory (the value tile's
buffer, free once the last key tile is done), then write it out a row at a time,
thread t taking element t: 128 consecutive bytes per instruction (FlashSpecInfer
§5.2). The value tile gets D + 1 columns so that the register tile's stores into
it, 8 rows apart at the same column, fall into different banks.

Limits: float32; head dimension d in HEAD_DIMS (a multiple of TILE); any N >= 1.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numba import cuda, float32, int32

from course.core.launch import launch, poisoned_empty, specialize
from course.core.stubs import todo  # noqa: F401  (the lesson stubs call it)
from course.core.validate import require_tree_attention_inputs

TILE = 32  # Br = Bc: query rows and keys per tile
THREADS = TILE  # one thread per query row (and per key row while loading)
PADDED = TILE + 1  # a transposed tile's row length: consecutive rows start in different banks
HEAD_DIMS = (32, 64)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
NOBODY = np.int32(-1)  # the DFS times of a row or key past N: no interval contains them
ONE = np.float32(1)
ROWS = 4  # output rows per thread in P.V
COL_STRIDE = THREADS * ROWS // TILE  # threads sharing those rows; thread tx takes columns tx + 4c
ARGUMENTS = ("q", "k", "v", "start", "end", "out")

# Compile-time constants of the kernel. It is plain Python until build(d) compiles a
# copy of it with D = d and the constants derived from d (course.core.launch.specialize).
D = HEAD_DIMS[-1]
SCALE = np.float32(1 / math.sqrt(D))  # softmax(QK^T / sqrt(d))
COLS = D // COL_STRIDE  # output columns per thread in P.V
D_PADDED = D + 1  # the value tile's row length: its rows start in different banks


def tree_attention_kernel(q, k, v, start, end, out):
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 1 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=1, lines=1, defines="b, h, i")
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 1 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=1, lines=1, defines="q_t")
    k_tile = cuda.shared.array((TILE, D), float32)
    # YOUR CODE HERE: exercise ladder_k7.tree_attention_kernel, region 1 (delete the todo line when you start)
    todo("ladder_k7.tree_attention_kernel", region=1, lines=1, defines="v_tile")
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 2 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=2, lines=1, defines="s_t")
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 1 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=1, lines=2, defines="key_start, key_end")
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 1 of ladder_k6.tree_attention_kernel that stand here
    todo("ladder_k6.tree_attention_kernel", region=1, lines=5, defines="row_scale, row_sum, ty, tx, acc, p_reg")
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=1, defines="row")
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 3 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=3, lines=3)
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 2 of ladder_k6.tree_attention_kernel that stand here
    todo("ladder_k6.tree_attention_kernel", region=2, lines=3)
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 2 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=2, lines=2, defines="my_start, my_end")
    # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="m_prev, l_prev")
    for j in range(tiles):
        # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 4 of ladder_k4.tree_attention_kernel that stand here
        todo("ladder_k4.tree_attention_kernel", region=4, lines=6, defines="key")
        # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 3 of ladder_k3.tree_attention_kernel that stand here
        todo("ladder_k3.tree_attention_kernel", region=3, lines=2)
        cuda.syncthreads()
        # COPY FROM YOUR lessons/ladder_k6.py: the lines of region 3 of ladder_k6.tree_attention_kernel that stand here
        todo("ladder_k6.tree_attention_kernel", region=3, lines=40, defines="l_prev")
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
    # YOUR CODE HERE: exercise ladder_k7.tree_attention_kernel, region 2 (delete the todo line when you start)
    todo("ladder_k7.tree_attention_kernel", region=2, lines=11)


@functools.cache
def build(d: int):
    """The kernel compiled for head dimension d."""
    return specialize(tree_attention_kernel, D=d, SCALE=np.float32(1 / math.sqrt(d)),
                      COLS=d // COL_STRIDE, D_PADDED=d + 1)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked by the tree) v for (B, H, N, d) float32 q, k, v
    and (B, N) int32 DFS times; returns a new (B, H, N, d) tensor."""
    batch, heads, n, d = require_tree_attention_inputs(q, k, v, start, end, HEAD_DIMS)
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    query_tiles = (n + TILE - 1) // TILE
    launch(build(d), (batch, heads, query_tiles), THREADS, q, k, v, start, end, out, names=ARGUMENTS)
    return out
