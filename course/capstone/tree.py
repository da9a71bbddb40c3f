"""One round's draft trees, kept on the device for a whole batch (SwiftSpec §3.1's growth).

Every decision of a round is taken by the GPU, so that a round is a few CUDA graphs launched back to
back and the host waits only once, for the accepted tokens: which nodes the draft expands, which
children they get, which nodes the target verifies. What makes that possible is a fixed SHAPE:

* Node ids are creation order; node 0 is the root (the last committed token). A node the draft runs
  gets exactly `branch` children at once (the draft's top-k tokens in greedy mode, draws from its
  distribution q in sample mode), so the number of nodes after each step does not depend on the
  draft's guesses, only on (steps, width, branch): the `Schedule`. Step 0 runs the root; each later
  step runs the `width` best nodes not yet run (the "frontier"), ranked by the key below. The
  children of a step land in a block of ids fixed in advance, which a static slice writes.
* Children need not be run to be verified: the target checks a node's token, and only a node whose
  children are wanted must go through the draft. So a round of s steps offers a tree of depth s
  (Leviathan et al.'s chain of k tokens costs k draft steps, here too).
* The key, one of three rules (`KEYS`), plus the node's PRIOR: the sum along its path of bias[depth,
  k], the log of a measured acceptance rate of a child at that depth and sibling rank k (zero when
  none is given):
  - "cum": the node's cumulative draft log-probability, EAGLE-2's confidence (Li et al., 2024, §4):
    the draft's own estimate of how likely the path is accepted (greedy mode only, see below);
  - "parent": its PARENT's cumulative log-probability (sample mode's dynamic tree);
  - "static": the prior alone, fixed before any draw: Sequoia's tree (Chen et al., 2024, §3.1),
    whose best shape for a budget is the `tree_size` nodes of largest key (`pyspec_ref.tree_shape`).
  Ties are broken by depth, then id: the rank is key - EPS * (depth * size + id). A child's rank is
  strictly below its parent's (every term added is <= 0), so the `tree_size` best nodes always form
  a subtree containing the root (`pyspec_ref.kvcache.best_subtree`'s rule), and the verified set is
  one `topk`.
* Ancestry for the attention (FlashSpecInfer §5.1's interval test: row j is an ancestor of query i iff
  start[j] <= start[i] and end[i] <= end[j]) needs nested intervals, not DFS times as such: the
  kernels only compare them. A node at depth d gets an interval of span[d] numbers, span[steps] = 1
  and span[d] = 1 + branch * span[d + 1], and its k-th child the k-th slice after its own first
  number: the numbering of a complete `branch`-ary tree, fixed when the node is created, so it is
  never recomputed as the tree grows.

Sampling stays exact (SpecInfer §4.3; Sequoia §3.2) when a node's siblings are tried in draw order
and whether a node is kept (expanded, verified) never depends on its own draw or on the target:
only on things ranked above it. The "parent" and "static" keys do that; "cum" does not (a draw
that happens to be likely would be kept more often), so sample mode refuses it. Siblings are drawn
WITHOUT replacement by default: sibling i from q with siblings 1..i-1 removed, which the Gumbel
top-k draws in one `topk` (`children`), verified by the matching walk
(`tree_verification.tree_speculative_sampling(..., replacement=False)`). Drawn WITH replacement
(SpecInfer's independent draws, `replacement=True`), a peaked q gives a node the same token
several times, and once that token is rejected, its copies are rejected for certain: the budget
they took is wasted (notebook 21). The fixed schedule keeps every round's budget independent of
earlier draws.

Every round starts from its root alone. SwiftSpec §3.2 keeps the subtree the draft grew under the
emitted token, with its KV rows; its shape depends on what was accepted, which no table of a fixed
shape holds. Keeping it would not break exactness (`pyspec_ref.parallel_tree` says why), and
notebook 20's parallel draft, whose growth is off the critical path, keeps it: in Python lists
(`course.capstone.host_tree`), or in device tables of a capacity fixed for the whole generation,
whose rows hold a tree of any shape (`course.capstone.device_tree`).

The tables are (B, size, FIELDS) float64 (ids, tokens and interval numbers are integers far below
2**53, so float64 holds them exactly): one gather fetches everything about a set of nodes.

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

from dataclasses import dataclass

import torch
from torch import Tensor

MODES = ("greedy", "sample")
# How a child's key is computed (see `DraftTrees`): from its own cumulative draft log-probability, from
# its parent's, or from its parent's key alone (a static shape).
KEYS = ("cum", "parent", "static")
# Columns of the node table.
ID, PARENT, TOKEN, DEPTH, START, END, CUM, RANK, OPEN, PRIOR = range(10)
FIELDS = 10
EPS = 2.0 ** -32  # tie-break step of the rank: far below any difference of two log-probabilities
MAX_INTERVAL = 2 ** 31 - 1  # the attention kernels read interval numbers as int32
TINY = 2.0 ** -60  # a uniform of exactly 0 would give an infinite Gumbel key


def gumbel_top_k(logq: Tensor, uniforms: Tensor, k: int) -> Tensor:
    """The `k` tokens with the largest log q(v) + G_v, G_v = -log(-log u_v) a Gumbel key per
    vocabulary entry from `uniforms` (same shape as logq), largest first: distributed as k draws
    one after another from q without the earlier ones (`pyspec_ref.sampling.gumbel_top_k`)."""
    gumbel = -torch.log(-torch.log(uniforms.clamp(min=TINY)))
    return torch.topk(logq.double() + gumbel, k, dim=-1).indices


def top_children(logq: Tensor, branch: int) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy growth's candidates at each row of logq (rows, V): the `branch` likeliest tokens,
    likeliest first and ties to the lower token id (a stable sort: `torch.topk` leaves the order
    of ties open, and the parallel draft's kernels must pick what this picks); their
    log-probabilities; and each row's largest log-probability (float64)."""
    logp, tokens = torch.sort(logq, dim=-1, descending=True, stable=True)
    branch = min(branch, logq.shape[-1])
    return tokens[:, :branch], logp[:, :branch], logp[:, 0].double()


