"""Notebook 16: token-tree verification in Triton, sampled (Sequoia, SpecInfer) and greedy.

A token tree (notebook 01) holds N speculated tokens: node 0 is the last verified token, and
every other node is a draft token that continues its parent. The target model scores all N
nodes in one pass, giving p[i], its distribution of the token after node i; the draft gave
q[i]. Verification walks the tree from the root and returns the accepted path and one more
token, so that the emitted tokens follow the target distribution exactly.

Sampled verification (`pyspec_ref.sampling.tree_speculative_sampling` is the specification):
at node u the children are tried in increasing id, the order they were drawn in; child i,
token x_i, is accepted when r_i * q_i(x_i) < p_i(x_i), and the walk moves to it; on a
rejection p_{i+1} = max_norm(p_i - q_i) and the next child is tried; when every child is
rejected (or u is a leaf) the next token is drawn from the current p by the inverse CDF with
the uniform of node u. Two ways the children may have been drawn:
* without replacement (the default; Sequoia, Chen et al., 2024, §3.2): siblings carry
  distinct tokens and q_i is q_u with the siblings 1 .. i-1 removed and renormalised,
  q_i(v) = q_u(v) / S_i with S_i the draft mass not yet drawn;
* with replacement (`replacement=True`; SpecInfer, Miao et al., 2024, §4.3, Algorithm 2):
  every child an independent draw from q_u, q_i = q_u, S_i = 1.

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

Kernels (Triton):
1. `tree_walk_kernel`, one program per tree: the walk, a sequential loop of scalar tests,
   with a vocabulary pass after each rejection; the state is (C, Z, S), and REPLACEMENT (a
   constexpr) keeps S at 1. It writes the path and the final state (node, C, Z): the draw
   needs no S, since its distribution max(0, p - C q) / Z is p_{k+1} either way.
2. `residual_tile_sums_kernel`, grid (B, T): the mass of each vocabulary tile of the final
   node's residual max(0, p - C q) (T = cdiv(V, DRAW_BLOCK_V) programs per tree, in parallel).
3. `inverse_cdf_kernel`, one program per tree: finds the tile where the cumulative mass
   crosses u * total from the tile sums, then the token inside that tile by a cumsum
   (`inverse_cdf_by_tiles`).

Greedy verification (SpecInfer §4.3, greedy decoding): the longest root path whose every
token is the target's argmax at its parent. `argmax_kernel` (one program per node, first
maximum on ties, as torch.argmax) and `greedy_walk_kernel` (one program per tree). The walk
needs the argmax only at the nodes of the path it takes, so for trees of many nodes (N >=
LAZY_MIN_NODES) it takes each argmax itself (`lazy`): (accepted + 1) rows of scores read instead
of N, one after another instead of in parallel.

Exactness: p and q are float32 and every product and difference is taken in float64, where
r * q(x) of two float32 numbers is exact. So the first test at every node is exactly the
specification's r * q(x) < p(x). Later tests and the draw use sums over the vocabulary,
which the specification takes exactly (fsum, fractions) and the kernels by float64 tiles:
they can differ only where a comparison lies within float64 rounding of its threshold
(about V * 2^-53 relative); the checks detect and count such cases.

Trees come as parent arrays (B, N) int32, numbered parent-before-child, or as DFS times
(start, end) (notebook 01), from which `parents_from_times_kernel` rebuilds the parents.

Relation to notebook 15: its kernels draw from the residual of a chain in float32, by tiles too.
This module keeps its own float64 helpers (`residual_tile`, `residual_mass`,
`inverse_cdf_by_tiles`): the closed-form residual max(0, p - C q) with a float64 C, and no
dependency on notebook 15's exercises (a student can do notebook 16 first).

Input checks live in `course.topics.verification.validate`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from course.core import interpreter, runtime
from course.core.launch import poisoned_empty
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.verification import validate as check
from course.topics.verification.times import parents_from_times_kernel

MAX_NODES = 1024  # the walk keeps a tree's parent array in one block of registers
# One program walks a tree, so a residual pass is as fast as one SM can pull two rows in: the
# loop is not software-pipelined, so each iteration waits for its loads, and a large tile keeps
# many bytes in flight (8192 floats x 2 rows = 64 KB per iteration; 97 registers at 16 warps, no
# spills, on sm_90). The tile sums of the draw run on all SMs at once: a smaller tile, more programs.
WALK_BLOCK_V = runtime.pick(sim=16, gpu=8192)  # vocabulary tile of the walk's residual passes
WALK_WARPS = runtime.pick(sim=1, gpu=16)
DRAW_BLOCK_V = runtime.pick(sim=16, gpu=1024)  # vocabulary tile of the parallel draw
ARGMAX_BLOCK_V = runtime.pick(sim=16, gpu=8192)  # one program per node row: a large tile, as the walk
ARGMAX_WARPS = runtime.pick(sim=1, gpu=8)
# Greedy verification needs the argmax of the nodes on the accepted path only. Taking it inside
# the walk reads (accepted + 1) rows of V scores instead of all N, but one row after another
# in one program; worth it once a tree has many more nodes than a path has (64 nodes, paths of
# a few: at B = 64, V = 128256 the all-nodes argmax reads 2.1 GB).
LAZY_MIN_NODES = 16
TIMES_BLOCK_ROWS = 16  # nodes per program when rebuilding parents from DFS times


# --------------------------------------------------------------------------- building blocks


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


# --------------------------------------------------------------------------- sampled verification


@triton.jit
def tree_walk_kernel(parents, tokens, q, p, accept_uniforms, path, final_node, final_c, final_z, N,
                     V: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                     REPLACEMENT: tl.constexpr):
    """One program per tree: the walk (Sequoia's rule; SpecInfer's with REPLACEMENT).
    path[b, :depth + 1] gets the accepted node ids (path[b, 0] = 0, then -1); final_node/c/z[b]
    the node where the walk stopped and its state (C, Z): the next token is drawn from
    max(0, p - C q) there."""
    b = tl.program_id(0)
    ids = tl.arange(0, BLOCK_N)
    par = tl.load(parents + b * N + ids, mask=ids < N, other=-2)  # -2: padding is nobody's child
    tl.store(path + b * N, 0)
    node = b * 0  # int32 scalars (a literal 0 would be a constant, not a loop variable)
    last = b * 0  # the last child of `node` tried; its next child has a larger id
    depth = b * 0
    c = tl.zeros([], dtype=tl.float64)  # C_i
    z = tl.zeros([], dtype=tl.float64) + 1.0  # Z_i
    s = tl.zeros([], dtype=tl.float64) + 1.0  # S_i, the draft mass not yet drawn (1 with replacement)
    searching = b >= 0
    while searching:
        child = tl.min(tl.where((par == node) & (ids > last), ids, BLOCK_N), axis=0)
        searching = child < BLOCK_N
        if searching:
            x = tl.load(tokens + b * N + child)
            r = tl.load(accept_uniforms + b * N + child).to(tl.float64)
            row = (b * N + node).to(tl.int64) * V
            p_x = tl.load(p + row + x).to(tl.float64)
            q_x = tl.load(q + row + x).to(tl.float64)
            ### BEGIN SOLUTION
            # r < min(1, p_i(x) / q_i(x)) for p_i = max(0, p - C q) / Z and q_i = q / S, without a
            # division: with C = 0, Z = S = 1 (the first child) this is exactly r * q(x) < p(x).
            # Strict: r = 0 must not accept a token that p_i forbids (p_i(x) = 0).
            accept = r * q_x * z < s * tl.maximum(p_x - c * q_x, 0.0)
            if accept:
                depth += 1
                tl.store(path + b * N + depth, child)
                node = child
                c = tl.zeros_like(c)
                z = tl.zeros_like(z) + 1.0
                s = tl.zeros_like(s) + 1.0
            elif s > 0.0:  # S <= 0: no draft mass left, the sibling was rejected, nothing changes
                # p_{i+1} = max_norm(p_i - q_i): C <- C + Z / S, Z <- sum max(0, p - C q). An empty
                # residual (p_i <= q_i everywhere) keeps the state.
                c_next = c + z / s
                z_next, q_mass = residual_mass(p + row, q + row, c_next, V, BLOCK_V)
                keep = z_next > 0.0
                if not REPLACEMENT:
                    # x is drawn: S <- S - q(x). At the first rejection (C = 0) S = 1 stood for q's
                    # total; the mass left is taken from the total Q itself, not from 1, since a
                    # float32 q sums to 1 only within ~1e-7, which 1 / S would magnify.
                    s = tl.where(keep, tl.where(c == 0.0, q_mass, s) - q_x, s)
                c = tl.where(keep, c_next, c)
                z = tl.where(keep, z_next, z)
            ### END SOLUTION
            last = child  # the next child tried (if any) has a larger id
    tl.store(path + b * N + ids, -1, mask=(ids > depth) & (ids < N))  # pad after the last node
    tl.store(final_node + b, node)
    tl.store(final_c + b, c)
    tl.store(final_z + b, z)


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


# --------------------------------------------------------------------------- greedy verification


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


@triton.jit
def greedy_walk_kernel(parents, tokens, best, target, path, next_token, N, V: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, LAZY: tl.constexpr):
    """One program per tree: from the root, follow the first child (in id order) whose token
    is the target's argmax at the current node; stop where none is. The argmax of a node is
    read from `best` (computed for every node beforehand), or, LAZY, taken here from the
    node's row of `target`: only the rows on the path are read."""
    b = tl.program_id(0)
    ids = tl.arange(0, BLOCK_N)
    par = tl.load(parents + b * N + ids, mask=ids < N, other=-2)
    tok = tl.load(tokens + b * N + ids, mask=ids < N, other=-1)
    tl.store(path + b * N, 0)
    node = b * 0
    depth = b * 0
    wanted = b * 0
    going = b >= 0
    while going:
        if LAZY:
            wanted = row_argmax(target, b * N + node, V, BLOCK_V)
        else:
            wanted = tl.load(best + b * N + node)
        ### BEGIN SOLUTION
        match = tl.min(tl.where((par == node) & (tok == wanted), ids, BLOCK_N), axis=0)
        going = match < BLOCK_N
        depth += going.to(tl.int32)
        tl.store(path + b * N + depth, match, mask=going)
        node = tl.where(going, match, node)
        ### END SOLUTION
    tl.store(path + b * N + ids, -1, mask=(ids > depth) & (ids < N))  # pad after the last node
    tl.store(next_token + b, wanted)  # the argmax at the last node: the walk stopped there


