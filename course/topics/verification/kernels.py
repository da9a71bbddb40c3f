"""Notebook 16's given kernels: the closed-form residual, the draw after the walk, the argmax.

Your `tree_walk_kernel` (lessons/tree_verification.py) keeps the state (C, Z, S) of the node it
is at and, after a rejection, asks `residual_mass` for Z of the next sibling. After the walk,
`residual_tile_sums_kernel` (grid (B, T), T = cdiv(V, BLOCK_V)) sums each vocabulary tile of the
final node's residual max(0, p - C q) and `inverse_cdf_kernel` (one program per tree) draws the
next token from it: the crossing tile from the tile sums, then the token inside that tile
(`inverse_cdf_by_tiles`). Greedy verification reads the target's argmax of a node (`row_argmax`,
the first maximum on ties, as torch.argmax), for every node at once (`argmax_kernel`) or inside
your walk, for the nodes of the path only.

The residual needs no scratch copy of p: after i - 1 rejections the current distribution is a
closed form of the two rows p = p_u and q = q_u,

    p_i = max(0, p - C_i q) / Z_i,    C_1 = 0, Z_1 = 1, S_1 = 1,
    on a rejection of x_i:  C_{i+1} = C_i + Z_i / S_i,    S_{i+1} = S_i - q(x_i),
                            Z_{i+1} = sum_v max(0, p(v) - C_{i+1} q(v)),

and the test r q_i(x) < p_i(x), multiplied by S_i Z_i > 0, is r q(x) Z_i < S_i max(0, p(x) -
C_i q(x)): no division. With replacement S stays 1 and this is C_{i+1} = C_i + Z_i.

One refinement of S: at the first rejection S_2 = Q - q(x_1) with Q = sum_v q(v), summed in
the same pass as Z_2 (`residual_mass`). S_1 = 1 treats q as normalised, so the first test is
exactly r q(x) < p(x), as for a chain; but a float32 q sums to 1 only within ~1e-7, and the
later tests divide by S, which is tiny when the draft put nearly all its mass on the rejected
tokens (a confident draft at a low temperature): 1 - q(x_1) would then be off by a large
factor, Q - q(x_1) is the mass the later siblings were really drawn from.

Derivation (induction over i). Suppose p_i = max(0, p - C q)/Z, and every drawn and rejected
x_j (j < i) with q(x_j) > 0 has p_i(x_j) = 0. Then for a token v not yet drawn,
max(0, p_i - q_i)(v) = max(0, max(0, p - C q)/Z - q/S)(v) = max(0, p - (C + Z/S) q)(v) / Z,
because q >= 0 (if p - C q <= 0 both sides are 0). For a drawn x_j, q_i(x_j) = 0 and p_i(x_j) =
0 so the residual is 0 there, and so is max(0, p - (C + Z/S) q)(x_j) <= max(0, p - C q)(x_j) = 0.
Renormalising divides by the sum, so p_{i+1} = max(0, p - C_{i+1} q) / Z_{i+1}. The rejected x_i
itself falls to zero in this residual by itself: it was rejected, so r q_i(x_i) >= p_i(x_i)
with r < 1, hence p_i(x_i) <= q_i(x_i) (equality only at p_i(x_i) = q_i(x_i) = 0), and
p_{i+1}(x_i) = max(0, p_i - q_i)(x_i) / (...) = 0: the invariant holds for i + 1. Nothing needs
to mark the drawn tokens: the closed form removes them.

Edge cases, as the specification defines them (`pyspec_ref.sampling.sibling_distributions`):
an empty residual (Z_{i+1} = 0: p_i <= q_i everywhere) keeps the whole state (C, Z, S); no
draft mass left (S_i <= 0, every token with q > 0 drawn) rejects the sibling, since r q(x) Z
>= 0 >= S max(...), and keeps the state (the update would divide by S). The kernel's S is a
float64 difference, so after every token with mass is drawn it may be a rounding residue
instead of 0; only a tree with more siblings than q has tokens with mass gets there, which no
draft that draws from q builds.

Exactness: p and q are float32 and every product and difference is taken in float64, where
r * q(x) of two float32 numbers is exact. So the first test at every node is exactly the
specification's r * q(x) < p(x). Later tests and the draw use sums over the vocabulary, which the
specification takes exactly (fsum, fractions) and these kernels by float64 tiles: they can differ
only where a comparison lies within float64 rounding of its threshold (about V * 2^-53 relative);
the checks detect and count such cases.

These helpers are notebook 16's own, in float64 with a float64 C: they do not reuse notebook
15's exercises (a student can do notebook 16 first).
"""

from __future__ import annotations

import triton
import triton.language as tl

from course.core import interpreter