def check_bias(bias, steps: int, branch: int) -> Tensor:
    """A (steps, branch) table of log acceptance rates: finite or -inf, never NaN, never above 0."""
    bias = torch.as_tensor(bias, dtype=torch.float64)
    if bias.shape != (steps, branch):
        raise ValueError(f"bias must have shape (steps, branch) = ({steps}, {branch}), "
                         f"got {tuple(bias.shape)}")
    if torch.isnan(bias).any() or (bias > 0).any():
        raise ValueError("bias must hold log acceptance rates: no NaN and none above 0 (a rate above 1)")
    return bias


@dataclass(frozen=True)
class Schedule:
    """The shape of a round's draft tree (see the module docstring)."""

    steps: int
    width: int
    branch: int
    before: tuple[int, ...]  # nodes in the tree when each step starts
    runs: tuple[int, ...]  # nodes each step runs
    size: int  # nodes after the last step
    spans: tuple[int, ...]  # interval length of a node at depth d = 0 .. steps

    def block(self, step: int) -> tuple[int, int]:
        """The ids [first, stop) of the children that `step` creates."""
        first = self.before[step]
        return first, first + self.runs[step] * self.branch


def schedule(steps: int, width: int, branch: int) -> Schedule:
    """Step 0 runs the root; step s > 0 runs min(width, nodes not yet run) nodes."""
    before, runs = [], []
    nodes, unrun = 1, 1
    for step in range(steps):
        run = 1 if step == 0 else min(width, unrun)
        before.append(nodes)
        runs.append(run)
        nodes += run * branch
        unrun += run * (branch - 1)
    spans = [1]
    for _ in range(steps):
        spans.insert(0, 1 + branch * spans[0])
        if spans[0] > MAX_INTERVAL:  # stop at once: the next spans would only print as huge numbers
            raise ValueError(f"steps = {steps} with branch = {branch}: a tree this deep and wide needs more "
                             f"interval numbers than the kernels' int32 holds ({MAX_INTERVAL:,}); with "
                             f"branch = {branch}, use at most {len(spans) - 2} steps, or a smaller branch")
    return Schedule(steps, width, branch, tuple(before), tuple(runs), nodes, tuple(spans))


