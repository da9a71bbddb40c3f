"""Notebook 15: speculative sampling in Triton, the seed paper's tiled kernel.

Speculative sampling (Leviathan et al., 2023, Algorithm 1; Chen et al., 2023, Algorithm 2) accepts
draft token x_c while r_c < min(1, p_c(x_c) / q_c(x_c)); at the first rejection the emitted token is
drawn from the residual max(0, p_c - q_c) (normalised), after gamma acceptances a bonus token from
p_gamma. The seed paper (Wagner et al., 2024) computes, tile by tile of the vocabulary, the partial
sums b_k of that residual and the acceptance tests (`tile_pass_kernel`, its Figure 1), then draws
by the inverse CDF in two levels, the tile from the partial sums, the token inside that one tile
(`resample_kernel`, its Figure 2, with `first_crossing` at each level). The specification is
`pyspec_ref.sampling.speculative_sampling`; this module emits its tokens from the same random
numbers. The launch settings, the launcher for timing and the sigmoid approximation:
`course.topics.sampling.launch`; the given kernels: `course.topics.sampling.kernels`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course.core import interpreter
from course.core.stubs import todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.sampling import launch
from course.topics.sampling.kernels import SOFTMAX, load_weights, row_softmax_stats
from course.topics.sampling.launch import SamplingKernels, prepare_sampling

TILE = launch.TILE  # vocabulary entries per program, as the launchers take them (the checks read it)
PAD = -1  # pads the emitted rows after the last emitted token (pyspec_ref.sampling.PAD)
PAD_ID = tl.constexpr(PAD)  # the same, as a constant the kernels can read


@triton.jit
def first_crossing(weights, offset, threshold, BLOCK: tl.constexpr):
    """One level of the inverse CDF: (j, before) for a block of BLOCK non-negative weights.

    j is the smallest index with offset + w_0 + ... + w_j > threshold and w_j > 0 (the token, or
    the tile, that the draw u lands in when threshold = u * total); when rounding leaves no such
    index (threshold at or past the block's float32 total), the last index with w_j > 0.
    before = offset + w_0 + ... + w_{j-1}, the cumulative weight in front of j: the offset of the
    next level's search. A zero weight is never chosen; a block with no positive weight gives
    j = -1 (only a row of sigmoid weights that all underflow: the resample kernel emits PAD).
    """
    ### BEGIN SOLUTION
    positions = tl.arange(0, BLOCK)
    cumulative = offset + tl.cumsum(weights, axis=0)
    positive = weights > 0.0
    crossed = (cumulative > threshold) & positive
    first = tl.min(tl.where(crossed, positions, BLOCK), axis=0)
    last_positive = tl.max(tl.where(positive, positions, -1), axis=0)
    j = tl.where(first < BLOCK, first, last_positive)
    before = tl.sum(tl.where(positions == j, cumulative - weights, 0.0), axis=0)
    ### END SOLUTION
    return j, before


@triton.jit
def tile_pass_kernel(X, P, Q, R, accept, residual_sums, target_sums, p_max, p_sum, q_max, q_sum,
                     V, T, GAMMA, alpha, beta, FORM: tl.constexpr, TILE: tl.constexpr,
                     TILES_BLOCK: tl.constexpr):
    """Program (row, k), row = b * (gamma + 1) + c: the seed paper's per-tile pass (Figure 1).

    Writes residual_sums[row, k] = b_k = sum over tile k of a = max(0, f), f = p_c - q_c (for the
    bonus row c = gamma, q is 0 and a = p), target_sums[row, k] = sum over tile k of p_c, and, in
    the program of tile 0 of a row c < gamma, accept[b, c] = 1 if r_c * q_c(x_c) < p_c(x_c)
    (the test r < tau, tau = min(1, p/q)), computed in float64 (exact for float32 inputs).
    """
    row = tl.program_id(0)
    k = tl.program_id(1)
    b = row // (GAMMA + 1)
    c = row % (GAMMA + 1)
    has_draft = c < GAMMA
    q_row = b * GAMMA + c
    m_p, l_p, m_q, l_q = 0.0, 1.0, 0.0, 1.0
    if FORM == SOFTMAX:
        m_p, l_p = row_softmax_stats(p_max, p_sum, row, T, TILES_BLOCK)
        m_q, l_q = row_softmax_stats(q_max, q_sum, row, T, TILES_BLOCK)
    idx = k * TILE + tl.arange(0, TILE)
    inside = idx < V  # the last tile is ragged when V is not a multiple of TILE
    p = load_weights(P, row, V, idx, inside, m_p, l_p, alpha, beta, FORM)
    q = load_weights(Q, q_row, V, idx, inside & has_draft, m_q, l_q, alpha, beta, FORM)
    ### BEGIN SOLUTION
    f = p - q
    a = tl.maximum(f, 0.0)
    tl.store(residual_sums + row * T + k, tl.sum(a, axis=0))
    tl.store(target_sums + row * T + k, tl.sum(p, axis=0))
    if has_draft & (k == 0):
        x = tl.load(X + q_row)
        p_x = load_weights(P, row, V, x, x < V, m_p, l_p, alpha, beta, FORM)
        q_x = load_weights(Q, q_row, V, x, x < V, m_q, l_q, alpha, beta, FORM)
        r = tl.load(R + q_row)
        test = r.to(tl.float64) * q_x.to(tl.float64) < p_x.to(tl.float64)
        tl.store(accept + q_row, test.to(tl.int8))
    ### END SOLUTION


@triton.jit
def resample_kernel(X, P, Q, U, accept, residual_sums, target_sums, p_max, p_sum, q_max, q_sum,
                    accepted, emitted, V, T, GAMMA, alpha, beta, FORM: tl.constexpr, TILE: tl.constexpr,
                    TILES_BLOCK: tl.constexpr, GAMMA_BLOCK: tl.constexpr):
    """Program b (the seed paper's Figure 2): the first rejected position c* (gamma if none), then a
    draw from row c*'s residual (p itself if the residual is empty, or at c* = gamma) by the
    inverse CDF in two levels: the tile, from the partial sums; the token, from that tile."""
    b = tl.program_id(0)
    cs = tl.arange(0, GAMMA_BLOCK)
    flags = tl.load(accept + b * GAMMA + cs, mask=cs < GAMMA, other=1)
    first = tl.min(tl.where((flags == 0) & (cs < GAMMA), cs, GAMMA), axis=0)
    row = b * (GAMMA + 1) + first
    u = tl.load(U + row)
    ks = tl.arange(0, TILES_BLOCK)
    residual = tl.load(residual_sums + row * T + ks, mask=ks < T, other=0.0)
    # Level 1: the row's weights are its residual, or p where the residual is empty (every b_k 0);
    # the tile k where their cumulative sum crosses threshold = u * total, and the mass before it.
    ### BEGIN SOLUTION (spec_sampling.first_crossing)
    # A sum of non-negative float32 numbers is 0 exactly when every one is: p <= q everywhere.
    empty = tl.sum(residual, axis=0) == 0.0
    sums = tl.where(empty, tl.load(target_sums + row * T + ks, mask=ks < T, other=0.0), residual)
    threshold = u * tl.sum(sums, axis=0)
    k, before = first_crossing(sums, 0.0, threshold, TILES_BLOCK)
    ### END SOLUTION
    # No positive weight in the row (only a sigmoid whose every weight underflows): no token.
    nothing = k < 0
    k = tl.maximum(k, 0)
    # The one tile the draw lands in, its weights computed again exactly as the tile pass did.
    m_p, l_p, m_q, l_q = 0.0, 1.0, 0.0, 1.0
    if FORM == SOFTMAX:
        m_p, l_p = row_softmax_stats(p_max, p_sum, row, T, TILES_BLOCK)
        m_q, l_q = row_softmax_stats(q_max, q_sum, row, T, TILES_BLOCK)
    idx = k * TILE + tl.arange(0, TILE)
    inside = idx < V
    p = load_weights(P, row, V, idx, inside, m_p, l_p, alpha, beta, FORM)
    q = load_weights(Q, b * GAMMA + first, V, idx, inside & (first < GAMMA), m_q, l_q, alpha, beta, FORM)
    # Level 2: the token inside tile k (the tile's weights as level 1 summed them); PAD if none.
    ### BEGIN SOLUTION (spec_sampling.first_crossing)
    weights = tl.where(empty, p, tl.maximum(p - q, 0.0))
    j, _ = first_crossing(weights, before, threshold, TILE)
    token = tl.where(nothing | (j < 0), PAD_ID, k * TILE + j)
    ### END SOLUTION
    tl.store(accepted + b, first)
    draft = tl.load(X + b * GAMMA + cs, mask=cs < GAMMA, other=0)
    out = tl.where(cs < first, draft, tl.where(cs == first, token, PAD_ID))
    tl.store(emitted + b * (GAMMA + 1) + cs, out.to(emitted.dtype.element_ty), mask=cs <= GAMMA)


interpreter.prepare(first_crossing, tile_pass_kernel, resample_kernel)


def _own_kernels() -> SamplingKernels:
    return SamplingKernels(tile_pass_kernel, first_crossing, resample_kernel)


def speculative_sampling(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                         accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor, *,
                         from_logits: bool = False, tile: int | None = None):
    """(accepted (B,) int32, emitted (B, gamma + 1)) for draft_tokens (B, gamma), draft distributions
    q (B, gamma, V), target distributions p (B, gamma + 1, V) and uniforms (B, gamma), (B, gamma + 1):
    `pyspec_ref.sampling.speculative_sampling_batch` on a GPU. With from_logits=True, q and p are
    logits and the softmax is fused into the kernels. emitted is padded with PAD after the last
    emitted token."""
    if not isinstance(from_logits, bool):
        raise TypeError(f"from_logits must be a bool, got {type(from_logits).__name__}")
    accepted, emitted = prepare_sampling(_own_kernels(), draft_tokens, q, p, accept_uniforms, sample_uniforms,
                                         form="logits" if from_logits else "probs", tile=tile)()
    return accepted.clone(), emitted.clone()


def tile_pass(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, accept_uniforms: torch.Tensor,
              *, from_logits: bool = False, tile: int | None = None):
    """The per-tile pass alone: (accept (B, gamma) bool, residual_sums (B, gamma + 1, T),
    target_sums (B, gamma + 1, T)) float32, T = cdiv(V, tile): residual_sums[b, c, k] is the sum of
    max(0, p - q) over tile k of position c (of p at c = gamma), target_sums[b, c, k] that of p."""
    if not isinstance(from_logits, bool):
        raise TypeError(f"from_logits must be a bool, got {type(from_logits).__name__}")
    run = prepare_sampling(_own_kernels(), draft_tokens, q, p, accept_uniforms, None,
                           form="logits" if from_logits else "probs", tile=tile)
    return tuple(t.clone() for t in run.tile_pass())
