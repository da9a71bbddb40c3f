"""Token trees as parent arrays, their masks, and FlashSpecInfer's DFS-interval encoding.

A tree of N nodes is a *parent array*: ``parents[i]`` is the id of node i's
parent, and ``-1`` marks the (single) root. The root need not be node 0; the
ids are arbitrary labels unless a function says otherwise. This is SpecInfer's
token tree (Miao et al., 2024): every speculated token has one parent token, and
a query token may attend to exactly its ancestors and itself.

DFS times (FlashSpecInfer §5.1) -- the convention used everywhere here
-----------------------------------------------------------------------
Traverse the tree depth-first from the root, visiting the children of a node
in increasing id. Then

* ``start[v]`` is v's *preorder index*: 0 for the root, N-1 for the last node
  visited; so ``start`` is a permutation of 0..N-1;
* ``end[v]`` is the largest preorder index in v's subtree (inclusive), so
  ``end[v] = start[v] + subtree_size(v) - 1``; the root's interval is [0, N-1].

In preorder a subtree is visited without interruption, so v's subtree is
exactly the nodes whose start lies in [start[v], end[v]]. Hence "key is an
ancestor of query, or query itself" is the interval test
``start[key] <= start[query] and end[query] <= end[key]`` (`sees`): two ints
per node replace an N x N mask. "Nodes numbered in DFS order" means
``start[i] == i`` for every i (use ``relabel(parents, dfs_order(parents))``).

All traversals here are iterative: a chain of 10**5 nodes must not hit
Python's recursion limit.
"""

from __future__ import annotations

from collections import deque

from ._validate import as_sequence, bool_matrix, index, int_list, permutation, positive_int

__all__ = [
    "ancestors",
    "bfs_order",
    "bitmask_from_mask",
    "causal_mask",
    "chain_parents",
    "children",
    "dense_mask_bits",
    "depths",
    "dfs_order",
    "dfs_times",
    "interval_mask_bits",
    "mask_from_bitmask",
    "parents_from_times",
    "relabel",
    "root",
    "sees",
    "tile_mask",
    "tree_bitmask",
    "tree_mask",
    "tree_mask_from_times",
    "validate_parents",
    "validate_times",
    "validate_topological",
]


# --------------------------------------------------------------------------- validation


def _first_cycle(parents: list[int]) -> list[int] | None:
    """One cycle of the parent map (as a list of nodes), or None if every node reaches -1.

    Each node is walked up at most once overall: a node is marked 'done' once
    its walk reached the root, and a walk that meets a node of its *own* path
    has found a cycle. O(N), no recursion.
    """
    unknown, on_path, done = 0, 1, 2
    state = [unknown] * len(parents)
    for first in range(len(parents)):
        path: list[int] = []
        v = first
        while v != -1 and state[v] == unknown:
            state[v] = on_path
            path.append(v)
            v = parents[v]
        if v != -1 and state[v] == on_path:
            return path[path.index(v) :]
        for u in path:
            state[u] = done
    return None


def validate_parents(parents: object, name: str = "parents") -> list[int]:
    """Check that `parents` is a parent array of one tree, and return it as a list.

    SpecInfer (Miao et al., 2024) token tree: every node has exactly one parent
    except the single root (-1). Checked: a non-empty sequence of ints (bools,
    floats and None refused), every entry in [-1, N) and not the node itself,
    exactly one root, and no cycle (every node reaches the root; the message
    names the nodes of one cycle).
    """
    p = int_list(parents, name, allow_empty=True)
    if not p:
        raise ValueError(f"{name} must not be empty: a tree has at least one node, its root")
    n = len(p)
    for i, x in enumerate(p):
        if not -1 <= x < n:
            raise ValueError(
                f"{name}[{i}] = {x} is out of range for a tree of {n} nodes "
                f"(a parent is -1 for the root or a node id 0..{n - 1})"
            )
        if x == i:
            raise ValueError(f"{name}[{i}] = {i}: node {i} is its own parent")
    roots = [i for i, x in enumerate(p) if x == -1]
    if not roots:
        raise ValueError(f"{name} has no root: exactly one entry must be -1")
    if len(roots) > 1:
        shown = ", ".join(map(str, roots[:10])) + (", ..." if len(roots) > 10 else "")
        raise ValueError(
            f"{name} has {len(roots)} roots (nodes {shown}): exactly one entry must be -1"
        )
    cycle = _first_cycle(p)
    if cycle is not None:
        shown = " -> ".join(map(str, cycle[:10] + [cycle[0]]))
        raise ValueError(
            f"{name} has a cycle through node {cycle[0]} ({shown}): "
            "every node must reach the root by following parents"
        )
    return p


