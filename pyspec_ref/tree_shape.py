"""The shape of a token tree for a budget: Sequoia's dynamic program (Chen et al., 2024, §3.1).

A round verifies a tree of n nodes (the root, the last emitted token, included) in one target pass.
Which tree, for a given n, emits the most tokens per pass? Sequoia answers it under the positional
acceptance assumption (§3.1): the probability that a node's k-th child (k = 0, 1, ... in draw order)
is the child the verification accepts, given that the node itself was accepted, is a number
r[d][k] that depends only on the node's depth d and on k, not on the tokens. Those numbers are
measured once for a draft/target pair (`course.capstone.acceptance`). They are disjoint events of
one walk, so every row sums to at most 1.

A node is then accepted with the product of r along its path, and a round emits, in expectation,

    E(tree) = 1 + sum over non-root nodes v of  prod_{edges (u, k) on v's path} r[depth(u)][k]

tokens (the 1: the token drawn at the node where the walk stops). The best tree of at most n nodes
and depth at most D is Sequoia's recursion (their c(n, d)), here with a node's level L:

    f(0, L) = 0,   f(n, D) = 1,
    f(n, L) = 1 + g(n - 1, L, 0),
    g(m, L, k) = max( 0,  max_{1 <= a <= m}  r[L][k] * f(a, L + 1) + g(m - a, L, k + 1) ),   g(m, L, K) = 0,

where g hands m nodes to the children of rank k, k + 1, ... of a node at level L: child k gets a
subtree of a nodes, or no child from rank k on. A node's children are a PREFIX of the ranks: sibling
k exists only if siblings 0..k-1 do, because siblings are drawn and verified in order (sampling
without replacement draws sibling k from q without siblings 0..k-1; `pyspec_ref.sampling`). The
answer is f(n, 0), the expected tokens per target call.

When every row of r is non-increasing in k, a child is never worth more than its parent nor than its
elder sibling, and the best tree is simply the n nodes of largest path value (`greedy_tree`): a
best-first growth, which is what the course's decoder does on the GPU with these values as keys
(`course.capstone.tree`, key "static"). The tests check the two agree there.
"""

from __future__ import annotations

import functools
import math

from ._validate import as_real, as_sequence, positive_int

__all__ = ["check_acceptance", "best_tree", "greedy_tree", "expected_tokens", "tree_depth"]

ROW_TOLERANCE = 1e-9  # a row's sum may exceed 1 by rounding only


def check_acceptance(acceptance: object, depth: int) -> list[list[float]]:
    """The acceptance table r[d][k] for levels d = 0 .. depth - 1 (Chen et al., 2024, Sequoia §3.1's
    acceptance vector): either one row (the same for every level) or at least `depth` rows (deeper
    ones unused), each of K numbers in [0, 1] whose sum is at most 1. NaN, negatives, values above 1
    and rows of different
    lengths are refused, naming the entry."""
    depth = positive_int(depth, "depth")
    rows = as_sequence(acceptance, "acceptance", "a list of acceptance rates or a list of rows of them")
    if not rows:
        raise ValueError("acceptance must not be empty")
    if not isinstance(rows[0], (list, tuple)):
        rows = [rows] * depth
    if len(rows) < depth:
        raise ValueError(f"acceptance has {len(rows)} rows, expected 1 or at least depth = {depth} (one per "
                         "level of the tree that has children)")
    width = None
    table = []
    for d, row in enumerate(rows):
        row = as_sequence(row, f"acceptance[{d}]", "a list of acceptance rates")
        if width is None:
            width = len(row)
            if width == 0:
                raise ValueError(f"acceptance[{d}] is empty: give at least one child rank")
        if len(row) != width:
            raise ValueError(f"acceptance[{d}] has {len(row)} ranks, expected {width} (as acceptance[0])")
        values = []
        for k, value in enumerate(row):
            x = as_real(value, f"acceptance[{d}][{k}]")
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"acceptance[{d}][{k}] = {x} is not a probability in [0, 1]")
            values.append(x)
        if math.fsum(values) > 1.0 + ROW_TOLERANCE:
            raise ValueError(f"acceptance[{d}] sums to {math.fsum(values)}: the ranks are disjoint events of "
                             "one walk (at most one child is accepted), so a row sums to at most 1")
        table.append(values)
    return table


def _tree_from_children(children_of: dict) -> tuple[list[int], list[int]]:
    """(parents, ranks) in depth-first preorder from a nested {rank: subtree} description."""
    parents, ranks = [-1], [-1]

    def visit(node_id: int, subtree: dict) -> None:
        for rank in sorted(subtree):
            parents.append(node_id)
            ranks.append(rank)
            visit(len(parents) - 1, subtree[rank])

    visit(0, children_of)
    return parents, ranks


