# Student copy, generated from solutions/ladder_k9.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
# The lines under `# COPY FROM YOUR lessons/ladder_k8.py` hold your own rung 8's code: run
# `python -m course carry ladder_k9` (or pass rung 8's check) to fill rung 8's parts
# (in a hand-out, which cannot carry, copy them from your lessons/ladder_k8.py).
"""Rung 9, beyond the paper (notebook 11a): skip the key tiles that no row of the block sees.

A query sees only its ancestors, so in a tree of N nodes most 32 x 32 tiles of the
mask are empty, and rung 8 loads and multiplies them anyway. Here each key tile
starts with its 2 x 32 DFS times alone: every thread builds its row's visibility
bits, `cuda.syncthreads_or` tells the whole block whether any bit is set, and an
empty tile is skipped before its 2 x 32 x d keys and values are read. The test is
exact (the same interval test as the mask), so the result equals rung 8's.

How much it skips depends on the numbering: in DFS order a query tile is a few
neighbouring subtrees, whose ancestors sit on a few root paths; in BFS order the
32 rows of a tile have ancestors spread over many tiles (notebook 11a counts both).

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
KEYS = TILE // COL_STRIDE  # keys per thread in Q.K^T
ARGUMENTS = ("q", "k", "v", "start", "end", "out")

# Compile-time constants of the kernel. It is plain Python until build(d) compiles a
# copy of it with D = d and the constants derived from d (course.core.launch.specialize).
D = HEAD_DIMS[-1]
SCALE = np.float32(1 / math.sqrt(D))  # softmax(QK^T / sqrt(d))
COLS = D // COL_STRIDE  # output columns per thread in P.V
D_PADDED = D + 1  # the value tile's row length: its rows start in different banks


def tree_attention_kernel(q, k, v, start, end, out):
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 1 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=1, lines=1, defines="b, h, i")
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 1 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=1, lines=1, defines="q_t")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 1 of ladder_k8.tree_attention_kernel that stand here
    todo("ladder_k8.tree_attention_kernel", region=1, lines=1, defines="k_t")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 1 of ladder_k7.tree_attention_kernel that stand here
    todo("ladder_k7.tree_attention_kernel", region=1, lines=1, defines="v_tile")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 2 of ladder_k8.tree_attention_kernel that stand here
    todo("ladder_k8.tree_attention_kernel", region=2, lines=1, defines="s_t")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 1 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=1, lines=2, defines="key_start, key_end")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 1 of ladder_k6.tree_attention_kernel that stand here
    todo("ladder_k6.tree_attention_kernel", region=1, lines=5, defines="row_scale, row_sum, ty, tx, acc, p_reg")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 3 of ladder_k8.tree_attention_kernel that stand here
    todo("ladder_k8.tree_attention_kernel", region=3, lines=2, defines="q_reg, s_reg")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=1, defines="row")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 3 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=3, lines=3)
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 2 of ladder_k6.tree_attention_kernel that stand here
    todo("ladder_k6.tree_attention_kernel", region=2, lines=3)
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 2 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=2, lines=2, defines="my_start, my_end")
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="m_prev, l_prev")
    for j in range(tiles):
        # YOUR CODE HERE: exercise ladder_k9.tree_attention_kernel, region 1 (delete the todo line when you start)
        todo("ladder_k9.tree_attention_kernel", region=1, lines=10, defines="visible")
        # The threads load each key row together (zeros past N, so no NaN reaches P.V).
        for r in range(TILE):
            # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 4 of ladder_k4.tree_attention_kernel that stand here
            todo("ladder_k4.tree_attention_kernel", region=4, lines=1, defines="key_r")
            for x0 in range(0, D, TILE):
                # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 4 of ladder_k8.tree_attention_kernel that stand here
                todo("ladder_k8.tree_attention_kernel", region=4, lines=1)
                # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 4 of ladder_k4.tree_attention_kernel that stand here
                todo("ladder_k4.tree_attention_kernel", region=4, lines=1)
        cuda.syncthreads()
        # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 5 of ladder_k8.tree_attention_kernel that stand here
        todo("ladder_k8.tree_attention_kernel", region=5, lines=14)
        # Softmax, one thread per row (rows past N see nothing and write zeros).
        # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 5 of ladder_k8.tree_attention_kernel that stand here
        todo("ladder_k8.tree_attention_kernel", region=5, lines=17, defines="alpha, l_prev")
        # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 3 of ladder_k6.tree_attention_kernel that stand here
        todo("ladder_k6.tree_attention_kernel", region=3, lines=13)
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 2 of ladder_k7.tree_attention_kernel that stand here
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
