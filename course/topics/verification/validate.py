"""Argument checks of notebook 16's tree verification launchers; every message names the argument.

`solutions/tree_verification.py` calls these before it launches a kernel: trees numbered
parent-before-child (or real DFS times), token ids in the vocabulary, probabilities that sum to 1
and uniforms in [0, 1), all on one device.
"""

from __future__ import annotations

import torch

from course.core.validate import (
    require_interpretable_dtype,
    require_same_shape,
    require_tensor,
    require_topological_trees,
    require_tree_times,
)
from pyspec_ref.sampling import NORMALISATION_TOLERANCE
from pyspec_ref.trees import validate_times

INDEX_DTYPES = (torch.int32,)
PROBABILITY_DTYPES = (torch.float32,)  # float32 inputs, float64 arithmetic: see the kernels' module
UNIFORM_DTYPES = (torch.float32, torch.float64)
TARGET_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # greedy: logits or probabilities


# --------------------------------------------------------------------------- trees


def tree_times(start, end, max_nodes: int) -> tuple[int, int]:
    """Check (B, N) int32 DFS times of trees of at most max_nodes nodes, each a real preorder
    (`pyspec_ref.validate_times`); return (B, N)."""
    batch, n = require_tree_times(start, end)
    if n > max_nodes:
        raise ValueError(f"start must have at most {max_nodes} nodes per tree, got {n}")
    for b, (s, e) in enumerate(zip(start.tolist(), end.tolist(), strict=True)):
        try:
            validate_times(s, e, f"start[{b}]/end[{b}]")
        except ValueError as error:
            raise ValueError(f"start/end are not the DFS times of a tree: {error}") from None
    return batch, n


def built_parents(parents) -> None:
    """The parents rebuilt from DFS times are numbered parent-before-child, as the walk needs."""
    try:
        require_topological_trees(parents, "parents")
    except ValueError as error:
        raise ValueError("start/end describe a tree that is not numbered parent-before-child "
                         f"(node 0 the root), which the walk needs: {error}") from None


def parents_tensor(tree, name: str, max_nodes: int) -> None:
    """A (B, N) int32 parents tensor of trees of at most max_nodes nodes, numbered
    parent-before-child (node 0 the root)."""
    require_tensor(tree, f"{name} (parents)", ndim=2, dtypes=INDEX_DTYPES)
    if tree.shape[1] > max_nodes:
        raise ValueError(f"{name} must have at most {max_nodes} nodes per tree, got {tree.shape[1]}")
    require_topological_trees(tree, "parents")


# --------------------------------------------------------------------------- sampled verification


def _require_tokens(tokens: torch.Tensor, name: str, shape: tuple[int, int], vocabulary: int | None):
    require_tensor(tokens, name, ndim=2, dtypes=INDEX_DTYPES)
    if tuple(tokens.shape) != shape:
        raise ValueError(f"{name} must have shape (B, N) = {shape} to match the tree, "
                         f"got {tuple(tokens.shape)}")
    if vocabulary is not None:
        bad = torch.nonzero((tokens < 0) | (tokens >= vocabulary))
        if len(bad):
            b, i = (int(x) for x in bad[0])
            raise ValueError(f"{name}[{b}, {i}] = {int(tokens[b, i])} is not a token id in "
                             f"[0, {vocabulary})")


def _require_distributions(x: torch.Tensor, name: str) -> None:
    """Finite (require_tensor), non-negative, each row summing to 1 within the specification's
    tolerance: probabilities, not logits."""
    negative = torch.nonzero(x < 0)
    if len(negative):
        b, i, v = (int(t) for t in negative[0])
        raise ValueError(f"{name}[{b}, {i}, {v}] = {float(x[b, i, v])} is negative: probabilities "
                         "must be >= 0")
    sums = x.sum(dim=-1, dtype=torch.float64)  # no float64 copy of the (B, N, V) tensor
    off = torch.nonzero((sums - 1.0).abs() > NORMALISATION_TOLERANCE)
    if len(off):
        b, i = (int(t) for t in off[0])
        raise ValueError(f"{name}[{b}, {i}] sums to {float(sums[b, i]):.6g}, not 1 (within "
                         f"{NORMALISATION_TOLERANCE}): pass probabilities, not logits or weights")


def _require_uniforms(u: torch.Tensor, name: str, shape: tuple[int, int], first: int) -> None:
    require_tensor(u, name, ndim=2, dtypes=UNIFORM_DTYPES)
    if tuple(u.shape) != shape:
        raise ValueError(f"{name} must have shape (B, N) = {shape}, got {tuple(u.shape)}")
    used = u[:, first:]
    bad = torch.nonzero((used < 0) | (used >= 1))
    if len(bad):
        b, i = int(bad[0, 0]), int(bad[0, 1]) + first
        raise ValueError(f"{name}[{b}, {i}] = {float(u[b, i])} must lie in [0, 1)")