def validate_topological(parents: object, name: str = "parents") -> list[int]:
    """`validate_parents`, plus every parent comes before its child: parents[i] < i.

    This is the layout a kernel that walks the tree in one pass needs (the
    root is then node 0). SpecInfer (Miao et al., 2024) §4 decodes all tree
    tokens in one pass; with parents first, a node's ancestors are all at
    smaller ids. The message names the first node whose parent comes later.
    """
    p = validate_parents(parents, name)
    if p[0] != -1:
        raise ValueError(
            f"{name}[0] = {p[0]}: in topological order the root must be node 0 "
            f"(the root is node {p.index(-1)})"
        )
    for i in range(1, len(p)):
        if p[i] >= i:
            raise ValueError(
                f"{name}[{i}] = {p[i]}: node {i}'s parent must come before it ({name}[i] < i)"
            )
    return p


# --------------------------------------------------------------------------- structure


def _children(p: list[int]) -> list[list[int]]:
    """Children lists of a validated parent array (increasing id, because i increases)."""
    kids: list[list[int]] = [[] for _ in p]
    for i, x in enumerate(p):
        if x != -1:
            kids[x].append(i)
    return kids


def children(parents: object) -> list[list[int]]:
    """children(parents)[v] = the children of node v, in increasing id.

    The token tree of SpecInfer (Miao et al., 2024), seen from the parent side.
    """
    return _children(validate_parents(parents))


def root(parents: object) -> int:
    """The id of the root, the one node whose parent is -1 (SpecInfer token tree)."""
    return validate_parents(parents).index(-1)


def _preorder(p: list[int]) -> list[int]:
    """Node ids in preorder (children in increasing id), with an explicit stack."""
    kids = _children(p)
    order: list[int] = []
    stack = [p.index(-1)]
    while stack:
        v = stack.pop()
        order.append(v)
        # pushed in reverse so that the smallest child is popped (visited) first
        stack.extend(reversed(kids[v]))
    return order


def _level_order(p: list[int]) -> list[int]:
    """Node ids in BFS order (children in increasing id)."""
    kids = _children(p)
    order: list[int] = []
    queue = deque([p.index(-1)])
    while queue:
        v = queue.popleft()
        order.append(v)
        queue.extend(kids[v])
    return order


def depths(parents: object) -> list[int]:
    """depths(parents)[v] = the number of edges from the root to v (root: 0).

    In SpecInfer (Miao et al., 2024) a node at depth t is the t-th speculated
    token after the root, i.e. its position offset in the sequence.
    """
    p = validate_parents(parents)
    depth = [0] * len(p)
    for v in _level_order(p):  # a parent is always met before its children
        if p[v] != -1:
            depth[v] = depth[p[v]] + 1
    return depth


def ancestors(parents: object, node: object) -> list[int]:
    """[node, parent(node), ..., root]: the nodes a query token may attend to.

    SpecInfer (Miao et al., 2024) §4: token u's sequence is the path from the
    root to u, so u attends to exactly these nodes (itself included).
    """
    p = validate_parents(parents)
    v = index(node, "node", len(p), "node")
    path = [v]
    while p[v] != -1:
        v = p[v]
        path.append(v)
    return path


def bfs_order(parents: object) -> list[int]:
    """Node ids in breadth-first (level) order from the root, children in increasing id.

    A level order is one topological order of SpecInfer's token tree (every
    parent before its children), so ``relabel(parents, bfs_order(parents))``
    satisfies `validate_topological`.
    """
    return _level_order(validate_parents(parents))


def dfs_order(parents: object) -> list[int]:
    """Node ids in preorder (children in increasing id): the order of FlashSpecInfer §5.1.

    ``dfs_order(p)[s]`` is the node with ``dfs_times(p)[0][node] == s``, so
    ``relabel(p, dfs_order(p))`` numbers the nodes in DFS order (start[i] == i).
    """
    return _preorder(validate_parents(parents))


