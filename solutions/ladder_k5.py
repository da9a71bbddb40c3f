"""Rung 5 of the tree-attention ladder (notebook 07): each tile's mask in a register.

Rung 4 tests a key's interval (two shared-memory reads, two compares) inside the
score loop, interleaved with the dot products. Here each thread first turns the
tile's 32 interval tests for its row into the 32 bits of one integer held in a
register, in a short loop of its own; the score loop then tests a bit instead of
reading memory (FlashSpecInfer §5.2). The same bits later tell a whole tile apart
that no row of the block can see (notebook 11a).

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
    q_t = cuda.shared.array((D, PADDED), float32)  # transposed; +1 spreads the store's banks
    k_tile = cuda.shared.array((TILE, D), float32)
    v_tile = cuda.shared.array((TILE, D), float32)
    s_t = cuda.shared.array((TILE, TILE), float32)  # transposed: s_t[key, row]
    key_start = cuda.shared.array(TILE, int32)
    key_end = cuda.shared.array(TILE, int32)
    # This block's query tile is loaded once; the row's state lives in the thread.
    acc = cuda.local.array(D, float32)  # this row's unnormalised output
    row = i * TILE + t
    for r in range(TILE):  # the 32 threads load row r together: one coalesced read
        for x0 in range(0, D, TILE):
            q_t[x0 + t, r] = q[b, h, i * TILE + r, x0 + t] if i * TILE + r < n else ZERO
    for x in range(D):
        acc[x] = ZERO
    # A row past N gets start -1 so that no key's interval contains it.
    my_start = start[b, row] if row < n else NOBODY
    my_end = end[b, row] if row < n else NOBODY
    m_prev = NEG_INF
    l_prev = ZERO
    for j in range(tiles):
        # The threads load each key row together (zeros past N, so no NaN reaches P.V).
        for r in range(TILE):
            key_r = j * TILE + r
            for x0 in range(0, D, TILE):
                k_tile[r, x0 + t] = k[b, h, key_r, x0 + t] if key_r < n else ZERO
                v_tile[r, x0 + t] = v[b, h, key_r, x0 + t] if key_r < n else ZERO
        key = j * TILE + t
        # A key past N gets the empty interval [N, -1], which contains no row.
        key_start[t] = start[b, key] if key < n else n
        key_end[t] = end[b, key] if key < n else NOBODY
        cuda.syncthreads()
        if row < n:
            # Scores of this row against the tile's keys; hidden keys score -inf.
            ### BEGIN SOLUTION
            visible = 0  # bit c: this row sees key c of the tile
            for c in range(TILE):
                if key_start[c] <= my_start and my_end <= key_end[c]:
                    visible |= 1 << c
            ### END SOLUTION
            m_new = m_prev
            for c in range(TILE):
                score = NEG_INF
                ### BEGIN SOLUTION
                if (visible >> c) & 1:
                    dot = ZERO
                    for x in range(D):
                        dot += q_t[x, t] * k_tile[c, x]
                    score = dot * SCALE
                ### END SOLUTION
                s_t[c, t] = score
                m_new = max(m_new, score)
            seen_a_key = m_new != NEG_INF  # otherwise no key seen yet: nothing to add
            if seen_a_key:
                l_tile = ZERO
                for c in range(TILE):
                    p = math.exp(s_t[c, t] - m_new)
                    s_t[c, t] = p
                    l_tile += p
                alpha = math.exp(m_prev - m_new)  # rescales what earlier tiles added
                for x in range(D):
                    pv = ZERO
                    for c in range(TILE):
                        pv += s_t[c, t] * v_tile[c, x]
                    acc[x] = alpha * acc[x] + pv
                l_prev = alpha * l_prev + l_tile
                m_prev = m_new
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
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
