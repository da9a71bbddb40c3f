# Student copy, generated from solutions/ladder_k1.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Rung 1 of the tree-attention ladder (notebook 03): the baseline.

The structure of the well-known minimal flash-attention kernel (FlashAttention-1,
Dao et al. 2022, Algorithm 1), with the tree mask of FlashSpecInfer §5.1: key c is
visible to query r exactly when start[c] <= start[r] and end[r] <= end[c].

One block of TILE = 32 threads per (batch, head). The outer loop walks the key
tiles; for each, every thread walks the query tiles, one query row per thread.
A row's running max, running sum and normalised output live in global memory
between key tiles, and the DFS times are read from global memory at every mask
test. Everything later rungs fix is here on purpose.

Limits: float32; head dimension d in HEAD_DIMS (shared arrays are sized at compile
time and must fit the 48 KB of static shared memory); any N >= 1.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numba import cuda, float32

from course.core.launch import launch, specialize
from course.core.stubs import todo  # noqa: F401  (the lesson stubs call it)
from course.core.validate import require_tree_attention_inputs

TILE = 32  # Br = Bc: query rows and keys per tile
THREADS = TILE  # one thread per query row (and per key row while loading)
HEAD_DIMS = (32, 64)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
ARGUMENTS = ("q", "k", "v", "start", "end", "out", "row_max", "row_sum")

# Compile-time constants of the kernel. It is plain Python until build(d) compiles a
# copy of it with D = d and the constants derived from d (course.core.launch.specialize).
D = HEAD_DIMS[-1]
SCALE = np.float32(1 / math.sqrt(D))  # softmax(QK^T / sqrt(d))


def tree_attention_kernel(q, k, v, start, end, out, row_max, row_sum):
    b, h = cuda.blockIdx.x, cuda.blockIdx.y
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    q_tile = cuda.shared.array((TILE, D), float32)
    k_tile = cuda.shared.array((TILE, D), float32)
    v_tile = cuda.shared.array((TILE, D), float32)
    s = cuda.shared.array((TILE, TILE), float32)
    for j in range(tiles):
        # Thread t loads key row t of the tile (zeros past N, so no NaN reaches P.V).
        key = j * TILE + t
        for x in range(D):
            k_tile[t, x] = k[b, h, key, x] if key < n else ZERO
            v_tile[t, x] = v[b, h, key, x] if key < n else ZERO
        cuda.syncthreads()
        for i in range(tiles):
            row = i * TILE + t
            if row < n:
                # YOUR CODE HERE: exercise ladder_k1.tree_attention_kernel, region 1 (delete the todo line when you start)
                todo("ladder_k1.tree_attention_kernel", region=1, lines=30)
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten


@functools.cache
def build(d: int):
    """The kernel compiled for head dimension d."""
    return specialize(tree_attention_kernel, D=d, SCALE=np.float32(1 / math.sqrt(d)))


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked by the tree) v for (B, H, N, d) float32 q, k, v
    and (B, N) int32 DFS times; returns a new (B, H, N, d) tensor."""
    batch, heads, n, d = require_tree_attention_inputs(q, k, v, start, end, HEAD_DIMS)
    out = torch.zeros_like(q)
    row_max = torch.full((batch, heads, n), -math.inf, dtype=torch.float32, device=q.device)
    row_sum = torch.zeros((batch, heads, n), dtype=torch.float32, device=q.device)
    launch(build(d), (batch, heads), THREADS, q, k, v, start, end, out, row_max, row_sum,
           names=ARGUMENTS)
    return out
