"""One draft tree that lives across rounds, kept on the host (SwiftSpec §3.1-3.2), for the draft
worker of notebook 20 (`course.capstone.sides`).

The serial decoder (`course.capstone.decoder`) starts every round from a fresh root in a device table
of fixed shape (`course.capstone.tree`), so that a round is a few CUDA graphs. The parallel draft
cannot: it grows its tree WHILE the target verifies, without knowing which node will survive, and
after the verdict it keeps the surviving subtree and its KV rows (SwiftSpec §3.2). That tree's size
and shape depend on what was accepted, so here it is plain Python lists (a tree has tens of nodes);
the GPU work (the draft passes, the compaction) is launched by `course.capstone.sides`.

Node ids are creation order: node 0 is the root (the last committed token), and a node is created
after its parent, so ids are a topological numbering and the draft cache holds node i at row P + i
of the [prefix | tree] layout (P = the committed prefix). `swiftspec.tree_cache_attention` takes each
row's DFS times, so any row order works, and creation order makes re-rooting a left shift: the
committed path and the surviving subtree keep their relative order (every move has dst <= src, which
`swiftspec.compact` requires).

Expansion (SwiftSpec §3.1, `pyspec_ref.kvcache.expand_tree`): a node that the draft model has run
pushes candidate children into a priority queue; each draft step pops the w best candidates, which
become nodes and are run together (the non-square attention of w queries against the whole tree).

* greedy: a run node's candidates are its draft's top-`branch` tokens, keyed by their own cumulative
  log-probability (maximum-likelihood expansion).
* sample: a run node's candidates are `branch` draws WITHOUT replacement from the draft's
  distribution q at that node (Sequoia §3.2, Gumbel top-k), keyed by the PARENT's cumulative
  log-probability (ties in draw order), as in `course.capstone.tree`. A node's children thus leave
  the queue before any of their descendants, in draw order, and the ones that enter the tree are
  the first of the draws, as many as things ranked above them decide, never their own values: what
  multi-step speculative sampling without replacement needs to stay exact. That
  holds for a reused subtree too (its draws were made before anyone knew it would survive), so the
  re-root keeps it in both modes; `pyspec_ref.parallel_tree` states the argument and its tests
  check it.

The verified subtree is `pyspec_ref.kvcache.best_subtree` of the key over the nodes AND the queued
candidates (`select`): a candidate goes as a leaf the draft has not run (SwiftSpec's "unexpanded
leaves"), since the target needs only its token. When such a leaf is the last accepted node, the
draft makes it a node (`adopt`) and runs it, with the next token as its child, before re-rooting.

Draft-tree models, one per need (they are not merged, for these reasons):
* `pyspec_ref.parallel_tree` (with `pyspec_ref.kvcache`): the specification of the rules (growth,
  the verified subtree, re-rooting), standard library only, slow and obviously correct;
* `course.capstone.tree`: fixed-shape tables on the device for a whole batch, every round from a
  fresh root, so that a round of the serial decoder is a few CUDA graphs;
* `course.capstone.host_tree`: one tree on the host that lives across rounds (the parallel draft
  keeps the surviving subtree, whose shape depends on what was accepted), in Python lists;
* `course.capstone.device_tree`: that same tree in device tables of a fixed capacity, a row per
  node or candidate, so that its bookkeeping runs on the GPU without the host;
* `course.capstone.simple.Tree`: Python lists for one prompt, the one to read first.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

from .tree import MODES


@dataclass
class HostTree:
    """One sample's draft tree: parents, tokens, cumulative draft log-probabilities, which nodes the
    draft has run (their KV is in the cache and their candidates are queued), the candidate queue,
    and each run node's draft distribution q (sample mode; for the verification)."""

    mode: str
    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cum: list[float] = field(default_factory=list)  # own cumulative log-prob, relative to the root
    key: list[float] = field(default_factory=list)  # the ranking key (see the module docstring)
    depth: list[int] = field(default_factory=list)
    run: list[bool] = field(default_factory=list)
    q: list = field(default_factory=list)  # the draft's distribution at the node (None until run)
    top: list = field(default_factory=list)  # log of the draft's top probability at the node (run)
    kids: list = field(default_factory=list)  # each node's children, in increasing id
    heap: list = field(default_factory=list)  # (-key, order, parent, token, cum)
    order: itertools.count = field(default_factory=itertools.count)
    popped: dict = field(default_factory=dict)  # since the last select: a candidate's order -> its node

    @classmethod
    def fresh(cls, root_token: int, mode: str) -> HostTree:
        """A tree holding only its root (not yet run by the draft model)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        tree = cls(mode)
        tree._add(-1, int(root_token), 0.0, 0.0)
        return tree

    def __len__(self) -> int:
        return len(self.parents)

    def _add(self, parent: int, token: int, cum: float, key: float) -> int:
        self.parents.append(parent)
        self.tokens.append(token)
        self.cum.append(cum)
        self.key.append(key)
        self.depth.append(0 if parent < 0 else self.depth[parent] + 1)
        self.run.append(False)
        self.q.append(None)
        self.top.append(0.0)
        self.kids.append([])
        node = len(self.parents) - 1
        if parent >= 0:
            self.kids[parent].append(node)  # ids grow: the list stays sorted
        return node

    # ------------------------------------------------------------------ growth

    def pop(self, width: int, sent: set | None = None) -> list[int]:
        """Turn the `width` best candidates into nodes (fewer if the queue runs dry); their ids.
        sent: while the target verifies a subtree, the queue orders of its leaves: then the
        `width` likeliest to outlive the re-root (`pyspec_ref.parallel_tree`'s growth "likely":
        a sent leaf ranks by its key plus the log of its parent's top draft probability, any other
        candidate by its key; ties in queue order)."""
        if sent is not None:
            ranked = sorted(self.heap, key=lambda e: (e[0] - (self.top[e[2]] if e[1] in sent else 0.0), e[1]))
            taken = ranked[:width]
            chosen = {e[1] for e in taken}
            self.heap = [e for e in self.heap if e[1] not in chosen]
            heapq.heapify(self.heap)
        else:
            taken = [heapq.heappop(self.heap) for _ in range(min(width, len(self.heap)))]
        added = []
        for neg_key, order, parent, token, cum in taken:
            added.append(self._add(parent, token, cum, -neg_key))
            self.popped[order] = added[-1]
        return added

    def push(self, node: int, tokens: list[int], logprobs: list[float], q=None, top: float = 0.0) -> None:
        """Record that the draft has run `node`: its candidate children (tokens with the draft's
        log-probabilities at `node`, in the order they are to be tried) join the queue; top: the
        log of the draft's largest probability at `node`."""
        self.run[node] = True
        self.q[node], self.top[node] = q, top
        base = self.cum[node]
        for token, lp in zip(tokens, logprobs, strict=True):
            cum = base + lp
            key = cum if self.mode == "greedy" else base
            heapq.heappush(self.heap, (-key, next(self.order), node, int(token), cum))

    # ------------------------------------------------------------------ views

    def dfs_times(self) -> tuple[list[int], list[int]]:
        """FlashSpecInfer §5.1 DFS times (children by increasing id) of the whole tree."""
        return _times(self.kids)

    def selectable(self) -> int:
        """What a subtree can be chosen from: the nodes and the queued candidates."""
        return len(self) + len(self.heap)

    def select(self, size: int) -> list:
        """The `size` items sent for verification (a subtree containing the root), in id order:
        node ids, and the queue entries of candidates, which go as leaves the draft has not run.
        `pyspec_ref.parallel_tree`'s rule (`best_subtree` over the nodes and the `size` best queued
        candidates, whose ids follow the nodes' in queue order: largest key, then shallower, then
        smaller id), written out here to skip the reference's validation on every round."""
        queued = heapq.nsmallest(size, self.heap)
        n = len(self)
        ranked = sorted([(-self.key[v] if v else -math.inf, self.depth[v], v) for v in range(n)]
                        + [(entry[0], self.depth[entry[2]] + 1, n + i) for i, entry in enumerate(queued)])
        self.popped = {}
        return [v if v < n else queued[v - n] for v in sorted(v for *_, v in ranked[:size])]

    def adopt(self, entry: tuple, next_token: int) -> tuple[int, int]:
        """A queued candidate, accepted as a path's last node, becomes a node, with `next_token` as
        its child: (leaf, child), neither run yet. Run them in one pass before re-rooting on the
        child (see `pyspec_ref.parallel_tree`: the child's query sees the leaf's KV)."""
        self.heap.remove(entry)
        heapq.heapify(self.heap)
        neg_key, _, parent, token, cum = entry
        leaf = self._add(parent, token, cum, -neg_key)
        return leaf, self._add(leaf, next_token, cum, cum)  # keys become relative to it at the re-root

    # ------------------------------------------------------------------ after verification

    def _require_root_path(self, committed: list[int], new_root: int | None) -> None:
        """committed is a root path [0, v1, ..., vk] of this tree and new_root None or a child of vk:
        anything else would still give legal left shifts, and `swiftspec.compact` would move the
        wrong KV rows without a word (SwiftSpec §3.2 keeps the accepted path and its subtree)."""
        n = len(self)

        def node(value, name: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
                raise ValueError(f"{name} = {value!r} is not a node of this {n}-node tree")
            return value

        if not isinstance(committed, (list, tuple)) or not committed:
            raise ValueError("committed must be a non-empty list of node ids from the root, "
                             f"got {committed!r}")
        if node(committed[0], "committed[0]") != 0:
            raise ValueError(f"committed[0] = {committed[0]} is not the root (node 0)")
        for i in range(1, len(committed)):
            if self.parents[node(committed[i], f"committed[{i}]")] != committed[i - 1]:
                raise ValueError(f"committed[{i}] = {committed[i]} is not a child of committed[{i - 1}] = "
                                 f"{committed[i - 1]}: committed must be a path from the root")
        if new_root is not None and self.parents[node(new_root, "new_root")] != committed[-1]:
            raise ValueError(f"new_root = {new_root} is not a child of committed[-1] = {committed[-1]}")

    def reroot(self, committed: list[int], new_root: int | None, next_token: int
               ) -> tuple[HostTree, list[tuple[int, int]]]:
        """The tree after verification (SwiftSpec §3.2) and its cache moves.

        committed: the accepted root path [0, v1, ..., vk] (their KV joins the prefix, in order);
        new_root: the child of vk whose token is the emitted next token, if the tree has one (its
        whole subtree survives, with its KV and its queued candidates), else None (the next round
        starts from a fresh root `next_token` that the draft has not run yet). Moves are (src, dst)
        tree-row offsets from the old prefix end: committed[i] -> i, then the survivors in id order
        -> k + 1 + j. Every move has dst <= src; moves with src == dst are left out.
        """
        self._require_root_path(committed, new_root)
        k1 = len(committed)
        moves = [(v, i) for i, v in enumerate(committed) if v != i]
        if new_root is None:
            return HostTree.fresh(next_token, self.mode), moves
        kids = self.kids
        keep, stack = [], [new_root]
        while stack:
            v = stack.pop()
            keep.append(v)
            stack.extend(kids[v])
        keep.sort()
        new_of_old = {v: j for j, v in enumerate(keep)}
        moves += [(v, k1 + j) for j, v in enumerate(keep) if v != k1 + j]
        tree = HostTree(self.mode)
        base = self.cum[new_root]
        for v in keep:
            parent = -1 if v == new_root else new_of_old[self.parents[v]]
            # keys and cumulative log-probs relative to the new root: in both modes a key is a
            # cumulative log-prob (the node's own, or its parent's), so the ranking is unchanged
            key = 0.0 if v == new_root else self.key[v] - base
            tree._add(parent, self.tokens[v], self.cum[v] - base, key)
            tree.run[-1], tree.q[-1], tree.top[-1] = self.run[v], self.q[v], self.top[v]
        tree.heap = [(-(-neg - base), order, new_of_old[p], t, c - base) for neg, order, p, t, c in self.heap
                     if p in new_of_old]
        heapq.heapify(tree.heap)
        tree.order = self.order
        return tree, moves


def dfs_times_of(parents: list[int]) -> tuple[list[int], list[int]]:
    """`pyspec_ref.trees.dfs_times` of a tree already checked to be rooted at 0 with parents before
    children (the target's subtrees): the same times, without the specification's checks, and
    without a walk. Parents come first, so one backward loop sums each subtree's size, and one
    forward loop places each node right after its parent's earlier children's subtrees (children in
    increasing id, the walk's order); a subtree ends size - 1 after it starts. Two loops of plain
    arithmetic: the target's host computes these every round, on the critical path."""
    n = len(parents)
    size = [1] * n
    for node in range(n - 1, 0, -1):
        size[parents[node]] += size[node]
    start, free = [0] * n, [1] * n  # free[v]: where v's next child starts
    for node in range(1, n):
        parent = parents[node]
        start[node] = free[parent]
        free[parent] += size[node]
        free[node] = start[node] + 1
    return start, [start[v] + size[v] - 1 for v in range(n)]


def _times(kids: list[list[int]]) -> tuple[list[int], list[int]]:
    """DFS times from node 0 over children lists in increasing id. A draft pass needs the times of
    the whole tree (every new node renumbers them), and the specification's `dfs_times` checks the
    tree first, which costs more than the pass's GPU work; the tests hold these times equal to it."""
    start, end = [0] * len(kids), [0] * len(kids)
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        start[node] = len(order)
        order.append(node)
        stack.extend(reversed(kids[node]))
    for node in reversed(order):  # the last child's subtree ends its parent's
        end[node] = end[kids[node][-1]] if kids[node] else start[node]
    return start, end