@dataclass
class Chosen:
    """The nodes sent to the target: ids (B, N) ascending (node 0 first), their table rows, and each
    one's parent as an index into ids (-1 for the root)."""

    ids: Tensor
    rows: Tensor
    parents: Tensor


class DraftTrees:
    """The batch's draft trees of one round, in device tables (see the module docstring).

    key: how a child's key is computed, before its tie-break: its prior plus "cum" its cumulative
    draft log-probability (greedy: EAGLE-2's confidence), "parent" its parent's (sampling: a node's
    own draw must not decide whether it is kept), or "static" nothing (a shape fixed before any draw:
    Sequoia's tree). bias: (steps, branch) float64; a child at depth d + 1 and sibling rank k adds
    bias[d, k] (the log of a measured acceptance rate; zeros: none) to its parent's prior. replacement (sample
    mode): siblings drawn independently (SpecInfer) instead of without replacement (Sequoia).
    """

    def __init__(self, batch: int, plan: Schedule, mode: str, vocab_size: int, device, *,
                 key: str | None = None, bias: Tensor | None = None, replacement: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        key = key or ("cum" if mode == "greedy" else "parent")
        if key not in KEYS:
            raise ValueError(f"key must be one of {KEYS}, got {key!r}")
        if mode == "sample" and key == "cum":
            raise ValueError("key = 'cum' ranks a node by its own draw: in sample mode that would bias which "
                             "draws are kept (use 'parent' or 'static')")
        self.plan, self.mode, self.batch, self.key, self.replacement = plan, mode, batch, key, replacement
        size = plan.size
        self.table = torch.zeros((batch, size, FIELDS), dtype=torch.float64, device=device)
        self.table[:, :, ID] = torch.arange(size, dtype=torch.float64, device=device)
        self.table[:, :, RANK:OPEN + 1] = -torch.inf
        self.table[:, :, PRIOR] = 0.0
        self.table[:, 0, PARENT] = -1
        self.table[:, 0, END] = plan.spans[0] - 1
        self.table[:, 0, RANK] = 0.0
        # The draft's distribution at every node it ran (sample mode: the verification needs q).
        self.q = (torch.zeros((batch, size, vocab_size), dtype=torch.float32, device=device)
                  if mode == "sample" else None)
        self._root_ids = torch.zeros((batch, 1), dtype=torch.int64, device=device)
        self.spans = torch.tensor(plan.spans + (0,), dtype=torch.float64, device=device)
        self.bias = torch.zeros((plan.steps, plan.branch), dtype=torch.float64, device=device)
        if bias is not None:
            self.bias.copy_(check_bias(bias, plan.steps, plan.branch))
        # Per step: each child's rank k among its siblings, and the tie-break of its id.
        self._k = torch.arange(plan.branch, dtype=torch.float64, device=device)
        self._child_ids = [torch.arange(*plan.block(s), dtype=torch.float64, device=device).view(
            plan.runs[s], plan.branch) for s in range(plan.steps)]

    def uniforms_per_run(self, vocab_size: int) -> int:
        """Uniforms one run node's children take (sample mode): one per child drawn with replacement,
        one per vocabulary entry (the Gumbel keys) without."""
        return self.plan.branch if self.replacement else vocab_size

    # ------------------------------------------------------------------ a round

    def reset(self, roots: Tensor) -> None:
        """A fresh tree per sample: only the root, holding token roots[b], not yet run."""
        self.table[:, 0, TOKEN].copy_(roots)
        self.table[:, 0, OPEN].fill_(0.0)

    def pick(self, step: int) -> Tensor:
        """The (B, runs[step]) ids that `step` runs, now marked as run: the root at step 0, then the
        best nodes not yet run."""
        if step == 0:
            self.table[:, 0, OPEN].fill_(-torch.inf)
            return self._root_ids
        frontier = self.table[:, :self.plan.before[step], OPEN]
        ids = torch.topk(frontier, self.plan.runs[step], dim=1).indices
        frontier.scatter_(1, ids, -torch.inf)
        return ids

    def rows(self, ids: Tensor) -> Tensor:
        """The table rows (B, n, FIELDS) of nodes ids (B, n)."""
        return self.table.gather(1, ids[..., None].expand(*ids.shape, FIELDS))

    def children(self, logits: Tensor, ids: Tensor, uniforms: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The children of the nodes `ids` (B, runs) the draft just ran, from its logits there
        (B, runs, V), already divided by the temperature: their tokens (B, runs, branch) and draft
        log-probabilities (float32). Greedy: the top-`branch` tokens, best first. Sample, without
        replacement (Sequoia §3.2): the `branch` largest of log q(v) + G_v, G_v = -log(-log u_v) a
        Gumbel key per vocabulary entry from `uniforms` (B, runs, V); in that order they are
        distributed as `branch` draws one after another, each from q without the earlier ones
        (`pyspec_ref.sampling.gumbel_top_k`). Sample, with replacement (SpecInfer): `branch`
        independent draws by inverse CDF with `uniforms` (B, runs, branch), in draw order. The
        distribution q is kept for the verification."""
        logq = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        if self.mode == "greedy":
            logp, tokens = torch.topk(logq, self.plan.branch, dim=-1)
            return tokens, logp
        q = logq.exp()
        self.q.scatter_(1, ids[..., None].expand(*ids.shape, q.shape[-1]), q)
        if not self.replacement:
            tokens = gumbel_top_k(logq, uniforms, self.plan.branch)
            return tokens, logq.gather(-1, tokens)
        cdf = torch.cumsum(q, dim=-1, dtype=torch.float64)
        tokens = torch.searchsorted(cdf, uniforms * cdf[..., -1:], right=True).clamp_(max=q.shape[-1] - 1)
        return tokens, logq.gather(-1, tokens)

    def add_children(self, step: int, parents: Tensor, tokens: Tensor, logp: Tensor) -> Tensor:
        """Write the children of `step`'s run nodes (table rows `parents`, (B, runs, FIELDS)) into
        their fixed ids: depth, interval, cumulative log-probability, key and rank. Returns their rows
        (B, runs * branch, FIELDS). (`course.capstone.kernels.add_children_kernel` does the same.)"""
        batch, runs = parents.shape[:2]
        first, stop = self.plan.block(step)
        shape = (batch, runs, self.plan.branch)
        span = self.spans[parents[..., DEPTH].long() + 1][..., None]  # the children's interval length
        start = torch.addcmul(parents[..., START, None] + 1, self._k, span)
        depth = (parents[..., DEPTH] + 1)[..., None].expand(shape)
        cum = parents[..., CUM, None] + logp
        prior = parents[..., PRIOR, None] + self.bias[parents[..., DEPTH].long()]  # row: the parent's depth
        key = prior + {"cum": cum, "parent": parents[..., CUM, None].expand(shape), "static": 0.0}[self.key]
        rank = key - EPS * (depth * self.plan.size + self._child_ids[step])
        children = torch.stack([self._child_ids[step].expand(shape), parents[..., ID, None].expand(shape),
                                tokens.to(torch.float64), depth, start, start + (span - 1), cum, rank, rank,
                                prior], dim=-1).view(batch, runs * self.plan.branch, FIELDS)
        self.table[:, first:stop].copy_(children)
        return children

    def choose(self, size: int, local: Tensor) -> Chosen:
        """The `size` best nodes (a subtree containing the root), ascending ids: what the target
        verifies. local: a (B, plan.size) int64 scratch tensor for the id -> position map."""
        ids = torch.topk(self.table[:, :, RANK], size, dim=1).indices.sort(dim=1).values
        rows = self.rows(ids)
        local.scatter_(1, ids, torch.arange(size, device=ids.device).expand(ids.shape))
        parent = rows[..., PARENT].long()
        parents = torch.where(parent < 0, -1, local.gather(1, parent.clamp(min=0)))
        return Chosen(ids, rows, parents)

    # ------------------------------------------------------------------ reading (tests, pictures)

    def snapshot(self, sample: int) -> dict:
        """Sample `sample`'s tree as lists: parents and tokens by id, and which nodes the draft ran
        (waits for the GPU: for pictures and tests, not for the decoding loop)."""
        rows = self.table[sample].cpu()
        return {"parents": rows[:, PARENT].long().tolist(), "tokens": rows[:, TOKEN].long().tolist(),
                "run": (rows[:, OPEN] == -torch.inf).tolist()}
