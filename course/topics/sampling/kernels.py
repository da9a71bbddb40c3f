"""Notebook 15's given kernels: the probabilities of a tile, however they come, and the softmax's statistics.

Your tile pass and resample kernels (lessons/spec_sampling.py) read a tile of weights through
`load_weights`: probabilities as given (PROBABILITIES), softmax(logits) fused (SOFTMAX: from a
row's max and sum of exponentials, which `softmax_stats_kernel` writes per tile and
`row_softmax_stats` combines) or the seed paper's sigmoid approximation (SIGMOID, its Eq. 5:
sigmoid(alpha * z + beta), no row-wide statistic at all). Probabilities are never written.
"""

from __future__ import annotations

import triton
import triton.language as tl

from course.core import interpreter

# What the probability tensors hold (a compile-time constant of the kernels).
PROBABILITIES = tl.constexpr(0)  # probabilities, used as given
SOFTMAX = tl.constexpr(1)  # logits; weights = softmax(logits), fused
SIGMOID = tl.constexpr(2)  # logits; weights = sigmoid(alpha * logits + beta) (the seed paper's Eq. 5)
FORMS = {"probs": 0, "logits": 1, "sigmoid": 2}


@triton.jit
def row_softmax_stats(tile_max, tile_sum, row, T, TILES_BLOCK: tl.constexpr):
    """(m, l) of one row from its T per-tile pairs (stored at row * T + k): m = max over the row,
    l = sum over the row of exp(z - m) = sum_k l_k * exp(m_k - m). Every program of a row that
    calls this gets the same two numbers, bit for bit."""
    ks = tl.arange(0, TILES_BLOCK)
    inside = ks < T
    m_k = tl.load(tile_max + row * T + ks, mask=inside, other=float("-inf"))
    l_k = tl.load(tile_sum + row * T + ks, mask=inside, other=0.0)
    m = tl.max(m_k, axis=0)
    return m, tl.sum(tl.where(inside, l_k * tl.exp(m_k - m), 0.0), axis=0)


@triton.jit
def load_weights(ptr, row, V, idx, inside, m, l, alpha, beta, FORM: tl.constexpr):
    """Entries idx of row `row` of a contiguous (rows, V) float32 tensor, as probabilities:
    as given (PROBABILITIES), exp(z - m) / l (SOFTMAX, with the row's statistics m, l) or
    sigmoid(alpha * z + beta) (SIGMOID). 0 where `inside` is false. idx may be a block or a scalar."""
    offsets = row.to(tl.int64) * V + idx
    if FORM == PROBABILITIES:
        w = tl.load(ptr + offsets, mask=inside, other=0.0)
    elif FORM == SOFTMAX:
        z = tl.load(ptr + offsets, mask=inside, other=0.0)
        w = tl.exp(z - m) / l
    else:
        z = tl.load(ptr + offsets, mask=inside, other=0.0)
        w = tl.sigmoid(alpha * z + beta)
    return tl.where(inside, w, 0.0)


@triton.jit
def softmax_stats_kernel(P, Q, p_max, p_sum, q_max, q_sum, V, T, GAMMA, TILE: tl.constexpr):
    """From logits: each tile's max and sum of exp(z - max), for p (every row) and q (rows c < gamma);
    stored at (b * (gamma + 1) + c) * T + k, the layout `row_softmax_stats` reads."""
    row = tl.program_id(0)
    k = tl.program_id(1)
    b = row // (GAMMA + 1)
    c = row % (GAMMA + 1)
    idx = k * TILE + tl.arange(0, TILE)
    inside = idx < V  # tile k < T holds at least one entry, so the max is finite
    z = tl.load(P + row.to(tl.int64) * V + idx, mask=inside, other=float("-inf"))
    m = tl.max(z, axis=0)
    tl.store(p_max + row * T + k, m)
    tl.store(p_sum + row * T + k, tl.sum(tl.exp(z - m), axis=0))
    if c < GAMMA:
        y = tl.load(Q + (b * GAMMA + c).to(tl.int64) * V + idx, mask=inside, other=float("-inf"))
        m_q = tl.max(y, axis=0)
        tl.store(q_max + row * T + k, m_q)
        tl.store(q_sum + row * T + k, tl.sum(tl.exp(y - m_q), axis=0))


interpreter.prepare(row_softmax_stats, load_weights, softmax_stats_kernel)