# --------------------------------------------------------------------------- trees as DFS times
# `parents_from_times_kernel` is given, in course/topics/verification/times.py: the test it makes
# is notebook 12's mask, an exercise of its own.


interpreter.prepare(residual_tile, residual_mass, inverse_cdf_by_tiles, tree_walk_kernel,
                    residual_tile_sums_kernel, inverse_cdf_kernel, row_argmax, argmax_kernel,
                    greedy_walk_kernel, parents_from_times_kernel)


# --------------------------------------------------------------------------- launchers


def _block_nodes(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def parents_from_times(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """(B, N) int32 parent arrays of the trees whose DFS times are (start, end), (B, N) int32.

    The times must be a real preorder of each tree (`pyspec_ref.validate_times`); the trees must
    be numbered parent-before-child (node 0 the root), as every tree of the course is.
    """
    batch, n = check.tree_times(start, end, MAX_NODES)
    parents = poisoned_empty(start.shape, dtype=start.dtype, device=start.device)
    grid = (batch, triton.cdiv(n, TIMES_BLOCK_ROWS))
    parents_from_times_kernel[grid](start, end, parents, n, BLOCK_ROWS=TIMES_BLOCK_ROWS,
                                    BLOCK_N=_block_nodes(n))
    check.built_parents(parents)
    return parents


def _tree(tree, name: str = "tree") -> torch.Tensor:
    """The (B, N) int32 parents of `tree`: a parents tensor, or a (start, end) pair of DFS times."""
    if isinstance(tree, (tuple, list)):
        if len(tree) != 2 or not all(isinstance(t, torch.Tensor) for t in tree):
            kinds = "tensors" if all(isinstance(t, torch.Tensor) for t in tree) else "non-tensors"
            raise TypeError(f"{name} must be a (B, N) parents tensor or a (start, end) pair of DFS-time "
                            f"tensors, got a {type(tree).__name__} of {len(tree)} {kinds}")
        return parents_from_times(*tree)
    check.parents_tensor(tree, name, MAX_NODES)
    return tree


def prepare_sampling(tree, tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                     accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor, *,
                     replacement: bool = False) -> Callable:
    """Check the inputs once and return a function that runs the three kernels into preallocated
    outputs and returns (path, next_token): what `tree_speculative_sampling` does, minus the
    checks (for timing the kernels alone)."""
    require_written(tree_walk_kernel)
    parents = _tree(tree)
    batch, n, vocabulary = check.sampling_inputs(parents, tokens, q, p, accept_uniforms, sample_uniforms,
                                                 replacement)
    device = p.device
    path = poisoned_empty((batch, n), dtype=torch.int32, device=device)
    final_node = poisoned_empty(batch, dtype=torch.int32, device=device)
    final_c = poisoned_empty(batch, dtype=torch.float64, device=device)
    final_z = poisoned_empty(batch, dtype=torch.float64, device=device)
    tiles = triton.cdiv(vocabulary, DRAW_BLOCK_V)
    tile_sums = poisoned_empty((batch, tiles), dtype=torch.float64, device=device)
    next_token = poisoned_empty(batch, dtype=torch.int32, device=device)

    def run():
        tree_walk_kernel[(batch,)](parents, tokens, q, p, accept_uniforms, path, final_node, final_c,
                                   final_z, n, V=vocabulary, BLOCK_N=_block_nodes(n),
                                   BLOCK_V=WALK_BLOCK_V, REPLACEMENT=replacement, num_warps=WALK_WARPS)
        residual_tile_sums_kernel[(batch, tiles)](q, p, final_node, final_c, tile_sums, n, tiles,
                                                  V=vocabulary, BLOCK_V=DRAW_BLOCK_V)
        inverse_cdf_kernel[(batch,)](q, p, final_node, final_c, tile_sums, sample_uniforms, next_token,
                                     n, tiles, V=vocabulary, BLOCK_V=DRAW_BLOCK_V,
                                     BLOCK_T=max(16, triton.next_power_of_2(tiles)))
        return path, next_token

    return run


def tree_speculative_sampling(tree, tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                              accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor, *,
                              replacement: bool = False):
    """Multi-step speculative sampling over B token trees of N nodes: Sequoia's rule for children
    drawn without replacement (replacement=False, the default: siblings must carry distinct
    tokens), SpecInfer's for children drawn independently (replacement=True).

    tree: (B, N) int32 parents (node 0 the root, parents before children) or a (start, end) pair
    of (B, N) int32 DFS times; tokens: (B, N) int32 token of each node (the root's is the last
    verified token); q, p: (B, N, V) float32 draft and target distributions at each node;
    accept_uniforms: (B, N) float32 or float64, entry [b, i] tests node i against its parent
    (entry 0 unused); sample_uniforms: (B, N), entry [b, i] draws the next token if the walk
    stops at node i. Returns (path, next_token): path (B, N) int32, the accepted node ids from
    the root (path[b, 0] = 0) padded with -1; next_token (B,) int32. Equals
    `pyspec_ref.sampling.tree_speculative_sampling` on each tree, with the same `replacement`
    (see the module docstring).
    """
    return prepare_sampling(tree, tokens, q, p, accept_uniforms, sample_uniforms, replacement=replacement)()


def target_argmax(target: torch.Tensor) -> torch.Tensor:
    """(B, N) int32: the first index of the maximum of each row of a (B, N, V) float tensor
    (logits or probabilities; the same argmax either way)."""
    check.score_tensor(target)
    batch, n, vocabulary = target.shape
    best = poisoned_empty((batch, n), dtype=torch.int32, device=target.device)
    argmax_kernel[(batch * n,)](target, best, V=vocabulary, BLOCK_V=ARGMAX_BLOCK_V, num_warps=ARGMAX_WARPS)
    return best


def prepare_greedy(tree, tokens: torch.Tensor, target: torch.Tensor, lazy: bool | None = None) -> Callable:
    """Check the inputs once and return a function that runs the kernels of
    `greedy_tree_verification` into preallocated outputs (for timing)."""
    require_written(greedy_walk_kernel)
    parents = _tree(tree)
    batch, n = parents.shape
    scores, vocabulary = check.greedy_inputs(parents, tokens, target, lazy)
    lazy = scores and (n >= LAZY_MIN_NODES if lazy is None else lazy)
    best = poisoned_empty((batch, n), dtype=torch.int32, device=target.device) if scores else target
    path = poisoned_empty((batch, n), dtype=torch.int32, device=target.device)
    next_token = poisoned_empty(batch, dtype=torch.int32, device=target.device)
    walk = dict(N=n, V=vocabulary or 1, BLOCK_N=_block_nodes(n), BLOCK_V=ARGMAX_BLOCK_V, LAZY=lazy,
                num_warps=ARGMAX_WARPS if lazy else 4)

    def run():
        if scores and not lazy:
            argmax_kernel[(batch * n,)](target, best, V=vocabulary, BLOCK_V=ARGMAX_BLOCK_V,
                                        num_warps=ARGMAX_WARPS)
        greedy_walk_kernel[(batch,)](parents, tokens, best, target, path, next_token, **walk)
        return path, next_token

    return run


def greedy_tree_verification(tree, tokens: torch.Tensor, target: torch.Tensor, lazy: bool | None = None):
    """Greedy verification of B token trees: (path, next_token) as in `tree_speculative_sampling`.

    target: the target's (B, N, V) logits or probabilities (float32, float16; bfloat16 on a GPU),
    whose argmax per node the kernel takes (the first maximum on ties), or the (B, N) int32
    argmax ids themselves. lazy: take the argmax inside the walk, of the path's nodes only (None:
    when N >= LAZY_MIN_NODES). Equals `pyspec_ref.sampling.greedy_tree_verification` on each tree.
    """
    return prepare_greedy(tree, tokens, target, lazy)()


# --------------------------------------------------------------------------- outputs


def accepted_counts(path: torch.Tensor) -> torch.Tensor:
    """(B,) int32: the draft tokens accepted per tree (the path's length minus the root)."""
    return ((path >= 0).sum(dim=1) - 1).to(torch.int32)


def emitted_tokens(tokens: torch.Tensor, path: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    """(B, N) int32 as production samplers report them: the accepted draft tokens, then the next
    token, then -1 (the root's token, already emitted, is not repeated)."""
    batch, n = path.shape
    accepted = accepted_counts(path).long()
    nodes = torch.cat([path[:, 1:], torch.full((batch, 1), -1, dtype=path.dtype, device=path.device)], 1)
    out = torch.where(nodes >= 0, tokens.gather(1, nodes.clamp(min=0).long()), -1)
    out[torch.arange(batch, device=path.device), accepted] = next_token.to(out.dtype)
    return out.to(torch.int32)
