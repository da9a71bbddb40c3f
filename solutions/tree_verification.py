"""Notebook 16: token-tree verification in Triton, sampled (Sequoia, SpecInfer) and greedy.

A token tree (notebook 01) holds N speculated tokens: node 0 is the last verified token, every other
node a draft token that continues its parent; p[i] and q[i] are the target's and the draft's
distributions of the token after node i. Verification walks the tree from the root and returns the
accepted path and one more token, so that the emitted tokens follow the target distribution.

Sampled (`pyspec_ref.sampling.tree_speculative_sampling`): at node u the children are tried in
increasing id; child i, token x, is accepted when r q_i(x) < p_i(x) and the walk moves to it; on a
rejection p_{i+1} = max_norm(p_i - q_i) and the next child is tried. In closed form, p_i =
max(0, p - C q) / Z and q_i = q / S (S = 1 with replacement: SpecInfer §4.3; without, the draft mass
not yet drawn: Sequoia §3.2), so the test is r q(x) Z < S max(0, p(x) - C q(x)) and a rejection
updates C <- C + Z / S, Z <- sum max(0, p - C q), S <- S - q(x) (the derivation and the edge cases:
course/topics/verification/kernels.py). Greedy (SpecInfer §4.3): the longest root path whose every
token is the target's argmax at its parent. Launch settings, the draw after the walk and the
launchers for timing: `course.topics.verification.launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from course.core import interpreter
from course.core.stubs import todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.verification.kernels import residual_mass, row_argmax
from course.topics.verification.launch import VerificationKernels, prepare_greedy, prepare_sampling


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


interpreter.prepare(tree_walk_kernel, greedy_walk_kernel)


def _own_kernels() -> VerificationKernels:
    return VerificationKernels(tree_walk_kernel, greedy_walk_kernel)


def tree_speculative_sampling(tree, tokens, q, p, accept_uniforms, sample_uniforms, *, replacement=False):
    """Multi-step speculative sampling over B token trees of N nodes: Sequoia's rule for children
    drawn without replacement (replacement=False, the default: siblings must carry distinct
    tokens), SpecInfer's for children drawn independently (replacement=True).

    tree: (B, N) int32 parents (node 0 the root, parents before children) or a (start, end) pair
    of (B, N) int32 DFS times; tokens: (B, N) int32 token of each node (the root's is the last
    verified token); q, p: (B, N, V) float32 draft and target distributions at each node;
    accept_uniforms: (B, N) float32 or float64, entry [b, i] tests node i against its parent
    (entry 0 unused); sample_uniforms: (B, N), entry [b, i] draws the next token if the walk
    stops at node i. Returns (path, next_token): path (B, N) int32, the accepted node ids from
    the root (path[b, 0] = 0) padded with -1; next_token (B,) int32.
    """
    return prepare_sampling(_own_kernels(), tree, tokens, q, p, accept_uniforms, sample_uniforms,
                            replacement=replacement)()


def greedy_tree_verification(tree, tokens, target, lazy=None):
    """Greedy verification of B token trees: (path, next_token) as in `tree_speculative_sampling`.

    target: the target's (B, N, V) logits or probabilities (float32, float16; bfloat16 on a GPU),
    whose argmax per node the kernel takes (the first maximum on ties), or the (B, N) int32
    argmax ids themselves. lazy: take the argmax inside the walk, of the path's nodes only (None:
    when N >= LAZY_MIN_NODES). Equals `pyspec_ref.sampling.greedy_tree_verification` on each tree.
    """
    return prepare_greedy(_own_kernels(), tree, tokens, target, lazy)()