@triton.jit
def residual_tile(p_row, q_row, c, first, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """max(0, p(v) - c q(v)) in float64 for the BLOCK_V tokens from `first` (0 past V).

    With c = 0 it is p itself; with c = C_k it is the unnormalised residual after k rejections.
    """
    cols = first + tl.arange(0, BLOCK_V)
    inside = cols < V
    p_v = tl.load(p_row + cols, mask=inside, other=0.0).to(tl.float64)
    q_v = tl.load(q_row + cols, mask=inside, other=0.0).to(tl.float64)
    return tl.maximum(p_v - c * q_v, 0.0)


@triton.jit
def residual_mass(p_row, q_row, c, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """(Z(c), Q): Z(c) = sum_v max(0, p(v) - c q(v)) over one vocabulary row, tile by tile, in
    float64 (the seed paper's partial sums b_k of a = max(0, f), summed by one program), and
    Q = sum_v q(v), the draft's total mass, from the same loads (`residual_tile`'s arithmetic,
    with q's tile kept: the walk's passes are bound by the bytes they read)."""
    acc = tl.zeros([BLOCK_V], dtype=tl.float64)
    mass = tl.zeros([BLOCK_V], dtype=tl.float64)
    for first in range(0, V, BLOCK_V):
        cols = first + tl.arange(0, BLOCK_V)
        p_v = tl.load(p_row + cols, mask=cols < V, other=0.0).to(tl.float64)
        q_v = tl.load(q_row + cols, mask=cols < V, other=0.0).to(tl.float64)
        acc += tl.maximum(p_v - c * q_v, 0.0)
        mass += q_v
    return tl.sum(acc, axis=0), tl.sum(mass, axis=0)


@triton.jit
def inverse_cdf_by_tiles(p_row, q_row, c, tile_sums, u, V: tl.constexpr, BLOCK_V: tl.constexpr,
                         BLOCK_T: tl.constexpr):
    """The smallest token i with w_0 + ... + w_i > u * sum(w), w = max(0, p - c q), from the
    (BLOCK_T,) float64 vector of the tiles' sums (0 past the last tile): the crossing tile by
    a cumsum over the tiles, then the token by a cumsum inside that one tile.

    Rounding can leave no crossing where the exact sums have one (u * total rounded up to the
    total, or a tile's cumsum ending a hair below its tile sum): then the last token with mass
    is taken, which is where the exact search ends in those cases.
    """
    # The prefix sums never decrease (the weights are >= 0), so the tiles whose prefix stays at or
    # below the threshold come first, and there are as many of them as the crossing tile's index:
    # counting them finds it. The same inside the tile.
    tiles = tl.arange(0, BLOCK_T)
    inclusive = tl.cumsum(tile_sums, axis=0)
    threshold = u * tl.max(inclusive, axis=0)
    crossing = tl.sum((inclusive <= threshold).to(tl.int32), axis=0)
    if crossing == BLOCK_T:  # no crossing after rounding: the last tile that has mass
        crossing = tl.max(tl.where(tile_sums > 0.0, tiles, -1), axis=0)
    before = tl.max(tl.where(tiles < crossing, inclusive, 0.0), axis=0)  # mass of earlier tiles
    w = residual_tile(p_row, q_row, c, crossing * BLOCK_V, V, BLOCK_V)
    token = tl.sum((before + tl.cumsum(w, axis=0) <= threshold).to(tl.int32), axis=0)
    if token == BLOCK_V:
        token = tl.max(tl.where(w > 0.0, tl.arange(0, BLOCK_V), -1), axis=0)
    return crossing * BLOCK_V + token


@triton.jit
def residual_tile_sums_kernel(q, p, final_node, final_c, tile_sums, N, T, V: tl.constexpr,
                              BLOCK_V: tl.constexpr):
    """Grid (B, T): tile_sums[b, t] = the mass of tile t of max(0, p - C q) at the final node."""
    b = tl.program_id(0)
    t = tl.program_id(1)
    row = (b * N + tl.load(final_node + b)).to(tl.int64) * V
    w = residual_tile(p + row, q + row, tl.load(final_c + b), t * BLOCK_V, V, BLOCK_V)
    tl.store(tile_sums + b * T + t, tl.sum(w, axis=0))


@triton.jit
def inverse_cdf_kernel(q, p, final_node, final_c, tile_sums, sample_uniforms, next_token, N, T,
                       V: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr):
    """One program per tree: the next token, drawn at the final node with its uniform."""
    b = tl.program_id(0)
    node = tl.load(final_node + b)
    row = (b * N + node).to(tl.int64) * V
    u = tl.load(sample_uniforms + b * N + node).to(tl.float64)
    tiles = tl.arange(0, BLOCK_T)
    sums = tl.load(tile_sums + b * T + tiles, mask=tiles < T, other=0.0)
    token = inverse_cdf_by_tiles(p + row, q + row, tl.load(final_c + b), sums, u, V, BLOCK_V, BLOCK_T)
    tl.store(next_token + b, token)


@triton.jit
def row_argmax(target, row, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """The first index of the maximum of row `row` of a contiguous (rows, V) tensor."""
    base = row.to(tl.int64) * V
    best_value = tl.full([], float("-inf"), tl.float32)
    best_index = row * 0
    for first in range(0, V, BLOCK_V):
        cols = first + tl.arange(0, BLOCK_V)
        values = tl.load(target + base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        tile_max = tl.max(values, axis=0)
        tile_index = first + tl.argmax(values, axis=0, tie_break_left=True)
        better = tile_max > best_value  # strict: an equal maximum in a later tile comes later
        best_index = tl.where(better, tile_index, best_index)
        best_value = tl.where(better, tile_max, best_value)
    return best_index


@triton.jit
def argmax_kernel(target, best, V: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program per (tree, node) row: best[row] = the first index of the row's maximum."""
    row = tl.program_id(0)
    tl.store(best + row, row_argmax(target, row, V, BLOCK_V))


interpreter.prepare(residual_tile, residual_mass, inverse_cdf_by_tiles, residual_tile_sums_kernel,
                    inverse_cdf_kernel, row_argmax, argmax_kernel)
