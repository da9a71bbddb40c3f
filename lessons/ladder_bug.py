# Student copy, generated from solutions/ladder_bug.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
# The lines under `# COPY FROM YOUR lessons/ladder_k3.py` hold your own rung 3's code: run
# `python -m course carry ladder_bug` (or pass rung 3's check) to fill rung 3's parts
# (in a hand-out, which cannot carry, copy them from your lessons/ladder_k3.py).
"""Find the bug (notebook 05): rung 3 with one realistic defect.

This kernel passes on many GPUs most of the time, and is wrong. Run its check
(`python -m course check ladder_bug.tree_attention_kernel`), read what the check
reports, find the defect in lessons/ladder_bug.py and fix it there. The solution's
region says what the bug was; do not peek before you have tried.

Limits: as rung 3.
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
HEAD_DIMS = (32, 64)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
NOBODY = np.int32(-1)  # the DFS times of a row or key past N: no interval contains them
ARGUMENTS = ("q", "k", "v", "start", "end", "out")

# Compile-time constants of the kernel. It is plain Python until build(d) compiles a
# copy of it with D = d and the constants derived from d (course.core.launch.specialize).
D = HEAD_DIMS[-1]
SCALE = np.float32(1 / math.sqrt(D))  # softmax(QK^T / sqrt(d))


def tree_attention_kernel(q, k, v, start, end, out):
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 1 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=1, lines=1, defines="b, h, i")
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    q_tile = cuda.shared.array((TILE, D), float32)
    k_tile = cuda.shared.array((TILE, D), float32)
    v_tile = cuda.shared.array((TILE, D), float32)
    s = cuda.shared.array((TILE, TILE), float32)
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 1 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=1, lines=2, defines="key_start, key_end")
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=5, defines="acc, row")
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 2 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=2, lines=2, defines="my_start, my_end")
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="m_prev, l_prev")
    for j in range(tiles):
        # Thread t loads key row t of the tile (zeros past N, so no NaN reaches P.V).
        key = j * TILE + t
        for x in range(D):
            k_tile[t, x] = k[b, h, key, x] if key < n else ZERO
            v_tile[t, x] = v[b, h, key, x] if key < n else ZERO
        # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k3.tree_attention_kernel that stand here
        todo("ladder_k3.tree_attention_kernel", region=3, lines=2)
        cuda.syncthreads()
        if row < n:
            # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
            todo("ladder_k2.tree_attention_kernel", region=3, lines=1, defines="m_new")
            for c in range(TILE):
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                todo("ladder_k2.tree_attention_kernel", region=3, lines=1)
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 4 of ladder_k3.tree_attention_kernel that stand here
                todo("ladder_k3.tree_attention_kernel", region=4, lines=5, defines="score")
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                todo("ladder_k2.tree_attention_kernel", region=3, lines=2, defines="m_new")
            # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
            todo("ladder_k2.tree_attention_kernel", region=3, lines=15, defines="l_prev")
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 4 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=4, lines=3)


@functools.cache
def build(d: int):
    """The kernel compiled for head dimension d."""
    return specialize(tree_attention_kernel, D=d, SCALE=np.float32(1 / math.sqrt(d)))


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked by the tree) v for (B, H, N, d) float32 q, k, v
    and (B, N) int32 DFS times; returns a new (B, H, N, d) tensor."""
    batch, heads, n, d = require_tree_attention_inputs(q, k, v, start, end, HEAD_DIMS)
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    query_tiles = (n + TILE - 1) // TILE
    launch(build(d), (batch, heads, query_tiles), THREADS, q, k, v, start, end, out, names=ARGUMENTS)
    return out