def relabel(parents: object, order: object) -> list[int]:
    """The same tree with node ids renumbered: new node i is old node order[i].

    Used to put a token tree into DFS order (FlashSpecInfer §5.1) or level
    order; ``order`` must be a permutation of 0..N-1.
    """
    p = validate_parents(parents)
    old_of_new = permutation(order, "order", len(p))
    new_of_old = [0] * len(p)
    for new, old in enumerate(old_of_new):
        new_of_old[old] = new
    return [-1 if p[old] == -1 else new_of_old[p[old]] for old in old_of_new]


def chain_parents(n: object) -> list[int]:
    """[-1, 0, 1, ..., n-2]: a token tree with a single branch of n nodes.

    This is plain (non-tree) speculative decoding; its tree mask (SpecInfer §4)
    is the ordinary causal mask, which the tests check.
    """
    n = positive_int(n, "n")
    return [i - 1 for i in range(n)]


# --------------------------------------------------------------------------- DFS times


def dfs_times(parents: object) -> tuple[list[int], list[int]]:
    """FlashSpecInfer §5.1 DFS start/end times (convention in the module docstring).

    start[v] = v's preorder index; end[v] = start[v] + subtree_size(v) - 1,
    the last preorder index inside v's subtree. Iterative: O(N), no recursion.
    """
    p = validate_parents(parents)
    order = _preorder(p)
    start = [0] * len(p)
    for s, v in enumerate(order):
        start[v] = s
    size = [1] * len(p)
    # in reverse preorder every child is finished before its parent
    for v in reversed(order):
        if p[v] != -1:
            size[p[v]] += size[v]
    end = [start[v] + size[v] - 1 for v in range(len(p))]
    return start, end


def _time_names(name: str) -> tuple[str, str]:
    """'start/end' -> ('start', 'end'); any other name -> ('<name> start', '<name> end')."""
    if "/" in name:
        s, e = name.split("/", 1)
        return s, e
    return f"{name} start", f"{name} end"


def _nesting_parents(start: list[int], end: list[int], sname: str, ename: str) -> list[int]:
    """Parent of each interval (tightest strictly enclosing one), checking laminarity.

    Sweep the intervals in order of start with a stack of the intervals that
    contain the current point, innermost on top. An interval that ends before
    the current point is closed (popped). The new interval must then lie
    inside the top one; if it sticks out, the two cross.
    """
    n = len(start)
    by_start = [0] * n
    for v, s in enumerate(start):
        by_start[s] = v
    parent = [-1] * n
    stack: list[int] = []
    for s in range(n):
        v = by_start[s]
        while stack and end[stack[-1]] < s:
            stack.pop()
        if stack:
            top = stack[-1]
            if end[v] > end[top]:
                raise ValueError(
                    f"{sname}/{ename}: the intervals of nodes {top} [{start[top]}, {end[top]}] "
                    f"and {v} [{start[v]}, {end[v]}] cross (they must be nested or disjoint)"
                )
            parent[v] = top
        stack.append(v)
    return parent


def validate_times(
    start: object, end: object, name: str = "start/end"
) -> tuple[list[int], list[int]]:
    """Check that (start, end) are DFS times of a tree, as FlashSpecInfer §5.1 defines them.

    Checked: same length N >= 1, ints, start a permutation of 0..N-1,
    start[i] <= end[i] <= N-1, exactly one interval [0, N-1] (the root), the
    intervals laminar (any two nested or disjoint), and each interval's length
    equals the number of intervals nested in it (itself included), i.e. the
    times come from a real preorder. Any order of visiting siblings is
    accepted (`sees` does not depend on it); `dfs_times` is one such order.
    ``name`` "a/b" names the two arguments a and b in messages.
    """
    sname, ename = _time_names(name)
    s = int_list(start, sname)
    e = int_list(end, ename)
    n = len(s)
    if len(e) != n:
        raise ValueError(f"{sname} has {n} entries but {ename} has {len(e)}: one per node")
    s = permutation(s, sname, n)
    for v in range(n):
        if not s[v] <= e[v] <= n - 1:
            raise ValueError(
                f"{ename}[{v}] = {e[v]} is out of range: need {sname}[{v}] = {s[v]} <= "
                f"{ename}[{v}] <= {n - 1}"
            )
    the_root = s.index(0)
    if e[the_root] != n - 1:
        raise ValueError(
            f"{ename}[{the_root}] = {e[the_root]}: the root (the node with {sname} 0) must "
            f"have the interval [0, {n - 1}] covering every node"
        )
    parent = _nesting_parents(s, e, sname, ename)
    _check_sizes(s, e, parent, sname, ename)
    return s, e


