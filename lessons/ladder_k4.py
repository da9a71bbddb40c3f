# Student copy, generated from solutions/ladder_k4.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
# The lines under `# COPY FROM YOUR lessons/ladder_k3.py` hold your own rung 3's code: run
# `python -m course carry ladder_k4` (or pass rung 3's check) to fill rung 3's parts
# (in a hand-out, which cannot carry, copy them from your lessons/ladder_k3.py).
"""Rung 4 of the tree-attention ladder (notebook 06): coalesced loads into transposed tiles.

Up to rung 3, thread t loads row t of each tile: in one load instruction the 32
threads touch 32 addresses d floats apart, 32 separate memory transactions. Here
the threads load a row together, thread t taking element t (then t + 32, ...):
one instruction reads 128 consecutive bytes. The query tile and the score tile are
stored transposed (q_t[x, row], s_t[key, row]), so when each thread reads its own
row, the 32 threads read 32 consecutive words, one per bank; row-major they all
hit one bank (d and TILE are multiples of 32). q_t has TILE + 1 columns so that
the transposing store (thread t writes column x0 + t of one row) also spreads over
all banks (FlashSpecInfer §5.2).

Limits: float32; head dimension d in HEAD_DIMS (a multiple of TILE for the
cooperative loads); any N >= 1.
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
    # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 1 (delete the todo line when you start)
    todo("ladder_k4.tree_attention_kernel", region=1, lines=1, defines="q_t")
    k_tile = cuda.shared.array((TILE, D), float32)
    v_tile = cuda.shared.array((TILE, D), float32)
    # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 2 (delete the todo line when you start)
    todo("ladder_k4.tree_attention_kernel", region=2, lines=1, defines="s_t")
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 1 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=1, lines=2, defines="key_start, key_end")
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="acc, row")
    # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 3 (delete the todo line when you start)
    todo("ladder_k4.tree_attention_kernel", region=3, lines=5)
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 2 of ladder_k3.tree_attention_kernel that stand here
    todo("ladder_k3.tree_attention_kernel", region=2, lines=2, defines="my_start, my_end")
    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 2 of ladder_k2.tree_attention_kernel that stand here
    todo("ladder_k2.tree_attention_kernel", region=2, lines=2, defines="m_prev, l_prev")
    for j in range(tiles):
        # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 4 (delete the todo line when you start)
        todo("ladder_k4.tree_attention_kernel", region=4, lines=6, defines="key")
        # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k3.tree_attention_kernel that stand here
        todo("ladder_k3.tree_attention_kernel", region=3, lines=2)
        cuda.syncthreads()
        if row < n:
            # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
            todo("ladder_k2.tree_attention_kernel", region=3, lines=1, defines="m_new")
            for c in range(TILE):
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                todo("ladder_k2.tree_attention_kernel", region=3, lines=1)
                # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 5 (delete the todo line when you start)
                todo("ladder_k4.tree_attention_kernel", region=5, lines=6, defines="score")
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                todo("ladder_k2.tree_attention_kernel", region=3, lines=1, defines="m_new")
            # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
            todo("ladder_k2.tree_attention_kernel", region=3, lines=1, defines="seen_a_key")
            if seen_a_key:
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                todo("ladder_k2.tree_attention_kernel", region=3, lines=1)
                for c in range(TILE):
                    # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 6 (delete the todo line when you start)
                    todo("ladder_k4.tree_attention_kernel", region=6, lines=2, defines="p")
                    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                    todo("ladder_k2.tree_attention_kernel", region=3, lines=1, defines="l_tile")
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                todo("ladder_k2.tree_attention_kernel", region=3, lines=1, defines="alpha")
                for x in range(D):
                    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                    todo("ladder_k2.tree_attention_kernel", region=3, lines=1)
                    for c in range(TILE):
                        # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 7 (delete the todo line when you start)
                        todo("ladder_k4.tree_attention_kernel", region=7, lines=1, defines="pv")
                    # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                    todo("ladder_k2.tree_attention_kernel", region=3, lines=1)
                # COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k2.tree_attention_kernel that stand here
                todo("ladder_k2.tree_attention_kernel", region=3, lines=2, defines="l_prev")
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
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
