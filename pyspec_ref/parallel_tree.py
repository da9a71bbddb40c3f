"""SwiftSpec's parallel tree generation: the protocol between a draft and a target worker, and a
simulation of both sides with its invariants checked.

SwiftSpec ("SwiftSpec: Ultra-Low Latency LLM Decoding by Scaling Asynchronous Speculative
Decoding"), §3.1 (parallel tree generation, Algorithm 1, Figures 1(c) and 3) and §3.2 (KV cache
consistency, Figure 5). The draft model and the target model run in two workers (two GPUs). The
draft keeps growing its token tree while the target verifies the subtree it was sent, so drafting
leaves the critical path. Three messages, each sent at one point of Algorithm 1:

* ``SUBTREE`` (draft -> target, lines 14-15): the ``bs`` most probable items of the draft tree
  (`pyspec_ref.kvcache.best_subtree`): its nodes and its queued candidates, which enter as leaves
  the draft has not run (the "unexpanded leaves" of §3.1: the target needs only their tokens),
  as a parent array over the subtree's own indices (the root, the last committed token, is
  index 0; parents before children) and their tokens; in sampling mode also the draft
  distribution q at each node (the target's test needs it; a leaf's is never read).
* ``ACCEPTED`` (target -> draft, line 26): the accepted path as indices into the last SUBTREE
  (0 first) and the next token, the target's own (its argmax, or its draw).
* ``STOP`` (target -> draft, line 22): the generation is over; the draft leaves its loop.

Message order is a strict alternation: SUBTREE(r), then ACCEPTED(r) or STOP(r), then SUBTREE(r + 1)
(`check_message_log`). Round r's SUBTREE is chosen after the draft has re-rooted on ACCEPTED(r - 1),
so the target never sees a node that verification has already ruled out.

One round of each worker (Algorithm 1, with ``d`` = ``steps`` expansions per round):

* draft: send SUBTREE(r); grow the tree by ``steps`` steps of ``w`` leaves each (this is the work
  done during verification); receive; on STOP leave; on ACCEPTED re-root (below), top the tree up
  until ``bs`` items can be sent if fewer can (§3.2, "it expands bs nodes immediately using one
  draft model inference": here steps of as few nodes as the missing count needs, each run node
  queueing ``branch`` candidates), and send SUBTREE(r + 1);
* target: receive SUBTREE(r); one pass over its nodes; verify (greedy: `greedy_tree_verification`,
  sampling: `tree_speculative_sampling`); commit the path and the next token; send STOP if the
  generation is finished, else ACCEPTED(r).

Re-rooting (§3.2, Figure 5). The draft maps the path back to its own node ids (it remembers which
nodes it sent), commits them, and looks among the children of the last accepted node for the next
token. If one has it, that child is the new root and its whole subtree survives, with the KV cache
entries the draft computed for it during verification; otherwise the new root is the bare next
token, which the draft has not run yet. When the last accepted node is a leaf the draft never ran
(a queued candidate when it was sent, and still one), the draft first makes it a node with the next
token as its child and runs both in one pass (the child's query sees the leaf's KV, written in the
same pass): the leaf's KV joins the prefix and the child becomes the new root, run, with its own
candidates. The cache is laid out [prefix | tree] with node i at row
P + i (node ids are creation order: appending a node appends a row, as in §3.2 "appending the tree
cache after the existing entries"), so re-rooting moves the committed nodes to the end of the
prefix and the survivors right after them, in id order: every move goes left
(`pyspec_ref.kvcache.apply_moves` equals `apply_moves_in_order`).

The serial schedule (``schedule="serial"``, SwiftSpec's "serial tree generation") runs the same
``steps`` expansions AFTER re-rooting instead of during verification: the draft's steps are then
on the critical path, but every one of them grows the tree that is actually verified next. The
parallel draft works ahead without knowing which node verification will keep, so some of its
nodes die at the re-root: fewer tokens per target call (SwiftSpec Table 6: 9% fewer on average),
but no draft time between two target calls. Between the two, ``critical`` steps of the parallel
schedule follow the re-root as well (on the critical path, where the next root is known) before the
next SUBTREE: a few such steps win back much of the serial schedule's tokens per call for a
fraction of its draft time between two target calls.

The queued schedule (``schedule="queued"``) takes the draft's passes off the critical path
altogether: after re-rooting, the draft sends SUBTREE(r + 1) at once, chosen from whatever the
re-root left (only the new root when no subtree survived: it is sent unrun, and the target
verifies that one node), and runs the new root and the top-up at the start of its growth during
the next verification. An accepted leaf still queued is committed unrun too: its KV entry is owed, and that
first pass computes it before the new root (the device tree's way, `_Draft._owe`). Between two
verifications the draft then does only bookkeeping (the re-root and the selection), which a GPU can
run without its host: a round whose hosts only launch (the messages as device tensors) lasts the
target's pass and that bookkeeping. The price: a subtree smaller than ``bs`` whenever the survivors
are fewer, so fewer tokens per call again.

Growth ahead (``growth``). While the target verifies, the draft does not know where the next
root will be. Growth "best" pops the best keys, as every other step does; the best queued
candidates are then the leaves just sent, which leave the tree at the re-root whatever the verdict
(committed or cut). Growth "likely" speculates on the verdict instead (`_Draft.survival`): it pops
the candidates the draft itself deems likeliest to be in the tree after the re-root, so that more
of what it grows survives and fewer tokens per call are lost against the serial schedule.

Exactness.
* Greedy: every accepted token equals the target's argmax after its prefix and the next token is
  the target's argmax, so the output is the target's greedy decoding token for token, whatever
  the draft does (checked against `greedy_decode`).
* Sampling: a node's candidate children are ``branch`` draws from q at that node WITHOUT
  replacement (Sequoia §3.2, as the capstone's serial decoder draws them: distinct siblings, so
  none is a wasted duplicate), all keyed by that node's own cumulative log-probability (the
  capstone's rule, see course/capstone/tree.py), and every descendant of theirs gets a key no
  larger, pushed later. So a node's children leave the queue before any of their descendants, in
  draw order, and the ones sent are always the first of its draws, as many as the queue's other
  entries and the round's budget decide, never their own values (those only key their
  descendants, which rank behind them). That is what multi-step speculative sampling without
  replacement needs to be exact at each node (`tree_speculative_sampling`): the first m draws of
  the sequence, m independent of their values. It holds for a reused subtree too: its draws were
  made before anyone knew it would survive, and after the re-root the same ranking decides how
  many of them enter. (Growth "likely" may pop a node's later draws before its earlier ones, but
  only under a node of the SUBTREE under verification, which never survives the re-root.) The
  tests check the joint distribution of the first tokens against the target's by a chi-square
  test.

What the simulation keeps of each KV entry is its identity: (the node's birth number, the token
path it was computed for, prefix included). `check_draft_cache` and `check_target_cache` state the
invariants: after every re-root, row i < P holds the entry of the i-th committed token, row P + v
holds node v's entry for every node the draft has run, and every entry of a surviving node is
present exactly once (none lost, none duplicated).

Models are plain functions: ``model(path)`` -> a probability vector over the vocabulary, for the
token that follows ``path`` (a tuple of token ids, prompt included).

Draft-tree models, one per need (they are not merged, for these reasons):
* `pyspec_ref.parallel_tree` (with `pyspec_ref.kvcache`): the specification of the rules (growth,
  the verified subtree, re-rooting), standard library only, slow and obviously correct;
* `course.capstone.tree`: fixed-shape tables on the device for a whole batch, every round from a
  fresh root, so that a round of the serial decoder is a few CUDA graphs;
* `course.capstone.host_tree`: one tree on the host that lives across rounds (the parallel draft
  keeps the surviving subtree, whose shape depends on what was accepted, which no fixed table holds);
* `course.capstone.simple.Tree`: Python lists for one prompt, the one to read first.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ._validate import as_int, int_list, positive_int
from .kvcache import apply_moves, apply_moves_in_order, best_subtree
from .sampling import (
    greedy_tree_verification,
    sample_without_replacement,
    tree_speculative_sampling,
    validate_distribution,
)
from .trees import validate_parents, validate_topological

__all__ = [  # Message (the protocol's record) stays in this module's namespace
    "check_draft_cache",
    "check_message_log",
    "check_target_cache",
    "greedy_decode",
    "simulate_parallel_tree",
]

SUBTREE, ACCEPTED, STOP = "subtree", "accepted", "stop"
KINDS = (SUBTREE, ACCEPTED, STOP)
SCHEDULES = ("parallel", "serial", "queued")
GROWTHS = ("best", "likely")
MODES = ("greedy", "sample")

Model = Callable[[tuple[int, ...]], Sequence[float]]


@dataclass(frozen=True)
class Message:
    """One message of the protocol (see the module docstring): kind, round, and its payload.

    SUBTREE: parents (over the subtree's indices, -1 for the root), tokens, q (sampling mode: one
    distribution per node, else empty). ACCEPTED: path (indices into round's SUBTREE) and
    next_token. STOP: next_token and path of the last verification (the draft ignores them)."""

    kind: str
    round: int
    parents: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    q: tuple[tuple[float, ...], ...] = ()
    path: tuple[int, ...] = ()
    next_token: int = -1

    @property
    def sender(self) -> str:
        return "draft" if self.kind == SUBTREE else "target"


# --------------------------------------------------------------------------- the two sides


def _dist(model: Model, path: tuple[int, ...], vocab: int | None, name: str) -> list[float]:
    return validate_distribution(list(model(path)), f"{name}{path}", vocab)


@dataclass
class _Draft:
    """The draft worker: the committed prefix, the tree (creation order), its candidate queue and
    the KV cache rows [prefix | tree]."""

    model: Model
    mode: str
    branch: int
    rng: random.Random
    vocab: int
    prefix: list[int] = field(default_factory=list)  # committed tokens whose KV is cached
    parents: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cum: list[float] = field(default_factory=list)  # cumulative draft log-probability from the root
    key: list[float] = field(default_factory=list)  # ranking key: own cum (greedy), parent's (sample)
    birth: list[int] = field(default_factory=list)  # a number per node ever created: its KV identity
    run: list[bool] = field(default_factory=list)
    q: list = field(default_factory=list)  # the draft distribution at a run node
    heap: list = field(default_factory=list)  # (-key, order, parent, token, cum)
    cache: list = field(default_factory=list)  # KV rows: (birth, token path) entries
    growth: str = "best"  # how a step ahead picks its candidates (GROWTHS)
    order: itertools.count = field(default_factory=itertools.count)
    births: itertools.count = field(default_factory=itertools.count)
    steps: int = 0  # draft passes (one per step of w nodes, one per fresh root)
    sent: list = field(default_factory=list)  # the last SUBTREE: node ids and candidates' queue entries
    popped: dict = field(default_factory=dict)  # since then: a sent candidate's queue order -> its node
    owed: tuple | None = None  # the queued schedule: the KV entry of the last committed token, not run yet

    def path_of(self, v: int) -> tuple[int, ...]:
        """The tokens from the root to v (root first)."""
        out = []
        while v >= 0:
            out.append(self.tokens[v])
            v = self.parents[v]
        return tuple(reversed(out))

    def _add(self, parent: int, token: int, cum: float, key: float) -> int:
        self.parents.append(parent)
        self.tokens.append(token)
        self.cum.append(cum)
        self.key.append(key)
        self.birth.append(next(self.births))
        self.run.append(False)
        self.q.append(None)
        return len(self.parents) - 1

    def fresh(self, root_token: int) -> None:
        """A tree holding only the root (the last committed token), not run yet."""
        for name in ("parents", "tokens", "cum", "key", "birth", "run", "q", "heap"):
            getattr(self, name).clear()
        self._add(-1, root_token, 0.0, 0.0)

    def _write(self, row: int, entry) -> None:
        self.cache.extend([None] * (row + 1 - len(self.cache)))
        self.cache[row] = entry

    def _run(self, nodes: list[int]) -> None:
        """One draft pass over `nodes` (SwiftSpec §3.1, the w queries of the non-square mask): each
        writes its KV row P + v and pushes its candidate children (top-`branch` tokens in greedy
        mode, `branch` draws from q without replacement in sampling mode)."""
        self.steps += 1
        P = len(self.prefix)
        if self.owed is not None:  # the pass runs the owed committed token first (its row P - 1)
            self._write(P - 1, self.owed)
            self.owed = None
        for v in nodes:
            full = tuple(self.prefix) + self.path_of(v)
            self._write(P + v, (self.birth[v], full))
            q = _dist(self.model, full, self.vocab, "draft")
            self.run[v], self.q[v] = True, q
            if self.mode == "greedy":
                ranked = sorted((t for t in range(len(q)) if q[t] > 0.0), key=lambda t: (-q[t], t))
                picks = ranked[:self.branch]
            else:  # without replacement; fewer where q has fewer tokens
                count = min(self.branch, sum(1 for x in q if x > 0.0))
                picks = sample_without_replacement(q, count, [self.rng.random() for _ in range(count)])
            for t in picks:
                cum = self.cum[v] + math.log(q[t])
                key = cum if self.mode == "greedy" else self.cum[v]
                heapq.heappush(self.heap, (-key, next(self.order), v, t, cum))

    def step(self, width: int, ahead: bool = False) -> None:
        """Run the root if it is new, else pop the `width` best candidates and run them; for a step
        ahead of a verdict (while the target verifies) under growth "likely", the `width` likeliest
        to outlive the re-root (`survival`)."""
        if not self.run[0]:
            self._run([0])
            return
        added = []
        while self.heap and len(added) < width:
            if ahead and self.growth == "likely":
                entry = min(self.heap, key=lambda e: (-self.survival(e), e[1]))  # ties: queue order
                self.heap.remove(entry)
                heapq.heapify(self.heap)
            else:
                entry = heapq.heappop(self.heap)
            neg, order, parent, token, cum = entry
            added.append(self._add(parent, token, cum, -neg))
            self.popped[order] = added[-1]
        if added:
            self._run(added)

    def survival(self, entry: tuple) -> float:
        """Growth "likely": the draft's log-probability that a candidate, made a node now, is still
        in the tree after the coming re-root. Only the subtree of the next root survives, and the
        next root is never an item of the SUBTREE under verification (a sent child whose token is
        the next token is accepted, not rejected, and a rejected child's token has residual
        probability 0), so:

        * a candidate not sent lives on if verification ends where it hangs and emits its token,
          or goes through it: the draft puts probability exp(key) on that (in greedy mode the key
          is its own cumulative log-probability; in sampling mode its parent's, which keeps a
          surviving node's children in draw order, see the module docstring);
        * a candidate sent as a leaf leaves the tree at the re-root whatever the verdict (committed
          or cut); running it early is worth only the children it queues, the best of which is
          the next root when verification ends at the leaf: its key plus the log of the draft's
          top probability at its parent, an estimate of that child's probability known before the
          leaf is run."""
        neg, order, parent, _token, _cum = entry
        sent = any(isinstance(s, tuple) and s[1] == order for s in self.sent)
        return -neg + (math.log(max(self.q[parent])) if sent else 0.0)

    def selectable(self) -> int:
        """What a SUBTREE can be chosen from: the nodes and the queued candidates."""
        return len(self.parents) + len(self.heap)

    def select(self, size: int) -> Message:
        """SUBTREE: the `size` best items (`best_subtree` of the ranking key) among the nodes AND the
        queued candidates, re-indexed. A candidate enters as a leaf the draft has not run
        (SwiftSpec §3.1's "unexpanded leaves"): the target needs only its token, and its q is never
        read (a leaf has no children to test), so it is sent as the uniform distribution."""
        # At most `size` candidates can be sent: the `size` best in queue order (ties in draw order),
        # whose ids follow the nodes'.
        queued = heapq.nsmallest(size, self.heap)
        parents = self.parents + [entry[2] for entry in queued]
        keys = self.key + [-entry[0] for entry in queued]
        chosen = best_subtree(parents, keys, min(size, len(parents)))
        n = len(self.parents)
        self.sent = [v if v < n else queued[v - n] for v in chosen]  # a node id, or a candidate's entry
        self.popped = {}
        local = {v: j for j, v in enumerate(chosen)}
        tokens = tuple(self.tokens[v] if v < n else queued[v - n][3] for v in chosen)
        q = ()
        if self.mode == "sample":
            leaf = tuple([1.0 / self.vocab] * self.vocab)
            q = tuple(tuple(self.q[v]) if v < n and self.run[v] else leaf for v in chosen)  # unrun: a leaf
        return Message(SUBTREE, -1, tuple(-1 if parents[v] < 0 else local[parents[v]] for v in chosen),
                       tokens, q)

    def _adopt(self, entry: tuple, next_token: int) -> int:
        """An accepted leaf that was a queued candidate becomes a node, the next token its child,
        and both are run in ONE draft pass (the child's query sees the leaf's KV, written in the
        same pass): the committed leaf gets its KV entry and the new root its candidates. Returns
        the leaf's id."""
        self.heap.remove(entry)
        heapq.heapify(self.heap)
        neg, _, parent, token, cum = entry
        leaf = self._add(parent, token, cum, -neg)
        root = self._add(leaf, next_token, cum, cum)  # keys become relative to it at the re-root
        self._run([leaf, root])
        return leaf

    def _owe(self, entry: tuple, next_token: int) -> int:
        """The queued schedule's way with an accepted leaf still queued: it becomes a node that is
        committed unrun, its KV entry owed to the next pass (which runs it first, `_run`), and the
        next token becomes a fresh root: no draft pass between the verdict and the next SUBTREE."""
        self.heap.remove(entry)
        heapq.heapify(self.heap)
        neg, _, parent, token, cum = entry
        leaf = self._add(parent, token, cum, -neg)
        self.owed = (self.birth[leaf], tuple(self.prefix) + self.path_of(leaf))
        return leaf

    def reroot(self, path: Sequence[int], next_token: int, owe: bool = False) -> dict:
        """SwiftSpec §3.2: commit the accepted path, keep the subtree of the child of its last node
        that holds the next token (if any), and move their KV rows left. owe: a last node still
        queued is committed unrun (`_owe`), not run at once with the next token (`_adopt`).
        Returns what happened."""
        committed = [self.sent[j] for j in path]
        if isinstance(committed[-1], tuple):  # only a path's last node can be a leaf
            order = committed[-1][1]  # grown while the target verified it, or still queued
            unrun = self._owe if owe else self._adopt
            committed[-1] = self.popped.get(order) or unrun(committed[-1], next_token)  # ids > 0
        last = committed[-1]
        new_root = next((c for c in range(last + 1, len(self.parents))
                         if self.parents[c] == last and self.tokens[c] == next_token), None)
        keep = []
        if new_root is not None:
            kids: list[list[int]] = [[] for _ in self.parents]
            for c in range(1, len(self.parents)):
                kids[self.parents[c]].append(c)
            stack = [new_root]
            while stack:
                v = stack.pop()
                keep.append(v)
                stack.extend(kids[v])
            keep.sort()
        P, k1 = len(self.prefix), len(committed)
        moves = [(P + v, P + i) for i, v in enumerate(committed) if v != i]
        moves += [(P + v, P + k1 + j) for j, v in enumerate(keep) if v != k1 + j]
        self.cache.extend([None] * (P + len(self.parents) - len(self.cache)))
        moved = apply_moves(self.cache, moves)
        if moved != apply_moves_in_order(self.cache, moves):
            raise AssertionError(f"re-rooting moves {moves} are not a left shift")
        self.cache = moved
        self.prefix += [self.tokens[v] for v in committed]
        old = (list(self.parents), list(self.tokens), list(self.cum), list(self.key), list(self.birth),
               list(self.run), list(self.q))
        if new_root is None:
            self.fresh(next_token)
        else:
            self._keep(keep, new_root, old)
        # kept: the surviving subtree's nodes and queued candidates (whose draws it keeps too)
        kept = len(keep) + len(self.heap) * bool(keep)
        return {"committed": committed, "new_root": new_root, "kept": kept, "moves": moves}

    def _keep(self, keep: list[int], new_root: int, old) -> None:
        parents, tokens, cum, key, birth, run, q = old
        new_of_old = {v: j for j, v in enumerate(keep)}
        base = cum[new_root]  # cumulative log-probabilities and keys become relative to the new root
        for name in ("parents", "tokens", "cum", "key", "birth", "run", "q"):
            getattr(self, name).clear()
        for v in keep:
            self.parents.append(-1 if v == new_root else new_of_old[parents[v]])
            self.tokens.append(tokens[v])
            self.cum.append(cum[v] - base)
            self.key.append(0.0 if v == new_root else key[v] - base)
            self.birth.append(birth[v])
            self.run.append(run[v])
            self.q.append(q[v])
        self.heap = [(neg + base, order, new_of_old[p], t, c - base)
                     for neg, order, p, t, c in self.heap if p in new_of_old]
        heapq.heapify(self.heap)


@dataclass
class _Target:
    """The target worker: the committed sequence, its KV rows, and the emitted tokens."""

    model: Model
    mode: str
    rng: random.Random
    vocab: int
    prefix: list[int] = field(default_factory=list)
    cache: list = field(default_factory=list)  # KV rows: token paths
    emitted: list[int] = field(default_factory=list)
    calls: int = 0

    def verify(self, msg: Message, root_token: int) -> tuple[list[int], int]:
        """One target pass over the subtree (rows P + j), verification, and the compaction of the
        accepted rows to the end of the prefix."""
        parents = validate_topological(validate_parents(list(msg.parents), "SUBTREE parents"))
        if msg.tokens[0] != root_token:
            raise ValueError(f"SUBTREE round {msg.round} is rooted at token {msg.tokens[0]}, but the last "
                             f"committed token is {root_token}: the draft did not re-root on the path")
        self.calls += 1
        P = len(self.prefix)
        paths = []
        for j in range(len(parents)):
            up, v = [], j
            while v >= 0:
                up.append(msg.tokens[v])
                v = parents[v]
            paths.append(tuple(self.prefix) + tuple(reversed(up)))
        self.cache.extend([None] * (P + len(parents) - len(self.cache)))
        for j, full in enumerate(paths):
            self.cache[P + j] = full
        p = [_dist(self.model, full, self.vocab, "target") for full in paths]
        if self.mode == "greedy":
            best = [max(range(len(row)), key=lambda t, row=row: (row[t], -t)) for row in p]
            path, nxt = greedy_tree_verification(list(parents), list(msg.tokens), best)
        else:
            n = len(parents)
            accept = [self.rng.random() for _ in range(n)]
            draw = [self.rng.random() for _ in range(n)]
            # siblings are the first draws without replacement from q (Sequoia's rule)
            path, nxt = tree_speculative_sampling(list(parents), list(msg.tokens), [list(r) for r in msg.q],
                                                  p, accept, draw, replacement=False)
        moves = [(P + j, P + i) for i, j in enumerate(path) if i != j]
        self.cache = apply_moves(self.cache, moves)
        self.prefix += [msg.tokens[j] for j in path]
        self.emitted += [msg.tokens[j] for j in path[1:]] + [nxt]
        return path, nxt


# --------------------------------------------------------------------------- invariants


def check_draft_cache(prefix: Sequence[int], parents: Sequence[int], tokens: Sequence[int],
                      run: Sequence[bool], birth: Sequence[int], cache: Sequence) -> None:
    """SwiftSpec §3.2's invariant of the draft's KV cache [prefix | tree]: row i < P holds the entry
    of committed token i (the path prefix[:i + 1]), and row P + v holds node v's entry (its birth
    number and the path prefix + the tokens from the root to v) for every node the draft has run.
    Birth numbers are unique, so this also says that no surviving entry is lost (it would be
    missing from its row) or duplicated (two live rows would hold one birth number, and one of them
    would not be its own). Raises AssertionError naming the row."""
    P = len(prefix)
    for i in range(P):
        entry = cache[i] if i < len(cache) else None
        if entry is None or entry[1] != tuple(prefix[:i + 1]):
            raise AssertionError(f"draft cache row {i} holds {entry}, not committed token {i} "
                                 f"(path {tuple(prefix[:i + 1])})")
    for v in range(len(parents)):
        if not run[v]:
            continue
        up, u = [], v
        while u >= 0:
            up.append(tokens[u])
            u = parents[u]
        want = (birth[v], tuple(prefix) + tuple(reversed(up)))
        got = cache[P + v] if P + v < len(cache) else None
        if got != want:
            raise AssertionError(f"draft cache row {P + v} (tree node {v}) holds {got}, expected {want}: "
                                 "a surviving node's KV entry was lost, duplicated or moved to the wrong row")


def check_target_cache(prefix: Sequence[int], cache: Sequence) -> None:
    """The target's cache after a verification and its compaction (SwiftSpec §3.2: the accepted
    rows join the prefix): row i holds committed token i (the path prefix[:i + 1])."""
    for i in range(len(prefix)):
        if i >= len(cache) or cache[i] != tuple(prefix[:i + 1]):
            raise AssertionError(f"target cache row {i} holds {cache[i] if i < len(cache) else None}, "
                                 f"not committed token {i}")


def check_message_log(messages: Sequence[Message], tree_size: int) -> None:
    """The protocol's order (SwiftSpec §3.1, Algorithm 1): SUBTREE(r) then ACCEPTED(r) or STOP(r),
    rounds 0, 1, 2, ..., STOP last; each SUBTREE a topological tree of at most tree_size nodes
    rooted at index 0, each ACCEPTED path a root path of its round's SUBTREE. Raises AssertionError
    naming the message."""
    subtree = None
    for i, m in enumerate(messages):
        expect_subtree = i % 2 == 0
        if m.kind not in KINDS or (m.kind == SUBTREE) != expect_subtree or m.round != i // 2:
            raise AssertionError(f"message {i} is {m.kind}({m.round}); expected "
                                 f"{'SUBTREE' if expect_subtree else 'ACCEPTED or STOP'}({i // 2})")
        if m.kind == SUBTREE:
            validate_topological(validate_parents(list(m.parents), f"messages[{i}].parents"))
            if not 1 <= len(m.parents) <= tree_size or len(m.tokens) != len(m.parents):
                raise AssertionError(f"message {i}: a SUBTREE of {len(m.parents)} nodes and {len(m.tokens)} "
                                     f"tokens (tree_size {tree_size})")
            subtree = m
            continue
        if m.path[0] != 0 or any(subtree.parents[b] != a for a, b in itertools.pairwise(m.path)):
            raise AssertionError(f"message {i}: path {m.path} is not a root path of round {m.round}'s "
                                 "SUBTREE")
        if m.kind == STOP and i != len(messages) - 1:
            raise AssertionError(f"message {i} is STOP but {len(messages) - 1 - i} messages follow")
    if not messages or messages[-1].kind != STOP:
        raise AssertionError("the log does not end with STOP")


# --------------------------------------------------------------------------- the simulation


def greedy_decode(target: Model, prompt: Sequence[int], max_new_tokens: int,
                  eos: int | None = None) -> list[int]:
    """Plain greedy decoding, the output that greedy tree verification must reproduce (SpecInfer
    §4.3): the target's argmax (the first maximum), one token at a time, up to and with eos."""
    seq = int_list(prompt, "prompt")
    out: list[int] = []
    while len(out) < max_new_tokens:
        p = validate_distribution(list(target(tuple(seq))), f"target{tuple(seq)}")
        out.append(max(range(len(p)), key=lambda t: (p[t], -t)))
        seq.append(out[-1])
        if out[-1] == eos:
            break
    return out


def _check_options(prompt, max_new_tokens, tree_size, width, steps, branch, mode, schedule, eos,
                   critical=0) -> tuple:
    prompt = int_list(prompt, "prompt")
    if not prompt:
        raise ValueError("prompt must hold at least one token (the root of the first tree)")
    n = positive_int(max_new_tokens, "max_new_tokens")
    bs = positive_int(tree_size, "tree_size")
    w = positive_int(width, "width")
    d = as_int(steps, "steps")
    if d < 0:
        raise ValueError(f"steps must be >= 0 (draft steps per round), got {d}")
    k = positive_int(branch, "branch")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    c = as_int(critical, "critical")
    if c < 0 or (c and schedule != "parallel"):
        raise ValueError(f"critical must be >= 0, and 0 unless schedule is 'parallel' (the serial schedule's "
                         f"steps all follow the re-root, the queued schedule's none), got {c}")
    if eos is not None:
        as_int(eos, "eos")
    return prompt, n, bs, w, d, k


def simulate_parallel_tree(target: Model, draft: Model, prompt: Sequence[int], max_new_tokens: int, *,
                           tree_size: int = 4, width: int = 2, steps: int = 2, branch: int = 2,
                           mode: str = "greedy", schedule: str = "parallel", growth: str = "best",
                           critical: int = 0, seed: int = 0,
                           eos: int | None = None, target_cost: float = 1.0, step_cost: float = 0.3,
                           check: bool = True) -> dict:
    """Both workers of SwiftSpec's Algorithm 1 (§3.1), run one after the other in the order the
    messages impose; with fixed `steps` the result does not depend on timing, so two real processes
    produce exactly these tokens and messages.

    tree_size: bs, nodes per SUBTREE; width: w, nodes per draft step; steps: d, draft steps per
    round (during verification for schedules "parallel" and "queued", after re-rooting for
    "serial"; "queued" sends each SUBTREE right after the re-root, see the module docstring); growth:
    how those steps ahead pick their candidates, "best" (the best keys, as every other step) or
    "likely" (the likeliest to outlive the re-root, `_Draft.survival`: a leaf of the subtree
    under verification leaves the tree whatever the verdict, and is worth running early only for
    the children it queues); critical (schedule "parallel"): steps of w nodes taken after the
    re-root too, on the critical path, where the next root is known; branch:
    candidate children per run node; mode: "greedy" or "sample" (uniforms from random.Random(seed)
    for the draft and random.Random(seed + 1) for the target); eos: a token that ends the output.
    The draft tree holds at most 2 * tree_size + (steps + 1) * width nodes: a step of w starts only
    if its nodes fit (the capacity of the draft's tree cache; a top-up may overshoot tree_size).

    A clock in units of `target_cost` per target pass and `step_cost` per draft pass (messages are
    free) times each side's work and waits: the timeline and the sequence diagram of notebook 20.
    check=True checks `check_draft_cache` after every re-root, `check_target_cache` after every
    verification and `check_message_log` at the end.

    Returns tokens (the output, at most max_new_tokens), messages (the log), times (per message:
    when it was sent and when its receiver took it), events (side, what, round, start, end), rounds
    (per round: sent nodes, accepted path length, whether a subtree was reused and how many nodes
    and queued candidates survived), target_calls, draft_steps, tokens_per_call (tokens
    emitted per target call, before truncation), time (the clock when the target stops).
    """
    prompt, n, bs, w, d, k = _check_options(prompt, max_new_tokens, tree_size, width, steps, branch, mode,
                                            schedule, eos, critical)
    after = d if schedule == "serial" else critical  # steps after the re-root, before SUBTREE
    if growth not in GROWTHS:
        raise ValueError(f"growth must be one of {GROWTHS}, got {growth!r}")
    vocab = len(validate_distribution(list(target(tuple(prompt))), f"target{tuple(prompt)}"))
    capacity = 2 * bs + (d + 1) * w
    dr = _Draft(draft, mode, k, random.Random(seed), vocab, growth=growth)
    tg = _Target(target, mode, random.Random(seed + 1), vocab)
    # Prefill: both caches hold the prompt but its last token, which is the first root.
    dr.prefix, tg.prefix = prompt[:-1], prompt[:-1]
    dr.cache = [(-1 - i, tuple(prompt[:i + 1])) for i in range(len(prompt) - 1)]
    tg.cache = [tuple(prompt[:i + 1]) for i in range(len(prompt) - 1)]
    dr.fresh(prompt[-1])
    last = prompt[-1]  # the last committed token: the root the target expects
    messages: list[Message] = []
    times: list[tuple[float, float]] = []  # per message: (sent, received) on the clock
    events: list[dict] = []
    rounds: list[dict] = []
    clock = {"draft": 0.0, "target": 0.0}

    def work(side: str, what: str, r: int, cost: float) -> None:
        if cost > 0:
            events.append({"side": side, "what": what, "round": r, "start": clock[side],
                           "end": clock[side] + cost})
            clock[side] += cost

    def wait_until(side: str, r: int, t: float) -> None:
        if t > clock[side]:
            events.append({"side": side, "what": "wait", "round": r, "start": clock[side], "end": t})
            clock[side] = t

    def grow(what: str, r: int, planned: int) -> None:
        """Run the root if it is new; top the tree up until bs items (nodes and queued candidates)
        can be sent, each step running as few nodes as the missing count needs (each queues k
        candidates; §3.2: a short tree "expands bs nodes immediately using one draft model
        inference"); then take `planned` steps of w nodes (as many as fit the capacity). A step
        pops candidates (the best; ahead of a verdict under growth "likely", the likeliest to
        survive it) and runs them in one draft pass."""
        before, ahead = dr.steps, what == "grow ahead"
        if not dr.run[0]:
            dr.step(w)
        while dr.heap and dr.selectable() < bs:
            dr.step(-(-(bs - dr.selectable()) // k))
        for _ in range(min(planned, max(0, (capacity - len(dr.parents)) // w))):
            if not dr.heap:
                break
            dr.step(w, ahead)
        work("draft", what, r, (dr.steps - before) * step_cost)

    r = 0
    grow("grow", 0, after)
    while True:
        sub = dr.select(bs)
        sub = Message(SUBTREE, r, sub.parents, sub.tokens, sub.q)
        messages.append(sub)
        sent = clock["draft"]
        wait_until("target", r, sent)
        times.append((sent, clock["target"]))
        if schedule != "serial":
            grow("grow ahead", r, d)  # drafting during verification: off the critical path
        if check and schedule == "queued":  # here, once the new root's pass has run any owed token
            check_draft_cache(dr.prefix, dr.parents, dr.tokens, dr.run, dr.birth, dr.cache)
        path, nxt = tg.verify(sub, last)
        work("target", "verify", r, target_cost)
        if check:
            check_target_cache(tg.prefix, tg.cache)
        last = nxt
        finished = len(tg.emitted) >= n or (eos is not None and eos in tg.emitted[:n])
        messages.append(Message(STOP if finished else ACCEPTED, r, path=tuple(path), next_token=nxt))
        sent = clock["target"]
        wait_until("draft", r, sent)
        times.append((sent, clock["draft"]))
        info = {"round": r, "sent": len(sub.parents), "accepted": len(path) - 1, "reused": False, "kept": 0}
        rounds.append(info)
        if finished:
            break
        before = dr.steps
        # one draft pass when the path ends at a leaf never run (queued: none, the leaf's KV is owed)
        done = dr.reroot(path, nxt, owe=schedule == "queued")
        work("draft", "re-root", r, (dr.steps - before) * step_cost)
        info.update(reused=done["new_root"] is not None, kept=done["kept"])
        if check and schedule != "queued":
            check_draft_cache(dr.prefix, dr.parents, dr.tokens, dr.run, dr.birth, dr.cache)
        r += 1
        if schedule != "queued":  # serial: all the drafting happens here; parallel: `critical` steps
            grow("grow", r, after)
    if check:
        check_message_log(messages, bs)
    tokens = tg.emitted[:n]
    if eos is not None and eos in tokens:
        tokens = tokens[:tokens.index(eos) + 1]
    return {"tokens": tokens, "messages": messages, "times": times, "events": events, "rounds": rounds,
            "target_calls": tg.calls, "draft_steps": dr.steps,
            "tokens_per_call": len(tg.emitted) / tg.calls, "time": clock["target"]}