def _require_distinct_siblings(parents: torch.Tensor, tokens: torch.Tensor, vocabulary: int) -> None:
    """Children drawn without replacement carry distinct tokens: no two nodes with one parent
    hold the same token (sorting the (parent, token) keys of each tree puts such pairs side by side)."""
    if parents.shape[1] < 3:
        return
    keys = parents[:, 1:].long() * vocabulary + tokens[:, 1:].long()
    ordered, order = keys.sort(dim=1)
    same = torch.nonzero(ordered[:, 1:] == ordered[:, :-1])
    if len(same):
        b, j = (int(t) for t in same[0])
        first, second = sorted((int(order[b, j]) + 1, int(order[b, j + 1]) + 1))
        raise ValueError(f"tokens[{b}, {first}] = tokens[{b}, {second}] = {int(tokens[b, first])}: siblings "
                         f"(children of node {int(parents[b, first])}) drawn without replacement cannot "
                         "repeat a token (pass replacement=True for independent draws)")


def sampling_inputs(parents, tokens, q, p, accept_uniforms, sample_uniforms,
                    replacement: bool = False) -> tuple[int, int, int]:
    """Check `prepare_sampling`'s arguments against the tree's checked (B, N) parents; return
    (B, N, V)."""
    if not isinstance(replacement, bool):
        raise TypeError(f"replacement must be True or False, got {replacement!r}")
    batch, n = parents.shape
    require_tensor(p, "p", ndim=3, dtypes=PROBABILITY_DTYPES)
    require_tensor(q, "q", ndim=3, dtypes=PROBABILITY_DTYPES)
    if tuple(p.shape[:2]) != (batch, n):
        raise ValueError(f"p must have shape (B, N, V) with (B, N) = {(batch, n)} from the tree, "
                         f"got {tuple(p.shape)}")
    require_same_shape("p", p, "q", q)
    vocabulary = p.shape[2]
    _require_tokens(tokens, "tokens", (batch, n), vocabulary)
    _require_distributions(p, "p")
    _require_distributions(q, "q")
    _require_uniforms(accept_uniforms, "accept_uniforms", (batch, n), first=1)  # entry 0 unused
    _require_uniforms(sample_uniforms, "sample_uniforms", (batch, n), first=0)
    for name, tensor in (("tokens", tokens), ("q", q), ("accept_uniforms", accept_uniforms),
                         ("sample_uniforms", sample_uniforms), ("tree", parents)):
        if tensor.device != p.device:
            raise ValueError(f"{name} must be on p's device {p.device}, got {tensor.device}")
    if not replacement:
        _require_distinct_siblings(parents, tokens, vocabulary)
    return batch, n, vocabulary


# --------------------------------------------------------------------------- greedy verification


def score_tensor(target) -> None:
    """A (B, N, V) tensor of target scores (logits or probabilities) the interpreter can run."""
    require_tensor(target, "target", ndim=3, dtypes=TARGET_DTYPES)
    require_interpretable_dtype(target, "target")


def greedy_inputs(parents, tokens, target, lazy) -> tuple[bool, int | None]:
    """Check `prepare_greedy`'s arguments against the tree's checked (B, N) parents; return
    (scores: target holds (B, N, V) scores rather than argmax ids, V or None)."""
    batch, n = parents.shape
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    scores = target.dim() == 3
    if scores:
        score_tensor(target)
        if tuple(target.shape[:2]) != (batch, n):
            raise ValueError(f"target must have shape (B, N, V) with (B, N) = {(batch, n)} from the "
                             f"tree, got {tuple(target.shape)}")
        vocabulary = target.shape[2]
    else:
        _require_tokens(target, "target (argmax ids)", (batch, n), None)
        if bool((target < 0).any()):
            raise ValueError("target (argmax ids) must hold token ids >= 0")
        vocabulary = None
    _require_tokens(tokens, "tokens", (batch, n), vocabulary)
    for name, tensor in (("tokens", tokens), ("tree", parents)):
        if tensor.device != target.device:
            raise ValueError(f"{name} must be on target's device {target.device}, got {tensor.device}")
    if lazy is not None and not isinstance(lazy, bool):
        raise ValueError(f"lazy must be True, False or None (choose by tree size), got {lazy!r}")
    return scores, vocabulary
