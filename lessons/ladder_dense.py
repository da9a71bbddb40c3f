# Student copy, generated from solutions/ladder_dense.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
# The lines under `# COPY FROM YOUR lessons/ladder_k8.py` hold your own rung 8's code: run
# `python -m course carry ladder_dense` (or pass rung 8's check) to fill rung 8's parts
# (in a hand-out, which cannot carry, copy them from your lessons/ladder_k8.py).
"""Rung 8 with a dense mask (notebook 11): the ablation of FlashSpecInfer's Figure 5.

The same kernel as rung 8, except that the tree mask comes from an N x N boolean
array in global memory (what SpecInfer materialises) instead of the 2N DFS times.
Each thread reads its row's 32 mask bytes per key tile: N^2 bytes per (batch
entry) move instead of 8N, and the mask itself must be allocated, which is what
stops this variant first as trees grow (§6.1).

Limits: float32; head dimension d in HEAD_DIMS (a multiple of TILE); B * N^2 bytes
of mask must fit in GPU memory.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numba import cuda, float32

from course.core.launch import launch, poisoned_empty, specialize
from course.core.stubs import todo  # noqa: F401  (the lesson stubs call it)
from course.core.validate import require_qkv, require_tensor, require_tree_attention_inputs
from course.oracle import dense_tree_mask

TILE = 32  # Br = Bc: query rows and keys per tile
THREADS = TILE  # one thread per query row (and per key row while loading)
PADDED = TILE + 1  # a transposed tile's row length: consecutive rows start in different banks
HEAD_DIMS = (32, 64)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
ONE = np.float32(1)
ROWS = 4  # output rows per thread in P.V
COL_STRIDE = THREADS * ROWS // TILE  # threads sharing those rows; thread tx takes columns tx + 4c
KEYS = TILE // COL_STRIDE  # keys per thread in Q.K^T
ARGUMENTS = ("q", "k", "v", "mask", "out")

# Compile-time constants of the kernel. It is plain Python until build(d) compiles a
# copy of it with D = d and the constants derived from d (course.core.launch.specialize).
D = HEAD_DIMS[-1]
SCALE = np.float32(1 / math.sqrt(D))  # softmax(QK^T / sqrt(d))
COLS = D // COL_STRIDE  # output columns per thread in P.V
D_PADDED = D + 1  # the value tile's row length: its rows start in different banks


def tree_attention_kernel(q, k, v, mask, out):
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
    # COPY FROM YOUR lessons/ladder_k8.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="m_prev, l_prev")
    for j in range(tiles):
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
        todo("ladder_k8.tree_attention_kernel", region=5, lines=15)
        # YOUR CODE HERE: exercise ladder_dense.tree_attention_kernel, region 1 (delete the todo line when you start)
        todo("ladder_dense.tree_attention_kernel", region=1, lines=3, defines="visible")
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


def tree_attention_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor) -> torch.Tensor:
    """Tree attention with the mask given as a (B, N, N) bool tensor."""
    batch, heads, n, d = require_qkv(q, k, v, HEAD_DIMS)
    require_tensor(mask, "mask", ndim=3, dtypes=(torch.bool,))
    if tuple(mask.shape) != (batch, n, n):
        raise ValueError(f"mask must have shape (B, N, N) = {(batch, n, n)} to match q, "
                         f"got {tuple(mask.shape)}")
    blind = torch.nonzero(~mask.any(dim=-1))
    if len(blind):  # softmax over no key is 0/0: refuse it, as notebook 02's flash_attention does
        b, i = (int(x) for x in blind[0])
        raise ValueError(f"mask[{b}, {i}, :] hides every key from query {i} of batch entry {b}; "
                         "its attention is undefined (a tree mask always shows a node itself)")
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    query_tiles = (n + TILE - 1) // TILE
    launch(build(d), (batch, heads, query_tiles), THREADS, q, k, v, mask, out, names=ARGUMENTS)
    return out


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor) -> torch.Tensor:
    """The checks' interface: builds the dense mask from the DFS times, then runs the kernel."""
    require_tree_attention_inputs(q, k, v, start, end, HEAD_DIMS)
    return tree_attention_dense(q, k, v, dense_tree_mask(start, end))
