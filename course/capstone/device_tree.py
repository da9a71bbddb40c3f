"""The parallel draft's tree on the device (SwiftSpec §3.1-3.2): `host_tree.HostTree`'s rules, kept
in fixed-shape tables so that growth, selection and re-rooting are kernels the GPU runs without the
host (`course.capstone.device_side` captures each as a CUDA graph).

`HostTree` holds nodes (tokens the draft has run) and a queue of candidates (their children, not
yet run). Here both are ROWS of one table, in creation order: a run row is a node, an unrun row a
candidate. Creation order is the queue's push order, and re-rooting keeps the survivors' relative
order, so a row's index breaks the ties that the queue's counter breaks there. Each run row also
holds a SLOT, the order in which it was run (HostTree's node id): the draft's KV cache keeps a run
row's keys and values at cache row P + slot, so only nodes take cache rows, as on the host.

* Growth (`pop`): the `width` best unrun rows by key (growth "likely": a row sent to the target as
  a leaf ranks by its key plus the log of its parent's top draft probability), ties by row.
* Selection (`select`): the `size` best rows by (key, depth, nodes before candidates, slot or row),
  the root first: stable sorts on the device, no loop. The message lists nodes by slot, then
  candidates by key and row, HostTree's order, so that both send the same subtree in the same order.
* Ancestry: the attention needs nested intervals (FlashSpecInfer §5.1): each row keeps its DFS
  times (`start`, `end`, children in row order). They are kept up to date, never recomputed: a
  node's new children are its last, so they go right after its subtree, and every row after that
  place moves right by the number inserted before it (`add_children`); a re-root keeps one subtree,
  whose times only shift down to start at 0. A tree of any depth and shape, with no walk.
* Re-rooting (`reroot`): the accepted path's nodes join the prefix, the subtree of the next token
  (when the draft ran that child) survives with its KV rows, which move left in slot order (every
  move has dst <= src, as `swiftspec.compact` requires); keys and cumulative log-probabilities
  become relative to the new root. When the path ends at a candidate the draft never ran, its KV is
  OWED: the next root pass runs it together with the new root, as HostTree's `adopt` does.

Every method that changes the tree reads and writes only device tensors and never waits for the
host, so a GPU replays it as a graph; the host keeps a mirror of the counts it needs to choose the
next pass (`DeviceDraftSide`), which depend only on the pass widths, except after a re-root (one read).
Row `rows` (the last) is a trash row that no live index reaches: scatters of padding land there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import device_tree_kernels
from .device_tree_kernels import DEAD_END, DEAD_START
from .tree import MODES, gumbel_top_k, top_children


@dataclass
class Queries:
    """One pass's queries, in static buffers: the rows popped (width,), then per query (the owed
    token first, when there is one) its token, position and cache row (int64)."""

    rows: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    cache_rows: torch.Tensor

    @classmethod
    def empty(cls, width: int, owed: bool, device) -> Queries:
        n = width + owed
        return cls(*(torch.zeros(size, dtype=torch.int64, device=device) for size in (width, n, n, n)))


class DeviceTree:
    """One sample's draft tree in device tables of `rows` rows and `slots` node slots (see the module
    docstring); q (sample mode): the draft's distribution at each node, by slot."""

    def __init__(self, rows: int, slots: int, branch: int, mode: str, vocab_size: int, device, *,
                 kernels: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.rows, self.slots, self.branch, self.mode = rows, slots, branch, mode
        self.kernels = kernels  # the bookkeeping as Triton kernels (`device_tree_kernels`), else PyTorch ops
        n = rows + 1
        i64 = dict(dtype=torch.int64, device=device)
        self.parent = torch.full((n,), -1, **i64)
        self.token = torch.zeros(n, **i64)
        self.depth = torch.zeros(n, **i64)
        self.cum = torch.zeros(n, dtype=torch.float64, device=device)
        self.key = torch.full((n,), -torch.inf, dtype=torch.float64, device=device)
        self.top = torch.zeros(n, dtype=torch.float64, device=device)
        self.run = torch.zeros(n, dtype=torch.bool, device=device)
        self.sent = torch.zeros(n, dtype=torch.bool, device=device)
        self.slot = torch.full((n,), -1, **i64)
        self.start = torch.zeros(n, **i64)  # DFS times: row j is an ancestor of row i (or i) iff
        self.end = torch.zeros(n, **i64)  # start[j] <= start[i] and end[i] <= end[j]
        self.q = (torch.zeros((slots + 1, vocab_size), dtype=torch.float32, device=device)
                  if mode == "sample" else None)
        self.count = torch.zeros(1, **i64)  # live rows: 0 .. count - 1
        self.used = torch.zeros(1, **i64)  # slots taken: the nodes
        self.prefix = torch.zeros(1, **i64)  # committed tokens whose KV is cached (the owed one included)
        self.owed = torch.zeros(1, dtype=torch.bool, device=device)
        self.owed_token = torch.zeros(1, **i64)
        self.likely = torch.zeros(1, dtype=torch.float64, device=device)  # 1.0: growth "likely" now
        self.msg_rows = torch.zeros(rows, **i64)  # the rows of the last subtree sent, in message order
        self.message = torch.zeros(5 * slots, **i64)  # the last selection's packet (`packet`)
        self.q_source = torch.zeros(slots + 1, **i64)  # the kernels' re-root: each new slot's old one
        self.scratch = torch.zeros(n, **i64)  # the re-root kernel's working row
        self.info = torch.zeros(4, **i64)  # the re-root's counts for the host
        self.ids = torch.arange(n, **i64)
        self.slot_ids = torch.arange(slots + 1, **i64)

    # ------------------------------------------------------------------ state

    def live(self) -> torch.Tensor:
        return self.ids < self.count

    def reset(self, root_token: int, prefix: int) -> None:
        """A tree holding only its root, not yet run, after a prefix of `prefix` cached tokens."""
        self.parent.fill_(-1)
        self.token.zero_()
        self.depth.zero_()
        self.cum.zero_()
        self.key.fill_(-torch.inf)
        self.top.zero_()
        self.run.zero_()
        self.sent.zero_()
        self.slot.fill_(-1)
        self.start.zero_()
        self.end.zero_()
        self.token[0], self.key[0] = root_token, 0.0
        self.count.fill_(1)
        self.used.zero_()
        self.prefix.fill_(prefix)
        self.owed.zero_()

    # ------------------------------------------------------------------ growth

    def pop(self, width: int) -> torch.Tensor:
        """The `width` best unrun rows (the host knows there are that many), now nodes: their rows,
        in pop order, each given the next slot."""
        candidate = self.live() & ~self.run
        bonus = torch.where(self.sent, self.top[self.parent.clamp(min=0)], 0.0) * self.likely
        score = torch.where(candidate, -(self.key + bonus), torch.inf)
        rows = torch.sort(score, stable=True).indices[:width]
        self.run.index_fill_(0, rows, True)
        self.slot[rows] = self.used + self.slot_ids[:width]
        self.used += width
        return rows

    def pop_queries(self, width: int, owed: bool, queries: Queries, index, scratch_row: int) -> None:
        """`pop` and the pass's inputs: the queries (the owed token first, at row P - 1, seeing the
        prefix and no tree row) and the attention's index (`backends.TreeIndex`): the queries' DFS
        times, each node's DFS times at its cache row P + slot, every other row of the tree range
        invisible."""
        if self.kernels:
            return device_tree_kernels.pop(self, width, owed, queries, index)
        rows = self.pop(width)
        prefix = self.prefix
        tree_cols = prefix + self.slot_ids[:self.slots]
        index.kv_start[0].index_fill_(0, tree_cols, DEAD_START)
        index.kv_end[0].index_fill_(0, tree_cols, DEAD_END)
        cols = torch.where(self.run & self.live(), prefix + self.slot, scratch_row)
        index.kv_start[0].scatter_(0, cols, self.start.to(torch.int32))
        index.kv_end[0].scatter_(0, cols, self.end.to(torch.int32))
        first = int(owed)
        queries.rows.copy_(rows)
        queries.tokens[first:].copy_(self.token[rows])
        queries.positions[first:].copy_(prefix + self.depth[rows])
        queries.cache_rows[first:].copy_(prefix + self.slot[rows])
        index.q_start[0, first:].copy_(self.start[rows])
        index.q_end[0, first:].copy_(self.end[rows])
        if owed:
            queries.tokens[:1].copy_(self.owed_token)
            queries.positions[:1].copy_(prefix - 1)
            queries.cache_rows[:1].copy_(prefix - 1)
            index.q_start[0, :1].fill_(-1)
            index.q_end[0, :1].fill_(DEAD_START)
        index.prefix.copy_(prefix)
        index.tree_len.fill_(self.slots)

    def best_children(self, logq: torch.Tensor, uniforms: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each run row's candidate children from its log-probabilities logq (n, V) float32, for
        `add_children`: tokens, their log-probabilities and the row's largest. Greedy: the
        likeliest (`tree.top_children`); sampling (uniforms (n, V) float64): `branch` draws without
        replacement by Gumbel top-k (`tree.gumbel_top_k`), in draw order."""
        if self.kernels:
            return device_tree_kernels.best_children(logq, self.branch, uniforms)
        if uniforms is None:
            return top_children(logq, self.branch)
        tokens = gumbel_top_k(logq, uniforms, self.branch)
        return tokens, logq.gather(1, tokens), logq.max(dim=-1).values.double()

    def add_children(self, rows: torch.Tensor, tokens: torch.Tensor, logp: torch.Tensor, top: torch.Tensor,
                     q: torch.Tensor | None) -> None:
        """The run rows' candidate children (tokens, draft log-probabilities (n, branch), in the order
        they are to be tried) as new rows; top: the log of each run row's largest draft probability;
        q: its draft distribution (sample mode)."""
        branch = self.branch
        if q is not None:
            self.q[self.slot[rows]] = q
        if self.kernels:
            return device_tree_kernels.add_children(self, rows, tokens, logp, top)
        self.top[rows] = top
        self._make_room(rows)
        parent = rows[:, None].expand(rows.numel(), branch).reshape(-1)
        new = self.count + self.ids[:parent.numel()]
        cum = self.cum[parent] + logp.reshape(-1).double()
        self.parent[new] = parent
        self.token[new] = tokens.reshape(-1).long()
        self.depth[new] = self.depth[parent] + 1
        self.cum[new] = cum
        self.key[new] = cum if self.mode == "greedy" else self.cum[parent]
        self.top.index_fill_(0, new, 0.0)
        self.run.index_fill_(0, new, False)
        self.sent.index_fill_(0, new, False)
        self.slot.index_fill_(0, new, -1)
        self.count += parent.numel()

    def _make_room(self, rows: torch.Tensor) -> None:
        """DFS times for `branch` new last children of each of `rows`: each group goes right after its
        parent's subtree (after the groups of deeper nodes that end at the same place), and a row moves
        right by `branch` for every group placed before it (its start) or inside its subtree or before
        it (its end; a group of a strict ancestor ending where the row ends goes after it). Writes the
        new children's times at rows count .. count + n * branch - 1."""
        branch, live = self.branch, self.live()
        p_start, p_end, p_depth = self.start[rows], self.end[rows], self.depth[rows]
        start, end = self.start[:, None], self.end[:, None]
        before_start = (p_end[None, :] < start).sum(dim=1)
        inside_or_before = (p_end[None, :] <= end) & ((p_start[None, :] >= start) | (p_end[None, :] < start))
        first = (p_end[:, None] > p_end[None, :]) | ((p_end[:, None] == p_end[None, :])
                                                       & (p_depth[:, None] < p_depth[None, :]))
        child_start = (p_end + 1 + branch * first.sum(dim=1))[:, None] + self.ids[:branch]
        self.start.copy_(torch.where(live, self.start + branch * before_start, self.start))
        self.end.copy_(torch.where(live, self.end + branch * inside_or_before.sum(dim=1), self.end))
        new = self.count + self.ids[:rows.numel() * branch]
        self.start[new] = child_start.reshape(-1)
        self.end[new] = child_start.reshape(-1)

    # ------------------------------------------------------------------ the subtree sent

    def selection_order(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The live rows' place in the selection's order, as three terms compared in turn: the key
        (the root's +inf, larger first), the depth (shallower first), then nodes by slot before
        candidates by row (smaller first; unique, so the order is total)."""
        live = self.live()
        key = torch.where(self.ids == 0, torch.inf, self.key)[live]
        tie = torch.where(self.run, self.slot, self.rows + 1 + self.ids)[live]
        return key, self.depth[live], tie

    def ahead(self) -> torch.Tensor:
        """(live, live) bool: [i, j] is True when live row j is ahead of live row i in the order."""
        key, depth, tie = self.selection_order()
        k_i, d_i, t_i = key[:, None], depth[:, None], tie[:, None]
        return (key > k_i) | ((key == k_i) & ((depth < d_i) | ((depth == d_i) & (tie < t_i))))

    def ranks(self) -> torch.Tensor:
        """Each live row's rank in the selection's order: how many live rows are ahead of it (what
        `device_tree_kernels.rank_kernel` counts; the rows ranked below size are the subtree sent)."""
        return self.ahead().sum(dim=1)

    def packet(self, size: int) -> torch.Tensor:
        """The last `select(size)`'s subtree as the target's pass needs it, (5 * size,): parents over the
        subtree's indices, tokens, depths and DFS times (start, end; the tree's own, whose intervals
        nest as the subtree's do), in message order. When the tree held fewer than `size` rows, the
        rest is padding: parent -1, token 0, depth 0, the interval (DEAD_START, DEAD_END) that no
        query sees. What the queued rounds send instead of the message (`course.capstone.queued`)."""
        return self.message[:5 * size]

    def select(self, size: int) -> torch.Tensor:
        """The `size` best rows (a subtree holding the root), in message order; marks the candidates
        among them as sent. Returns [parents over the subtree's indices, tokens] (2 * size,), the
        first two parts of `packet(size)` (with its padding, when fewer than size rows are live)."""
        if self.kernels:
            return device_tree_kernels.select(self, size)
        run, ids = self.run, self.ids
        rank = torch.where(self.live(), torch.where(ids == 0, -torch.inf, -self.key), torch.inf)
        order = torch.sort(torch.where(run, self.slot, self.rows + 1 + ids), stable=True).indices
        order = order[torch.sort(self.depth[order], stable=True).indices]
        chosen = order[torch.sort(rank[order], stable=True).indices][:size].sort().values
        later = torch.where(run[chosen], self.slot[chosen].double(), -self.key[chosen])
        chosen = chosen[torch.sort(later, stable=True).indices]
        rows = chosen[torch.sort((~run[chosen]).to(torch.uint8), stable=True).indices]
        real = ids[:rows.numel()] < self.count  # past the live rows (ranked last): padding
        rows = torch.where(real, rows, self.rows)
        self.msg_rows[:rows.numel()].copy_(rows)
        local = torch.full_like(ids, -1)
        local[rows] = ids[:rows.numel()]
        parent = self.parent[rows]
        parents = torch.where(real & (parent >= 0), local[parent.clamp(min=0)], -1)
        self.sent.zero_()
        self.sent[rows] = ~run[rows] & real
        parts = [(parents, -1), (self.token[rows], 0), (self.depth[rows], 0), (self.start[rows], DEAD_START),
                 (self.end[rows], DEAD_END)]
        packet = torch.cat([torch.where(real, part, pad) for part, pad in parts])
        self.message[:packet.numel()].copy_(packet)
        return packet[:2 * rows.numel()]

    def sent_q(self, size: int) -> torch.Tensor:
        """The draft distributions of the `size` rows sent last (sample mode); a candidate's is never
        read: uniform."""
        rows = self.msg_rows[:size]
        uniform = torch.full_like(self.q[0], 1.0 / self.q.shape[1])
        return torch.where(self.run[rows][:, None], self.q[self.slot[rows].clamp(min=0)], uniform)

    # ------------------------------------------------------------------ after verification

    def reroot(self, path: torch.Tensor, k1: torch.Tensor, next_token: torch.Tensor, moves_out: torch.Tensor,
               compact) -> torch.Tensor:
        """SwiftSpec §3.2 after ACCEPTED(path, next_token): path (size,) indices into the last subtree
        sent, the first k1 valid. The KV moves go into moves_out (3, slots) int32 (src, dst, [count]),
        then compact() moves the rows. Returns [live rows, nodes, owed, kept a subtree] (4,) for the
        host's mirror."""
        if self.kernels:
            device_tree_kernels.reroot(self, path, k1, next_token, moves_out)
            compact()
            if self.q is not None:
                self.q.copy_(self.q[self.q_source])
            return self.info
        rows, ids = self.rows, self.ids
        valid = self.slot_ids[:path.numel()] < k1
        committed = torch.where(valid, self.msg_rows[path.clamp(min=0, max=rows - 1)], rows)
        last = committed.gather(0, k1 - 1)
        last_run, last_token = self.run[last], self.token[last]
        live = self.live()
        match = live & self.run & (self.parent == last) & (self.token == next_token) & last_run
        found = match.any()
        # (1,), not 0-dim: indexing with a 0-dim tensor would read it on the host
        new_root = torch.argmax(match.to(torch.int32)).reshape(1)
        root_start, root_end = self.start[new_root], self.end[new_root]
        keep = (self.start >= root_start) & (self.start <= root_end) & live & found  # the new root and below
        is_committed = torch.zeros_like(self.run)
        is_committed.index_fill_(0, committed, True)
        is_committed[rows:].fill_(False)
        # KV rows, in slot order: the committed nodes first (they were run before anything below them)
        kept_slot = torch.zeros(self.slots + 1, dtype=torch.bool, device=ids.device)
        kept = (is_committed | keep) & self.run & live
        kept_slot.index_fill_(0, torch.where(kept, self.slot, self.slots), True)
        kept_slot[self.slots:].fill_(False)
        new_slot = kept_slot.cumsum(0) - 1
        moves = kept_slot.sum().reshape(1)
        src = torch.full_like(self.slot_ids, self.slots)
        src[torch.where(kept_slot, new_slot, self.slots)] = self.slot_ids
        moves_out[0].copy_(self.prefix + src[:self.slots])
        moves_out[1].copy_(self.prefix + self.slot_ids[:self.slots])
        moves_out[2, :1].copy_(moves)
        compact()
        # The tables: the kept subtree's rows first, in their order; every other row dead
        new_row = torch.where(keep, keep.cumsum(0) - 1, -1)
        source = torch.full_like(ids, rows)
        source[torch.where(keep, new_row, rows)] = ids
        source[rows:].fill_(rows)
        self._gather(source, new_row, new_root, new_slot - k1, found, next_token)
        if self.q is not None:
            q_source = torch.full_like(self.slot_ids, self.slots)
            survivor = kept_slot & (new_slot >= k1)
            q_source[torch.where(survivor, new_slot - k1, self.slots)] = self.slot_ids
            self.q.copy_(self.q[q_source])
        count = torch.where(found, keep.sum(), 1).reshape(1)
        self.owed.copy_(~last_run)
        self.owed_token.copy_(last_token)
        self.used.copy_(torch.where(found, moves - k1, 0))
        self.count.copy_(count)
        self.prefix += k1
        self.sent.zero_()
        return torch.cat([count, self.used, self.owed.long(), found.long().reshape(1)])

    def _gather(self, source, new_row, new_root, new_slot, found, next_token) -> None:
        """The tables after a re-root: row r takes old row source[r] (see `reroot`), or, when no
        subtree survives, a fresh root holding next_token."""
        parent = self.parent[source]
        parent = torch.where(parent >= 0, new_row[parent.clamp(min=0)], -1)
        base_cum, base_depth = self.cum[new_root], self.depth[new_root]
        root = self.ids == 0
        fresh = dict(parent=torch.full_like(parent, -1), token=torch.where(root, next_token, 0),
                     depth=torch.zeros_like(parent), cum=torch.zeros_like(self.cum),
                     key=torch.where(root, 0.0, -torch.inf), top=torch.zeros_like(self.top),
                     run=torch.zeros_like(self.run), slot=torch.full_like(parent, -1))
        live = source < self.rows
        kept = dict(parent=parent, token=self.token[source], depth=self.depth[source] - base_depth,
                    cum=self.cum[source] - base_cum,
                    key=torch.where(root, 0.0, torch.where(live, self.key[source] - base_cum, -torch.inf)),
                    top=self.top[source], run=self.run[source] & live,
                    slot=torch.where(self.run[source] & live, new_slot[self.slot[source].clamp(min=0)], -1))
        base_start = self.start[new_root]  # the subtree's DFS times stay in order: they only shift
        kept.update(start=self.start[source] - base_start, end=self.end[source] - base_start)
        fresh.update(start=torch.zeros_like(parent), end=torch.zeros_like(parent))
        for name, value in kept.items():
            getattr(self, name).copy_(torch.where(found, value, fresh[name]))
