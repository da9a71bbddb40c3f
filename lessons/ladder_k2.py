# Student copy, generated from solutions/ladder_k2.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Rung 2 of the tree-attention ladder (notebook 04): sequence parallelism.

Rung 1 gives each (batch, head) one block, so B*H blocks share the GPU's SMs and a
block walks every query tile in turn. Here the grid is (B, H, Tr): one block per
query tile, the loop over key tiles is the only loop, and a row's running max, sum
and output accumulator stay in the thread's own variables instead of travelling
through global memory after every key tile (FlashAttention-2's loop order,
FlashSpecInfer §5.2). The DFS times are still read from global memory at every
mask test.

Limits: float32; head dimension d in HEAD_DIMS; any N >= 1.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numba import cuda, float32

from course.core.launch import launch, poisoned_empty, specialize
from course.core.stubs import todo  # noqa: F401  (the lesson stubs call it)
from course.core.validate import require_tree_attention_inputs

TILE = 32  # Br = Bc: query rows and keys per tile
THREADS = TILE  # one thread per query row (and per key row while loading)
HEAD_DIMS = (32, 64)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
ARGUMENTS = ("q", "k", "v", "start", "end", "out")

# Compile-time constants of the kernel. It is plain Python until build(d) compiles a
# copy of it with D = d and the constants derived from d (course.core.launch.specialize).
D = HEAD_DIMS[-1]
SCALE = np.float32(1 / math.sqrt(D))  # softmax(QK^T / sqrt(d))


def tree_attention_kernel(q, k, v, start, end, out):
    # YOUR CODE HERE: exercise ladder_k2.tree_attention_kernel, region 1 (delete the todo line when you start)
    todo("ladder_k2.tree_attention_kernel", region=1, lines=1, defines="b, h, i")
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    q_tile = cuda.shared.array((TILE, D), float32)
    k_tile = cuda.shared.array((TILE, D), float32)
    v_tile = cuda.shared.array((TILE, D), float32)
    s = cuda.shared.array((TILE, TILE), float32)
    # YOUR CODE HERE: exercise ladder_k2.tree_attention_kernel, region 2 (delete the todo line when you start)
    todo("ladder_k2.tree_attention_kernel", region=2, lines=7, defines="acc, row, m_prev, l_prev")
    for j in range(tiles):
        # Thread t loads key row t of the tile (zeros past N, so no NaN reaches P.V).
        key = j * TILE + t
        for x in range(D):
            k_tile[t, x] = k[b, h, key, x] if key < n else ZERO
            v_tile[t, x] = v[b, h, key, x] if key < n else ZERO
        cuda.syncthreads()
        # YOUR CODE HERE: exercise ladder_k2.tree_attention_kernel, region 3 (delete the todo line when you start)
        todo("ladder_k2.tree_attention_kernel", region=3, lines=27, defines="l_prev")
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
    # YOUR CODE HERE: exercise ladder_k2.tree_attention_kernel, region 4 (delete the todo line when you start)
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
