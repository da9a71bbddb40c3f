"""Inputs for checks, notebooks and benchmarks: token trees and random tensors.

Random inputs only, never zeros or aranges: a kernel that skips a load or mixes up
two indices can still pass on them. Trees come in every shape the checks need:
chains, stars, deep trees, random trees numbered in BFS or in DFS order.

Every tree here is numbered topologically (a parent before its children, the root
is node 0), as speculative decoding produces them: a token is appended after the
token it continues.

A check's seeded cases draw their inputs through two keyed hashes: grading turns the instructor's
private seed into one seed per exercise (`course.grading.runner.case_seed`, keyed by the private
seed over the exercise's id), and each case turns its exercise's seed into a seed of its own
(`case_seed` here, keyed by the exercise's seed over the case's name). A case's inputs, or its
seed, tell nothing of another case's inputs nor of the seeds above it.
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections import deque
from dataclasses import dataclass

import pyspec_ref

SEED_BITS = 56  # of a case's seed: well within what torch.Generator.manual_seed takes (64)


def case_seed(seed: int, name: str) -> int:
    """The seed one case draws its inputs from: HMAC-SHA256 keyed by `seed` over the case's `name`,
    its first 56 bits. Cases of other names get seeds unrelated to this one and to `seed`, so that
    what a student learns of one case's inputs gives away no other case's. Parts of one case's
    inputs come from this seed plus small offsets (it is as private as the case's inputs)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    digest = hmac.new(str(seed).encode(), name.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:SEED_BITS // 8], "big")


@dataclass(frozen=True)
class TreeCase:
    """A named token tree, e.g. TreeCase("star N=33", [-1, 0, 0, ...])."""

    name: str
    parents: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.parents)


def _require_size(n, name: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int, got {n!r}")
    return n


def chain(n: int) -> list[int]:
    """A single path: its tree mask is the ordinary causal mask."""
    return pyspec_ref.chain_parents(_require_size(n))


def star(n: int) -> list[int]:
    """A root with n - 1 children: every query sees only the root and itself."""
    _require_size(n)
    return [-1] + [0] * (n - 1)


def caterpillar(n: int) -> list[int]:
    """A deep tree: a spine of about n/2 nodes, each with one leaf hanging off it."""
    _require_size(n)
    parents, spine = [-1], 0
    while len(parents) < n:
        parents.append(spine)  # next spine node
        new_spine = len(parents) - 1
        if len(parents) < n:
            parents.append(spine)  # a leaf beside it
        spine = new_spine
    return parents


def random_tree(n: int, rng: random.Random, max_children: int = 10, order: str = "bfs") -> list[int]:
    """A random tree grown breadth first, each node getting 1..max_children children.

    order="bfs" numbers the nodes level by level, order="dfs" in preorder (then the
    DFS start time of node i is i).
    """
    _require_size(n)
    if not isinstance(max_children, int) or max_children < 1:
        raise ValueError(f"max_children must be a positive int, got {max_children!r}")
    if order not in ("bfs", "dfs"):
        raise ValueError(f"order must be 'bfs' or 'dfs', got {order!r}")
    parents, frontier = [-1], deque([0])
    while len(parents) < n:
        node = frontier.popleft() if frontier else rng.randrange(len(parents))
        for _ in range(rng.randint(1, max_children)):
            if len(parents) == n:
                break
            parents.append(node)
            frontier.append(len(parents) - 1)
    if order == "dfs":
        parents = pyspec_ref.relabel(parents, pyspec_ref.dfs_order(parents))
    return parents


def speculative_tree(n: int, prompt: int, rng: random.Random, max_children: int = 10,
                     order: str = "bfs") -> list[int]:
    """A benchmark tree as in FlashSpecInfer §6: a prompt chain, then a random token tree.

    The last prompt token is the root of a random tree with fan-out 1..max_children;
    n counts all nodes, prompt included.
    """
    _require_size(n)
    if not isinstance(prompt, int) or not 1 <= prompt <= n:
        raise ValueError(f"prompt must be an int in [1, n={n}], got {prompt!r}")
    tree = random_tree(n - prompt + 1, rng, max_children, order)
    offset = prompt - 1
    return chain(prompt) + [p + offset for p in tree[1:]]


def edge_case_trees(tile: int = 32) -> list[TreeCase]:
    """The fixed list every check runs: shapes and sizes where kernels go wrong."""
    if not isinstance(tile, int) or tile < 2:
        raise ValueError(f"tile must be an int >= 2, got {tile!r}")
    rng = random.Random(2024)
    big = 2 * tile + 3  # not a multiple of the tile, so the last tile is ragged
    cases = [
        ("single node N=1", [-1]),
        ("two nodes N=2", chain(2)),
        (f"chain N={2 * tile}", chain(2 * tile)),
        (f"star N={tile + 1}", star(tile + 1)),
        (f"deep caterpillar N={big}", caterpillar(big)),
        (f"random BFS order N={big}", random_tree(big, rng, order="bfs")),
        (f"random DFS order N={big}", random_tree(big, rng, order="dfs")),
        (f"binary-ish N={tile - 1}", random_tree(tile - 1, rng, max_children=2)),
        (f"prompt chain + tree N={big}", speculative_tree(big, tile // 2, rng)),
    ]
    return [TreeCase(name, tuple(parents)) for name, parents in cases]


def random_cases(count: int, n: int, seed: int) -> list[TreeCase]:
    """Fresh random trees of n nodes, in alternating BFS and DFS order, named by their order, size
    and index ("random DFS order N=35 #1"); each is drawn from `case_seed(seed, its name)`."""
    cases = []
    for i in range(count):
        order = "bfs" if i % 2 == 0 else "dfs"
        name = f"random {order.upper()} order N={n} #{i}"
        rng = random.Random(case_seed(seed, name))
        parents = random_tree(n, rng, max_children=rng.randint(1, 10), order=order)
        cases.append(TreeCase(name, tuple(parents)))
    return cases


def batch_of_trees(trees, device=None):
    """Stack trees of one size into a (B, N) int32 parents tensor."""
    import torch

    trees = [list(t.parents if isinstance(t, TreeCase) else t) for t in trees]
    if not trees:
        raise ValueError("trees must hold at least one tree")
    sizes = {len(t) for t in trees}
    if len(sizes) != 1:
        raise ValueError(f"trees of one batch must have the same size, got sizes {sorted(sizes)}")
    return torch.tensor(trees, dtype=torch.int32, device=device)


def dfs_times_tensors(trees, device=None):
    """(start, end) int32 tensors of shape (B, N), computed by the reference."""
    import torch

    pairs = [pyspec_ref.dfs_times(list(t.parents if isinstance(t, TreeCase) else t)) for t in trees]
    start = torch.tensor([p[0] for p in pairs], dtype=torch.int32, device=device)
    end = torch.tensor([p[1] for p in pairs], dtype=torch.int32, device=device)
    return start, end


def random_tensor(shape, seed: int, dtype=None, device=None):
    """Standard-normal random values from a seed (never zeros)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    return values.to(dtype=dtype or torch.float32, device=device)
