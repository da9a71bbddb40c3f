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
    b, h, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    q_t = cuda.shared.array((D, PADDED), float32)  # transposed; +1 spreads the store's banks
    k_t = cuda.shared.array((D, PADDED), float32)  # transposed, like q_t
    v_tile = cuda.shared.array((TILE, D_PADDED), float32)  # also stages the output tile
    s_t = cuda.shared.array((TILE, PADDED), float32)  # transposed: s_t[key, row]
    key_start = cuda.shared.array(TILE, int32)
    key_end = cuda.shared.array(TILE, int32)
    row_scale = cuda.shared.array(TILE, float32)  # each row's alpha, from its softmax thread
    row_sum = cuda.shared.array(TILE, float32)
    # Thread (ty, tx) owns output rows ROWS*ty .. ROWS*ty+3, columns tx, tx + COL_STRIDE, ...
    ty, tx = t // COL_STRIDE, t % COL_STRIDE
    acc = cuda.local.array((ROWS, COLS), float32)
    p_reg = cuda.local.array(ROWS, float32)
    q_reg = cuda.local.array(ROWS, float32)
    s_reg = cuda.local.array((ROWS, KEYS), float32)
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
        ### BEGIN SOLUTION
        # One byte, the same in every thread, says whether any row of the tile sees any key
        # of tile j: all threads skip together, so the skip needs no barrier.
        if tile_visible[b, i, j] == 0:
            continue
        ### END SOLUTION
        key = j * TILE + t
        # A key past N gets the empty interval [N, -1], which contains no row.
        key_start[t] = start[b, key] if key < n else n
        key_end[t] = end[b, key] if key < n else NOBODY
        # The threads load each key row together (zeros past N, so no NaN reaches P.V).
        for r in range(TILE):
            key_r = j * TILE + r
            for x0 in range(0, D, TILE):
                k_t[x0 + t, r] = k[b, h, key_r, x0 + t] if key_r < n else ZERO
                v_tile[r, x0 + t] = v[b, h, key_r, x0 + t] if key_r < n else ZERO
        cuda.syncthreads()
        ### BEGIN SOLUTION
        # The keys' times arrived behind the same barrier as the keys: the row's bits now.
        visible = 0  # bit c: this row sees key c of the tile
        for c in range(TILE):
            if key_start[c] <= my_start and my_end <= key_end[c]:
                visible |= 1 << c
        ### END SOLUTION
        # Q.K^T on a register tile: 4 query and 8 key elements feed 4 x 8 multiply-adds.
        for rr in range(ROWS):
            for cc in range(KEYS):
                s_reg[rr, cc] = ZERO
        for x in range(D):
            for rr in range(ROWS):
                q_reg[rr] = q_t[x, ROWS * ty + rr]
            for cc in range(KEYS):
                k_c = k_t[x, tx + COL_STRIDE * cc]
                for rr in range(ROWS):
                    s_reg[rr, cc] += q_reg[rr] * k_c
        for rr in range(ROWS):
            for cc in range(KEYS):
                s_t[tx + COL_STRIDE * cc, ROWS * ty + rr] = s_reg[rr, cc] * SCALE
        cuda.syncthreads()
        # Softmax, one thread per row (rows past N see nothing and write zeros).
        m_new = m_prev
        for c in range(TILE):
            if (visible >> c) & 1:
                m_new = max(m_new, s_t[c, t])
        alpha = ONE
        if m_new != NEG_INF:
            l_tile = ZERO
            for c in range(TILE):
                p = math.exp(s_t[c, t] - m_new) if (visible >> c) & 1 else ZERO
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
    ### BEGIN SOLUTION
    row = i * TILE + t
    # A row past N gets the times -1, -1: no key's interval contains them.
    row_start[t] = start[b, row] if row < n else NOBODY
    row_end[t] = end[b, row] if row < n else NOBODY
    cuda.syncthreads()  # every thread tests every row of the tile
    j = group * THREADS + t  # this thread's key tile
    if j < tiles:
        seen = 0
        for c in range(TILE):
            key = j * TILE + c
            if key < n and seen == 0:
                key_start, key_end = start[b, key], end[b, key]
                for r in range(TILE):  # every thread reads the same row: a broadcast
                    if key_start <= row_start[r] and row_end[r] <= key_end:
                        seen = 1
        tile_visible[b, i, j] = seen
    ### END SOLUTION


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