def _check_sizes(s: list[int], e: list[int], parent: list[int], sname: str, ename: str) -> None:
    """Each interval's length must equal the number of intervals nested in it.

    Given a permutation and laminarity this always holds (an interval starting
    inside [s, e] can only be nested in it), but it is the property the
    kernels rely on, so the specification states it as a check of its own.
    """
    nested = [1] * len(s)
    for v in sorted(range(len(s)), key=s.__getitem__, reverse=True):
        if parent[v] != -1:
            nested[parent[v]] += nested[v]
    for v in range(len(s)):
        if e[v] - s[v] + 1 != nested[v]:
            raise ValueError(
                f"{sname}/{ename}: node {v}'s interval [{s[v]}, {e[v]}] has length "
                f"{e[v] - s[v] + 1} but {nested[v]} intervals nested in it: not a preorder"
            )


def parents_from_times(start: object, end: object) -> list[int]:
    """The parent array whose DFS times are (start, end): the inverse of `dfs_times`.

    FlashSpecInfer §5.1: the parent of v is the node with the tightest interval
    strictly containing v's. Node ids are kept as they are (arbitrary labels).
    """
    s, e = validate_times(start, end)
    return _nesting_parents(s, e, "start", "end")


def _sees(start: list[int], end: list[int], query: int, key: int) -> bool:
    """The interval test on already-validated times."""
    return start[key] <= start[query] and end[query] <= end[key]


def sees(start: object, end: object, query: object, key: object) -> bool:
    """True iff `key` is an ancestor of `query` or `key == query` (FlashSpecInfer §5.1).

    The test is ``start[key] <= start[query] and end[query] <= end[key]``. It is
    exactly ancestry because in preorder a subtree is a contiguous range of
    preorder indices: key's subtree is the nodes with start in
    [start[key], end[key]], and query lies in key's subtree iff key is an
    ancestor of query (or query itself). Validates the times (O(N)) each call.
    """
    s, e = validate_times(start, end)
    q = index(query, "query", len(s), "node")
    k = index(key, "key", len(s), "node")
    return _sees(s, e, q, k)


def tile_mask(start: object, end: object, tile: object) -> list[list[bool]]:
    """The tree mask at tile granularity: entry [i][j] is True iff some query of tile i
    (nodes i*tile .. i*tile+tile-1) sees some key of tile j (FlashSpecInfer §5.1's
    interval test on every pair of the two tiles).

    Beyond the paper: a kernel that knows this T x T table (T = ceil(N / tile)) can skip
    the key tiles no row of its query tile sees -- the block mask of PyTorch's
    FlexAttention, built from the DFS times. The last tile may be short.
    """
    s, e = validate_times(start, end)
    size = positive_int(tile, "tile")
    n = len(s)
    tiles = (n + size - 1) // size

    def members(t: int) -> range:
        return range(t * size, min(n, (t + 1) * size))

    return [[any(_sees(s, e, query, key) for query in members(i) for key in members(j))
             for j in range(tiles)] for i in range(tiles)]


# --------------------------------------------------------------------------- masks


def tree_mask(parents: object) -> list[list[bool]]:
    """The N x N tree causal mask from its definition: mask[q][k] = k in ancestors(q).

    SpecInfer (Miao et al., 2024) §4, tree-based parallel decoding with a
    topology-aware causal mask: token q sees itself and its ancestors only.
    Built by walking up from every node (O(N * depth)), deliberately not from
    the DFS times, so that it can check `tree_mask_from_times`.
    """
    p = validate_parents(parents)
    mask = [[False] * len(p) for _ in p]
    for q in range(len(p)):
        v = q
        while v != -1:
            mask[q][v] = True
            v = p[v]
    return mask


def tree_mask_from_times(start: object, end: object) -> list[list[bool]]:
    """mask[q][k] = sees(start, end, q, k): the tree mask from DFS times (FlashSpecInfer §5.1)."""
    s, e = validate_times(start, end)
    n = len(s)
    return [[_sees(s, e, q, k) for k in range(n)] for q in range(n)]


def causal_mask(n: object) -> list[list[bool]]:
    """The n x n causal mask, mask[q][k] = k <= q (Vaswani et al., 2017 §3.2.3).

    Equal to the tree mask of `chain_parents(n)` (SpecInfer §4).
    """
    n = positive_int(n, "n")
    return [[k <= q for k in range(n)] for q in range(n)]


# --------------------------------------------------------------------------- bitmasks