def best_tree(acceptance: object, budget: int, max_depth: int) -> tuple[list[int], list[int], float]:
    """Sequoia's optimal tree (Chen et al., 2024, §3.1: the dynamic program of the module docstring)
    of at most `budget` nodes (root included) and depth at most `max_depth`: (parents, ranks,
    expected tokens per call). parents[0] = -1 (the root), nodes in depth-first preorder,
    parents[i] < i; ranks[i] is node i's rank among its siblings (ranks[0] =
    -1). acceptance: see `check_acceptance` (rows for levels 0 .. max_depth - 1)."""
    budget = positive_int(budget, "budget")
    max_depth = positive_int(max_depth, "max_depth")
    r = check_acceptance(acceptance, max_depth)
    ranks = len(r[0])

    @functools.cache
    def f(n: int, level: int) -> tuple[float, tuple]:
        """Best (value, children) of a subtree of at most n nodes rooted at `level`."""
        if n == 0:
            return 0.0, ()
        if level == max_depth:
            return 1.0, ()
        value, children = g(n - 1, level, 0)
        return 1.0 + value, children

    @functools.cache
    def g(m: int, level: int, k: int) -> tuple[float, tuple]:
        """Best (value, ((rank, subtree size), ...)) handing m nodes to ranks k, k + 1, ..."""
        if m == 0 or k == ranks:
            return 0.0, ()
        best = (0.0, ())
        for a in range(1, m + 1):
            rest_value, rest = g(m - a, level, k + 1)
            value = r[level][k] * f(a, level + 1)[0] + rest_value
            if value > best[0]:
                best = (value, ((k, a),) + rest)
        return best

    def build(n: int, level: int) -> dict:
        return {k: build(a, level + 1) for k, a in f(n, level)[1]}

    parents, node_ranks = _tree_from_children(build(budget, 0))
    return parents, node_ranks, f(budget, 0)[0]


def tree_depth(parents: list[int]) -> int:
    """The number of edges on the longest root path of a parents list (parents before children): a
    tree's depth, the draft steps that grow it (Chen et al., 2024, Sequoia §3.1's depth limit d)."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return max(depth)


def expected_tokens(parents: object, ranks: object, acceptance: object) -> float:
    """E(tree) of the module docstring (Chen et al., 2024, Sequoia §3.1: expected tokens per call under
    the positional acceptance assumption): 1 + the sum over non-root nodes of the product of r along the
    path, for a tree given as parents (parents before children, parents[0] = -1) and sibling ranks."""
    parents = [int(p) for p in as_sequence(parents, "parents", "a parents list")]
    ranks = [int(k) for k in as_sequence(ranks, "ranks", "a list of sibling ranks")]
    if len(ranks) != len(parents) or not parents or parents[0] != -1:
        raise ValueError("parents and ranks must have the same length, with parents[0] = -1 (the root)")
    for i in range(1, len(parents)):
        if not 0 <= parents[i] < i:
            raise ValueError(f"parents[{i}] = {parents[i]} must be a node before {i}")
    r = check_acceptance(acceptance, max(tree_depth(parents), 1))
    reach = [1.0] * len(parents)
    level = [0] * len(parents)
    for i in range(1, len(parents)):
        u, k = parents[i], ranks[i]
        if not 0 <= k < len(r[0]):
            raise ValueError(f"ranks[{i}] = {k} is outside the acceptance table's {len(r[0])} ranks")
        level[i] = level[u] + 1
        reach[i] = reach[u] * r[level[u]][k]
    return math.fsum(reach)


def greedy_tree(acceptance: object, budget: int, max_depth: int) -> tuple[list[int], list[int], float]:
    """The `budget` nodes of largest path value (ties: shallower first, then lower ranks), grown
    best-first from the root (the growth of Chen et al., 2024, Sequoia §3.1's trees when acceptance
    falls with the rank): (parents, ranks, expected tokens per call), parents in creation order.
    A child of rank k becomes a candidate once its elder sibling (rank k - 1) is taken, so every
    node's children are a prefix of the ranks. Equal to `best_tree` when every row of the
    acceptance table is non-increasing in the rank."""
    budget = positive_int(budget, "budget")
    max_depth = positive_int(max_depth, "max_depth")
    r = check_acceptance(acceptance, max_depth)
    parents, node_ranks, values = [-1], [-1], [1.0]
    frontier = [(r[0][0], 1, 0, 0)]  # (value, level, parent, rank) of the candidates
    while len(parents) < budget and frontier:
        frontier.sort(key=lambda c: (-c[0], c[1], c[2], c[3]))
        value, level, parent, rank = frontier.pop(0)
        if value <= 0.0:
            break
        parents.append(parent)
        node_ranks.append(rank)
        values.append(value)
        if rank + 1 < len(r[0]):  # the next sibling
            frontier.append((values[parent] * r[level - 1][rank + 1], level, parent, rank + 1))
        if level < max_depth:  # the first child
            frontier.append((value * r[level][0], level + 1, len(parents) - 1, 0))
    return parents, node_ranks, math.fsum(values)
