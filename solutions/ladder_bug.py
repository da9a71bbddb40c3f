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
    b, h, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    q_tile = cuda.shared.array((TILE, D), float32)
    k_tile = cuda.shared.array((TILE, D), float32)
    v_tile = cuda.shared.array((TILE, D), float32)
    s = cuda.shared.array((TILE, TILE), float32)
    key_start = cuda.shared.array(TILE, int32)
    key_end = cuda.shared.array(TILE, int32)
    # This block's query tile is loaded once; the row's state lives in the thread.
    acc = cuda.local.array(D, float32)  # this row's unnormalised output
    row = i * TILE + t
    for x in range(D):
        q_tile[t, x] = q[b, h, row, x] if row < n else ZERO
        acc[x] = ZERO
    # A row past N gets start -1 so that no key's interval contains it.
    my_start = start[b, row] if row < n else NOBODY
    my_end = end[b, row] if row < n else NOBODY
    m_prev = NEG_INF
    l_prev = ZERO
    for j in range(tiles):
        # Thread t loads key row t of the tile (zeros past N, so no NaN reaches P.V).
        key = j * TILE + t
        for x in range(D):
            k_tile[t, x] = k[b, h, key, x] if key < n else ZERO
            v_tile[t, x] = v[b, h, key, x] if key < n else ZERO
        # A key past N gets the empty interval [N, -1], which contains no row.
        key_start[t] = start[b, key] if key < n else n
        key_end[t] = end[b, key] if key < n else NOBODY
        cuda.syncthreads()
        if row < n:
            # Scores of this row against the tile's keys; hidden keys score -inf.
            m_new = m_prev
            for c in range(TILE):
                score = NEG_INF
                if key_start[c] <= my_start and my_end <= key_end[c]:
                    dot = ZERO
                    for x in range(D):
                        dot += q_tile[t, x] * k_tile[c, x]
                    score = dot * SCALE
                s[t, c] = score
                m_new = max(m_new, score)
            seen_a_key = m_new != NEG_INF  # otherwise no key seen yet: nothing to add
            if seen_a_key:
                l_tile = ZERO
                for c in range(TILE):
                    p = math.exp(s[t, c] - m_new)
                    s[t, c] = p
                    l_tile += p
                alpha = math.exp(m_prev - m_new)  # rescales what earlier tiles added
                for x in range(D):
                    pv = ZERO
                    for c in range(TILE):
                        pv += s[t, c] * v_tile[c, x]
                    acc[x] = alpha * acc[x] + pv
                l_prev = alpha * l_prev + l_tile
                m_prev = m_new
        ### BEGIN SOLUTION
        # The bug: without this barrier a thread that finishes its row early (a row past
        # N, or one that sees few keys of the tile) loads the next key tile over the one
        # its neighbours are still reading. One warp often runs in step, so a GPU may hide
        # it; the simulator's threads do not, and compute-sanitizer's racecheck names it.
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
        ### LESSON
        ### END SOLUTION
    if row < n:
        for x in range(D):
            out[b, h, row, x] = acc[x] / l_prev  # l_prev > 0: every query sees itself


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
