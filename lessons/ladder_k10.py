# Student copy, generated from solutions/ladder_k10.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
# The lines under `# COPY FROM YOUR lessons/ladder_k9.py` hold your own rung 9's code: run
# `python -m course carry ladder_k10` (or pass rung 9's check) to fill rung 9's parts
# (in a hand-out, which cannot carry, copy them from your lessons/ladder_k9.py).
"""Rung 10, beyond the paper (notebook 11b): the tile mask built once per tree, not once per block.

Rung 9 decides at run time, in every block, whether each key tile is visible: 2 x 32
DFS times loaded and a block-wide vote (`syncthreads_or`) for every one of the N/32
key tiles, visible or not. On the benchmark tree only about one pair in eight is
visible, so most of those loads and barriers decide to do nothing -- and every head
repeats them, although the tree (and so the answer) is the same for all H heads.

Here a small kernel, `tile_visibility_kernel`, first writes the T x T table of which
(query tile, key tile) pairs hold a visible pair (T = ceil(N / 32); one byte each,
B * T^2 bytes = 1/1024 of the dense mask; `pyspec_ref.tile_mask` is its
specification), once per batch entry. The attention kernel then reads one byte per
key tile, the same byte in every thread, and skips together: no barrier decides the
skip. A visible tile's DFS times are loaded with its keys and values, behind the
barrier those loads already need, so a visible tile costs 4 barriers instead of rung
9's 6 (the vote and the times' own barrier are gone), and a skipped one none instead
of 2. This is FlexAttention's block mask, computed from the DFS intervals.

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
from course.core.validate import require_tree_attention_inputs, require_tree_times

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
ARGUMENTS = ("q", "k", "v", "start", "end", "tile_visible", "out")
VISIBILITY_ARGUMENTS = ("start", "end", "tile_visible")

# Compile-time constants of the kernel. It is plain Python until build(d) compiles a
# copy of it with D = d and the constants derived from d (course.core.launch.specialize).
D = HEAD_DIMS[-1]
SCALE = np.float32(1 / math.sqrt(D))  # softmax(QK^T / sqrt(d))
COLS = D // COL_STRIDE  # output columns per thread in P.V
D_PADDED = D + 1  # the value tile's row length: its rows start in different banks


def tree_attention_kernel(q, k, v, start, end, tile_visible, out):
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 1 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=1, lines=1, defines="b, h, i")
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 1 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=1, lines=1, defines="q_t")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 1 of ladder_k8.tree_attention_kernel that stand here
    todo("ladder_k8.tree_attention_kernel", region=1, lines=1, defines="k_t")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 1 of ladder_k7.tree_attention_kernel that stand here
    todo("ladder_k7.tree_attention_kernel", region=1, lines=1, defines="v_tile")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 2 of ladder_k8.tree_attention_kernel that stand here
    todo("ladder_k8.tree_attention_kernel", region=2, lines=1, defines="s_t")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 1 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=1, lines=2, defines="key_start, key_end")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 1 of ladder_k6.tree_attention_kernel that stand here
    todo("ladder_k6.tree_attention_kernel", region=1, lines=5, defines="row_scale, row_sum, ty, tx, acc, p_reg")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 3 of ladder_k8.tree_attention_kernel that stand here
    todo("ladder_k8.tree_attention_kernel", region=3, lines=2, defines="q_reg, s_reg")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=1, defines="row")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 3 of ladder_k4.tree_attention_kernel that stand here
    todo("ladder_k4.tree_attention_kernel", region=3, lines=3)
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 2 of ladder_k6.tree_attention_kernel that stand here
    todo("ladder_k6.tree_attention_kernel", region=2, lines=3)
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 2 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=2, lines=2, defines="my_start, my_end")
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="m_prev, l_prev")
    for j in range(tiles):
        # YOUR CODE HERE: exercise ladder_k10.tree_attention_kernel, region 1 (delete the todo line when you start)
        todo("ladder_k10.tree_attention_kernel", region=1, lines=2)
        # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 1 of ladder_k9.tree_attention_kernel that stand here
        todo("ladder_k9.tree_attention_kernel", region=1, lines=3)
        # The threads load each key row together (zeros past N, so no NaN reaches P.V).
        for r in range(TILE):
            # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 4 of ladder_k4.tree_attention_kernel that stand here
            todo("ladder_k4.tree_attention_kernel", region=4, lines=1, defines="key_r")
            for x0 in range(0, D, TILE):
                # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 4 of ladder_k8.tree_attention_kernel that stand here
                todo("ladder_k8.tree_attention_kernel", region=4, lines=1)
                # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 4 of ladder_k4.tree_attention_kernel that stand here
                todo("ladder_k4.tree_attention_kernel", region=4, lines=1)
        cuda.syncthreads()
        # YOUR CODE HERE: exercise ladder_k10.tree_attention_kernel, region 2 (delete the todo line when you start)
        todo("ladder_k10.tree_attention_kernel", region=2, lines=4, defines="visible")
        # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 5 of ladder_k8.tree_attention_kernel that stand here
        todo("ladder_k8.tree_attention_kernel", region=5, lines=31, defines="alpha, l_prev")
        # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 3 of ladder_k6.tree_attention_kernel that stand here
        todo("ladder_k6.tree_attention_kernel", region=3, lines=13)
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
    # COPY FROM YOUR lessons/ladder_k9.py: the lines of region 2 of ladder_k7.tree_attention_kernel that stand here
    todo("ladder_k7.tree_attention_kernel", region=2, lines=11)


def tile_visibility_kernel(start, end, tile_visible):
    """tile_visible[b, i, j] = 1 iff some row of query tile i sees some key of key tile j.

    One block per (batch entry, query tile, group of 32 key tiles); thread t decides key
    tile 32 * group + t alone, so no thread waits for another after the rows' times load.
    """
    b, i, group = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    t = cuda.threadIdx.x
    n = start.shape[1]
    tiles = (n + TILE - 1) // TILE
    row_start = cuda.shared.array(TILE, int32)
    row_end = cuda.shared.array(TILE, int32)
    # YOUR CODE HERE: exercise ladder_k10.tile_visibility_kernel, region 1 (delete the todo line when you start)
    todo("ladder_k10.tile_visibility_kernel", region=1, lines=15)


@functools.cache
def build(d: int):
    """The kernel compiled for head dimension d."""
    return specialize(tree_attention_kernel, D=d, SCALE=np.float32(1 / math.sqrt(d)),
                      COLS=d // COL_STRIDE, D_PADDED=d + 1)


@functools.cache
def build_visibility():
    return cuda.jit(tile_visibility_kernel)


def tile_visibility(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """The (B, T, T) uint8 tile mask of (B, N) int32 DFS times, T = ceil(N / TILE):
    1 where some row of the query tile sees some key of the key tile
    (`pyspec_ref.tile_mask` on each batch entry)."""
    require_tree_times(start, end)
    batch, n = start.shape
    tiles = (n + TILE - 1) // TILE
    tile_visible = poisoned_empty((batch, tiles, tiles), dtype=torch.uint8, device=start.device)
    grid = (batch, tiles, (tiles + THREADS - 1) // THREADS)
    launch(build_visibility(), grid, THREADS, start, end, tile_visible, names=VISIBILITY_ARGUMENTS)
    return tile_visible


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked by the tree) v for (B, H, N, d) float32 q, k, v
    and (B, N) int32 DFS times; returns a new (B, H, N, d) tensor. Two kernels: the tile
    mask (once per tree, shared by the heads), then the attention."""
    batch, heads, n, d = require_tree_attention_inputs(q, k, v, start, end, HEAD_DIMS)
    tile_visible = tile_visibility(start, end)
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    query_tiles = (n + TILE - 1) // TILE
    launch(build(d), (batch, heads, query_tiles), THREADS, q, k, v, start, end, tile_visible, out,
           names=ARGUMENTS)
    return out
