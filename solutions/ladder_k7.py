"""Rung 7 of the tree-attention ladder (notebook 09): coalesced writes through shared memory.

In rung 6 thread (ty, tx) writes its 4 x D/4 outputs itself: one store instruction
of the warp touches 8 rows, 4 words of each, 8 separate 16-byte pieces. Here the
threads first put the normalised output tile into shared memory (the value tile's
buffer, free once the last key tile is done), then write it out a row at a time,
thread t taking element t: 128 consecutive bytes per instruction (FlashSpecInfer
§5.2). The value tile gets D + 1 columns so that the register tile's stores into
it, 8 rows apart at the same column, fall into different banks.

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
D_PADDED = D + 1  # the value tile's row length: its rows start in different banks


def tree_attention_kernel(q, k, v, start, end, out):
    b, h, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    q_t = cuda.shared.array((D, PADDED), float32)  # transposed; +1 spreads the store's banks
    k_tile = cuda.shared.array((TILE, D), float32)
    ### BEGIN SOLUTION
    v_tile = cuda.shared.array((TILE, D_PADDED), float32)  # also stages the output tile
    ### END SOLUTION
    s_t = cuda.shared.array((TILE, TILE), float32)  # transposed: s_t[key, row]
    key_start = cuda.shared.array(TILE, int32)
    key_end = cuda.shared.array(TILE, int32)
    row_scale = cuda.shared.array(TILE, float32)  # each row's alpha, from its softmax thread
    row_sum = cuda.shared.array(TILE, float32)
    # Thread (ty, tx) owns output rows ROWS*ty .. ROWS*ty+3, columns tx, tx + COL_STRIDE, ...
    ty, tx = t // COL_STRIDE, t % COL_STRIDE
    acc = cuda.local.array((ROWS, COLS), float32)
    p_reg = cuda.local.array(ROWS, float32)
    row = i * TILE + t
    for r in range(TILE):  # the 32 threads load row r together: one coalesced read
        for x0 in range(0, D, TILE):
            q_t[x0 + t, r] = q[b, h, i * TILE + r, x0 + t] if i * TILE + r < n else ZERO
    for rr in range(ROWS):
        for cc in range(COLS):
            acc[rr, cc] = ZERO
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
        # Softmax, one thread per row (rows past N see nothing and write zeros).
        # Scores of this row against the tile's keys; hidden keys score -inf.
        visible = 0  # bit c: this row sees key c of the tile
        for c in range(TILE):
            if key_start[c] <= my_start and my_end <= key_end[c]:
                visible |= 1 << c
        m_new = m_prev
        for c in range(TILE):
            score = NEG_INF
            if (visible >> c) & 1:
                dot = ZERO
                for x in range(D):
                    dot += q_t[x, t] * k_tile[c, x]
                score = dot * SCALE
            s_t[c, t] = score
            m_new = max(m_new, score)
        alpha = ONE
        if m_new != NEG_INF:
            l_tile = ZERO
            for c in range(TILE):
                p = math.exp(s_t[c, t] - m_new)
                s_t[c, t] = p
                l_tile += p
            alpha = math.exp(m_prev - m_new)  # rescales what earlier tiles added
            l_prev = alpha * l_prev + l_tile
            m_prev = m_new
        else:  # no key seen yet: every probability is 0 (not exp(-inf + inf) = NaN)
            for c in range(TILE):
                s_t[c, t] = ZERO
        row_scale[t] = alpha
        cuda.syncthreads()  # P and alpha are complete before other threads read them
        # P.V on a register tile: 4 probabilities and D/4 values feed 4 x D/4 multiply-adds.
        for rr in range(ROWS):
            alpha_r = row_scale[ROWS * ty + rr]
            for cc in range(COLS):
                acc[rr, cc] *= alpha_r
        for c in range(TILE):
            for rr in range(ROWS):
                p_reg[rr] = s_t[c, ROWS * ty + rr]
            for cc in range(COLS):
                v_c = v_tile[c, tx + COL_STRIDE * cc]
                for rr in range(ROWS):
                    acc[rr, cc] += p_reg[rr] * v_c
        cuda.syncthreads()  # every thread is done with this key tile before it is overwritten
    ### BEGIN SOLUTION
    row_sum[t] = l_prev if row < n else ONE  # a row past N has no keys: keep 0/0 out of the tile
    cuda.syncthreads()
    for rr in range(ROWS):
        for cc in range(COLS):
            v_tile[ROWS * ty + rr, tx + COL_STRIDE * cc] = acc[rr, cc] / row_sum[ROWS * ty + rr]
    cuda.syncthreads()
    for r in range(TILE):  # the 32 threads write row r together: one coalesced store
        out_row = i * TILE + r
        if out_row < n:
            for x0 in range(0, D, TILE):
                out[b, h, out_row, x0 + t] = v_tile[r, x0 + t]
    ### END SOLUTION


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