def bitmask_from_mask(mask: object, word_bits: object = 64) -> list[list[int]]:
    """Pack a boolean mask into words, as SpecInfer's and DeFT's kernels store it.

    SpecInfer (Miao et al., 2024) §4 / DeFT (Yao et al., ICLR 2025) bitmask:
    for every query row q, ceil(M / word_bits) non-negative ints, where bit b
    (value 2**b) of word w is mask[q][w * word_bits + b].
    """
    wb = positive_int(word_bits, "word_bits")
    rows = _mask_rows(mask)
    n_words = -(-len(rows[0]) // wb)  # ceil division
    out: list[list[int]] = []
    for row in rows:
        words = [0] * n_words
        for key, visible in enumerate(row):
            if visible:
                words[key // wb] |= 1 << (key % wb)
        out.append(words)
    return out


def _mask_rows(mask: object) -> list[list[bool]]:
    """A rectangular bool matrix with at least one row and one column."""
    rows = as_sequence(mask, "mask", "a list of rows of bools")
    if not rows:
        raise ValueError("mask must have at least one row, got none")
    width = len(as_sequence(rows[0], "mask[0]", "a row of bools"))
    return bool_matrix(
        rows,
        "mask",
        n_rows=len(rows),
        rows_note="",
        n_cols=width,
        cols_note=f"{width} (the width of mask[0])",
    )


def mask_from_bitmask(words: object, n_keys: object, word_bits: object = 64) -> list[list[bool]]:
    """Unpack `bitmask_from_mask`'s words into an N x n_keys boolean mask.

    SpecInfer §4 / DeFT (Yao et al., ICLR 2025) bitmask layout. Every row
    must have exactly ceil(n_keys / word_bits) words, each in
    [0, 2**word_bits), and the bits for keys >= n_keys must be zero (a set bit
    there would be a silently dropped visibility).
    """
    wb = positive_int(word_bits, "word_bits")
    m = positive_int(n_keys, "n_keys")
    n_words = -(-m // wb)
    rows = _word_rows(words, n_words, wb)
    mask: list[list[bool]] = []
    for q, row in enumerate(rows):
        if row[-1] >> (m - (n_words - 1) * wb):
            raise ValueError(
                f"words[{q}][{n_words - 1}] = {row[-1]} sets bits for keys >= n_keys = {m}"
            )
        mask.append([bool((row[k // wb] >> (k % wb)) & 1) for k in range(m)])
    return mask


def _word_rows(words: object, n_words: int, wb: int) -> list[list[int]]:
    """Rows of exactly n_words ints in [0, 2**wb)."""
    rows = as_sequence(words, "words", "a list of rows of ints")
    if not rows:
        raise ValueError("words must have at least one row, got none")
    out: list[list[int]] = []
    for q, r in enumerate(rows):
        row = int_list(r, f"words[{q}]")
        if len(row) != n_words:
            raise ValueError(
                f"words[{q}] has {len(row)} words, expected ceil(n_keys / word_bits) = {n_words}"
            )
        for w, x in enumerate(row):
            if not 0 <= x < (1 << wb):
                raise ValueError(
                    f"words[{q}][{w}] = {x} does not fit in word_bits = {wb} unsigned bits"
                )
        out.append(row)
    return out


def tree_bitmask(parents: object, word_bits: object = 64) -> list[list[int]]:
    """`bitmask_from_mask(tree_mask(parents), word_bits)`: SpecInfer §4 / DeFT tree bitmask."""
    wb = positive_int(word_bits, "word_bits")
    return bitmask_from_mask(tree_mask(parents), wb)


# --------------------------------------------------------------------------- memory


def dense_mask_bits(n: object, batch: object) -> int:
    """Bits of a dense tree mask: one per (query, key) pair per batch entry, n*n*batch.

    FlashSpecInfer §6.1: 2**31 bits = 2 Gbit at n = 4096, batch = 128.
    """
    return positive_int(n, "n") ** 2 * positive_int(batch, "batch")


def interval_mask_bits(n: object, batch: object, bits_per_time: object = 32) -> int:
    """Bits of the DFS-interval encoding: two times per node, 2*n*batch*bits_per_time.

    FlashSpecInfer §6.1: 2**25 bits = 32 Mbit at n = 4096, batch = 128, 32-bit times.
    """
    n_ = positive_int(n, "n")
    b = positive_int(batch, "batch")
    return 2 * n_ * b * positive_int(bits_per_time, "bits_per_time")
