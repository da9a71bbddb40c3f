"""Notebook 16's launch settings and the launchers a student does not write.

Sampled verification runs three kernels: your `tree_walk_kernel` (one program per tree), then the
given `residual_tile_sums_kernel` (grid (B, T)) and `inverse_cdf_kernel` (one program per tree),
which draw the next token at the node where the walk stopped (course/topics/verification/
kernels.py). Greedy verification runs the given `argmax_kernel` (one program per node; not when
the walk takes each argmax itself, `LAZY`) and your `greedy_walk_kernel`.

`prepare_sampling(kernels, ...)` and `prepare_greedy(kernels, ...)` check the inputs once and return
a function that only launches, into outputs allocated once (for timing, and for the capstone's CUDA
graphs); `kernels` is whatever holds the two walks: the module `course.core.impl.load(
"tree_verification")` gives (your lessons/ copy or solutions/), or `VerificationKernels(...)` of
them, as the plain launchers in lessons/tree_verification.py pass their own. Trees come as parent
arrays (B, N) int32, numbered parent-before-child, or as DFS times (start, end) (notebook 01),
from which `parents_from_times_kernel` (times.py) rebuilds the parents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from course.core import runtime
from course.core.launch import poisoned_empty
from course.core.stubs import require_written
from course.topics.verification import validate as check
from course.topics.verification.kernels import argmax_kernel, inverse_cdf_kernel, residual_tile_sums_kernel
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


@dataclass(frozen=True)
class VerificationKernels:
    """The two walks of one implementation that a launch runs (a module holding them does too)."""

    tree_walk_kernel: object
    greedy_walk_kernel: object


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


def tree_parents(tree, name: str = "tree") -> torch.Tensor:
    """The (B, N) int32 parents of `tree`: a parents tensor, or a (start, end) pair of DFS times."""
    if isinstance(tree, (tuple, list)):
        if len(tree) != 2 or not all(isinstance(t, torch.Tensor) for t in tree):
            kinds = "tensors" if all(isinstance(t, torch.Tensor) for t in tree) else "non-tensors"
            raise TypeError(f"{name} must be a (B, N) parents tensor or a (start, end) pair of DFS-time "
                            f"tensors, got a {type(tree).__name__} of {len(tree)} {kinds}")
        return parents_from_times(*tree)
    check.parents_tensor(tree, name, MAX_NODES)
    return tree


def prepare_sampling(kernels, tree, tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                     accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor, *,
                     replacement: bool = False) -> Callable:
    """Check the inputs once and return a function that runs the three kernels into preallocated
    outputs and returns (path, next_token): what `tree_speculative_sampling` does, minus the
    checks (for timing the kernels alone)."""
    require_written(kernels.tree_walk_kernel)
    parents = tree_parents(tree)
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
        kernels.tree_walk_kernel[(batch,)](parents, tokens, q, p, accept_uniforms, path, final_node,
                                           final_c, final_z, n, V=vocabulary, BLOCK_N=_block_nodes(n),
                                           BLOCK_V=WALK_BLOCK_V, REPLACEMENT=replacement,
                                           num_warps=WALK_WARPS)
        residual_tile_sums_kernel[(batch, tiles)](q, p, final_node, final_c, tile_sums, n, tiles,
                                                  V=vocabulary, BLOCK_V=DRAW_BLOCK_V)
        inverse_cdf_kernel[(batch,)](q, p, final_node, final_c, tile_sums, sample_uniforms, next_token,
                                     n, tiles, V=vocabulary, BLOCK_V=DRAW_BLOCK_V,
                                     BLOCK_T=max(16, triton.next_power_of_2(tiles)))
        return path, next_token

    return run


def target_argmax(target: torch.Tensor) -> torch.Tensor:
    """(B, N) int32: the first index of the maximum of each row of a (B, N, V) float tensor
    (logits or probabilities; the same argmax either way)."""
    check.score_tensor(target)
    batch, n, vocabulary = target.shape
    best = poisoned_empty((batch, n), dtype=torch.int32, device=target.device)
    argmax_kernel[(batch * n,)](target, best, V=vocabulary, BLOCK_V=ARGMAX_BLOCK_V, num_warps=ARGMAX_WARPS)
    return best


def prepare_greedy(kernels, tree, tokens: torch.Tensor, target: torch.Tensor,
                   lazy: bool | None = None) -> Callable:
    """Check the inputs once and return a function that runs the kernels of
    `greedy_tree_verification` into preallocated outputs (for timing)."""
    require_written(kernels.greedy_walk_kernel)
    parents = tree_parents(tree)
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
        kernels.greedy_walk_kernel[(batch,)](parents, tokens, best, target, path, next_token, **walk)
        return path, next_token

    return run


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
