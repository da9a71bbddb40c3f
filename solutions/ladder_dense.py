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
    b, h, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    t = cuda.threadIdx.x
    n = q.shape[2]
    tiles = (n + TILE - 1) // TILE
    q_t = cuda.shared.array((D, PADDED), float32)  # transposed; +1 spreads the store's banks
    k_t = cuda.shared.array((D, PADDED), float32)  # transposed, like q_t
    v_tile = cuda.shared.array((TILE, D_PADDED), float32)  # also stages the output tile
    s_t = cuda.shared.array((TILE, PADDED), float32)  # transposed: s_t[key, row]
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
    m_prev = NEG_INF
    l_prev = ZERO
    for j in range(tiles):
        # The threads load each key row together (zeros past N, so no NaN reaches P.V).
        for r in range(TILE):
            key_r = j * TILE + r
            for x0 in range(0, D, TILE):
                k_t[x0 + t, r] = k[b, h, key_r, x0 + t] if key_r < n else ZERO
                v_tile[r, x0 + t] = v[b, h, key_r, x0 + t] if key_r < n else ZERO
        cuda.syncthreads()
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
        visible = 0  # bit c: this row sees key c of the tile
        ### BEGIN SOLUTION
        for c in range(TILE):
            if row < n and j * TILE + c < n and mask[b, row, j * TILE + c]:
                visible |= 1 << c
        ### END SOLUTION
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
