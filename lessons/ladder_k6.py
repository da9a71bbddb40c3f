# Student copy, generated from solutions/ladder_k6.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
# The lines under `# COPY FROM YOUR lessons/ladder_k5.py` hold your own rung 5's code: run
# `python -m course carry ladder_k6` (or pass rung 5's check) to fill rung 5's parts
# (in a hand-out, which cannot carry, copy them from your lessons/ladder_k5.py).
"""Rung 6 of the tree-attention ladder (notebook 08): register tiling of P.V.

Up to rung 5 each thread computes its own output row: for every one of the d
outputs it reads 32 probabilities and 32 values from shared memory, two shared
loads per multiply-add, and its d accumulators do not fit in registers. Here the
32 x d output tile is cut into 4 x (d/4) pieces, one per thread: thread (ty, tx)
owns rows 4ty..4ty+3 and columns tx, tx+4, ..., and for each key it loads 4
probabilities and d/4 values into registers and does 4 x d/4 multiply-adds with
them, 6.4 times fewer shared loads per multiply-add for d = 64 (FlashSpecInfer §5.2,
after the register blocking of CUTLASS-style GEMMs). The softmax stays one thread
per row; it hands each row's rescale factor to the row's owners through shared
memory.

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


def tree_attention_kernel(q, k, v, start, end, out):
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 1 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=1, lines=1, defines="b, h, i")
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 1 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=1, lines=1, defines="q_t")
    k_tile = cuda.shared.array((TILE, D), float32)
    v_tile = cuda.shared.array((TILE, D), float32)
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 2 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=2, lines=1, defines="s_t")
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 1 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=1, lines=2, defines="key_start, key_end")
    # YOUR CODE HERE: exercise ladder_k6.tree_attention_kernel, region 1 (delete the todo line when you start)
    todo("ladder_k6.tree_attention_kernel", region=1, lines=5, defines="row_scale, row_sum, ty, tx, acc, p_reg")
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=1, defines="row")
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 3 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=3, lines=3)
    # YOUR CODE HERE: exercise ladder_k6.tree_attention_kernel, region 2 (delete the todo line when you start)
    todo("ladder_k6.tree_attention_kernel", region=2, lines=3)
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 2 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=2, lines=2, defines="my_start, my_end")
    # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="m_prev, l_prev")
    for j in range(tiles):
        # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 4 of ladder_k4.tree_attention_kernel that stand here
        todo("ladder_k4.tree_attention_kernel", region=4, lines=6, defines="key")
        # COPY FROM YOUR lessons/ladder_k5.py: the lines of region 3 of ladder_k3.tree_attention_kernel that stand here
        todo("ladder_k3.tree_attention_kernel", region=3, lines=2)
        cuda.syncthreads()
        # YOUR CODE HERE: exercise ladder_k6.tree_attention_kernel, region 3 (delete the todo line when you start)
        todo("ladder_k6.tree_attention_kernel", region=3, lines=40, defines="l_prev")
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
    # YOUR CODE HERE: exercise ladder_k6.tree_attention_kernel, region 4 (delete the todo line when you start)
    todo("ladder_k6.tree_attention_kernel", region=4, lines=7)


@functools.cache
def build(d: int):
    """The kernel compiled for head dimension d."""
    return specialize(tree_attention_kernel, D=d, SCALE=np.float32(1 / math.sqrt(d)),
                      COLS=d // COL_STRIDE)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked by the tree) v for (B, H, N, d) float32 q, k, v
    and (B, N) int32 DFS times; returns a new (B, H, N, d) tensor."""
    batch, heads, n, d = require_tree_attention_inputs(q, k, v, start, end, HEAD_DIMS)
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    query_tiles = (n + TILE - 1) // TILE
    launch(build(d), (batch, heads, query_tiles), THREADS, q, k, v, start, end, out, names=ARGUMENTS)
    return out
