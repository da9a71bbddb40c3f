"""Triton kernels for the draft tree on the device (`device_tree.DeviceTree`): each of its
bookkeeping steps as one launch (the pop and the selection: two each) over the live rows of the
table.

The tree's methods written with PyTorch (`DeviceTree.pop`, `add_children`, `select`) are the
readable form, and the tests hold these kernels equal to them. They cost what they launch: a draft
pass written with PyTorch ops is about 250 small kernels around the model step, whose launches, a
microsecond each inside a CUDA graph, take longer than the model step itself (results/h200/README.md
has the profile). A table of a few hundred rows fits one program's registers, so each step here is
one kernel:

* `pop_rank_kernel` and `pop_kernel`: the `width` best candidates (ties to the lower row, as the
  queue's order), ranked by a grid of programs as the selection ranks its rows (below), become
  nodes; the second writes the pass's queries (tokens, positions, cache rows, DFS times) and every
  node's DFS times at its cache row, which is all the attention reads.
* `best_children_kernel`: each new node's `branch` candidates (greedy: the likeliest tokens,
  `tree.top_children`'s rule; sampling: Gumbel top-k draws) in one launch where PyTorch took three
  (greedy) or eight (sampling).
* `children_kernel`: the new nodes' candidate children, and the DFS times moved to make room: a
  chunk of rows against every new node at once.
* `rank_kernel` and `select_kernel`: the `size` best rows in message order, with the parents'
  indices in the message. Each row's rank in the selection's order is the number of live rows ahead
  of it, counted by a grid of programs at once (a tile of rows against every live row): no row
  waits for another, where picking the best row `size` times over is `size` dependent reductions in
  a row. The rows ranked below `size` are the subtree (a child's key is never above its parent's,
  and ties go to the shallower row, so the best rows hold every ancestor of each).

The table's capacity is set for the largest tree a side can hold, but most passes see a fraction of
it live, so the loops over rows stop at the live count (`RANK_CHUNK` rows a turn), and the programs
of a ranking whose tile lies past it return at once.

Inside a kernel, what is on the critical path is the chain of dependent steps, not the work: a
load whose address comes from another load waits for it, a trip to memory each. So the loads that
follow from a result (the popped rows' tokens and times, the accepted path's rows) are issued
together as one vector load, not one per loop iteration.

The counts (width, size, rows, slots) are run-time arguments, and only the power-of-two block
sizes are compile-time constants: a draft side captures a pass for every width from 1 to
tree_size, and with the width compiled in, each tree shape cost a hundred compilations of about a
second each before its first token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tree import TINY

DEAD_START, DEAD_END = 2 ** 31 - 1, -1  # an interval that contains no query: a row no query sees
_DEAD_START, _DEAD_END = tl.constexpr(DEAD_START), tl.constexpr(DEAD_END)
BIG = tl.constexpr(2 ** 62)  # above every row, slot, depth and DFS time
RANK_TILE = 8  # rows a program of a ranking (the growth's, the selection's) ranks against the others
RANK_CHUNK = 256  # rows a loop over the live rows takes at a time (the rankings, the children's move)


def _block(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 2))


def pop(tree, width: int, owed: bool, queries, index) -> None:
    """`DeviceTree.pop_queries` in two launches: each candidate's rank in the growth's order, then
    the `width` ranked first become nodes and the pass's queries."""
    block = _block(tree.rows + 1)
    pop_rank_kernel[(triton.cdiv(block, RANK_TILE),)](tree.key, tree.top, tree.run, tree.sent, tree.parent,
                                                      tree.likely, tree.count, tree.scratch, TILE=RANK_TILE,
                                                      CHUNK=RANK_CHUNK)
    pop_kernel[(1,)](tree.run, tree.slot, tree.token, tree.depth, tree.start, tree.end, tree.count,
                     tree.used, tree.prefix, tree.owed_token, tree.scratch, queries.rows, queries.tokens,
                     queries.positions, queries.cache_rows, index.q_start, index.q_end, index.kv_start,
                     index.kv_end, index.prefix, index.tree_len, tree.slots, width, OWED=bool(owed),
                     BLOCK=block, SLOT_BLOCK=_block(tree.slots), W_BLOCK=_block(width))


def add_children(tree, rows, tokens, logp, top) -> None:
    """`DeviceTree.add_children` (but q) in one launch."""
    width, branch = rows.numel(), tree.branch
    children_kernel[(1,)](tree.parent, tree.token, tree.depth, tree.cum, tree.key, tree.top, tree.run,
                          tree.sent, tree.slot, tree.start, tree.end, tree.count, rows, tokens.contiguous(),
                          logp.contiguous(), top.contiguous(), width, BRANCH=branch,
                          GREEDY=tree.mode == "greedy", CHUNK=RANK_CHUNK, W_BLOCK=_block(width),
                          B_BLOCK=_block(branch))


def best_children(logq, branch: int, uniforms=None):
    """In one launch, a program per row: greedy, `tree.top_children`; sampling (uniforms (n, V)
    float64 given), `tree.gumbel_top_k`'s draws with their log-probabilities and each row's largest:
    (tokens (n, branch) int64, their log-probabilities float32, each row's largest float64)."""
    n, vocab = logq.shape
    branch = min(branch, vocab)
    tokens = torch.empty((n, branch), dtype=torch.int64, device=logq.device)
    logp = torch.empty((n, branch), dtype=torch.float32, device=logq.device)
    top = torch.empty(n, dtype=torch.float64, device=logq.device)
    gumbel = uniforms is not None
    keys = uniforms.contiguous() if gumbel else logq  # greedy: not read
    best_children_kernel[(n,)](logq.contiguous(), keys, tokens, logp, top, vocab, TINY, BRANCH=branch,
                               GUMBEL=gumbel, V_BLOCK=_block(vocab), B_BLOCK=_block(branch))
    return tokens, logp, top


def select(tree, size: int):
    """`DeviceTree.select` in two launches (each row's rank, then the message); returns the message
    [parents, tokens] (2 * size,), the first two parts of `DeviceTree.packet(size)`."""
    out = tree.message[:5 * size]
    block = _block(tree.rows + 1)
    rank_kernel[(triton.cdiv(block, RANK_TILE),)](tree.key, tree.depth, tree.run, tree.slot, tree.count,
                                                  tree.scratch, tree.rows, TILE=RANK_TILE, CHUNK=RANK_CHUNK)
    select_kernel[(1,)](tree.parent, tree.token, tree.key, tree.run, tree.sent, tree.slot, tree.depth,
                        tree.start, tree.end, tree.count, tree.scratch, tree.msg_rows, out, tree.rows, size,
                        BLOCK=block, S_BLOCK=_block(size))
    return out[:2 * size]


@triton.jit
def _growth_order(key, top, run, sent, parent, likely, ids, live):
    """A row's score in the growth's order (growth "likely": a row sent as a leaf ranks by its key
    plus the log of its parent's top draft probability; else by its key), and whether it is a
    candidate (live, not run)."""
    is_run = tl.load(run + ids, mask=live, other=0) != 0
    up = tl.maximum(tl.load(parent + ids, mask=live, other=0), 0)
    is_sent = tl.load(sent + ids, mask=live, other=0) != 0
    bonus = tl.where(is_sent, tl.load(top + up, mask=live, other=0.0), 0.0) * tl.load(likely)
    return tl.load(key + ids, mask=live, other=0.0) + bonus, live & ~is_run


@triton.jit
def pop_rank_kernel(key, top, run, sent, parent, likely, count, rank, TILE: tl.constexpr,
                    CHUNK: tl.constexpr):
    # Each program ranks TILE rows against every live row, CHUNK at a time: a candidate's rank is the
    # number of candidates ahead of it (a higher score, or the same and a lower row: the queue's
    # order); any other row ranks BIG. Picking the best `width` one argmax at a time would be `width`
    # dependent reductions over the table in one program, the longest kernel of a pass; and the
    # loop stops at the live rows, a fraction of the table's capacity in most passes.
    n = tl.load(count)
    first = tl.program_id(0) * TILE
    if first < n:
        mine = first + tl.arange(0, TILE).to(tl.int64)
        s_i, c_i = _growth_order(key, top, run, sent, parent, likely, mine, mine < n)
        ahead = tl.zeros([TILE], dtype=tl.int64)
        for base in range(0, n, CHUNK):
            every = base + tl.arange(0, CHUNK).to(tl.int64)
            s_j, c_j = _growth_order(key, top, run, sent, parent, likely, every, every < n)
            is_ahead = c_j[None, :] & ((s_j[None, :] > s_i[:, None])
                                       | ((s_j[None, :] == s_i[:, None]) & (every[None, :] < mine[:, None])))
            ahead += tl.sum(is_ahead.to(tl.int64), axis=1)
        tl.store(rank + mine, tl.where(c_i, ahead, BIG), mask=mine < n)


@triton.jit(do_not_specialize=["n_slots", "width"])
def pop_kernel(run, slot, token, depth, start, end, count, used, prefix, owed_token, rank, q_rows, q_tokens,
               q_positions, q_cache_rows, q_start, q_end, kv_start, kv_end, index_prefix, index_tree_len,
               n_slots, width, OWED: tl.constexpr, BLOCK: tl.constexpr, SLOT_BLOCK: tl.constexpr,
               W_BLOCK: tl.constexpr):
    ids = tl.arange(0, BLOCK)
    n = tl.load(count)
    live = ids < n
    is_run = tl.load(run + ids, mask=live, other=0) != 0
    slots = tl.load(slot + ids, mask=live, other=-1)
    first = tl.load(used)
    P = tl.load(prefix)
    w = tl.arange(0, W_BLOCK)
    # The candidates ranked 0 .. width - 1 (`pop_rank_kernel`), in rank order, through q_rows.
    row_rank = tl.load(rank + ids, mask=live, other=BIG)
    chosen = live & (row_rank < width)
    tl.store(q_rows + row_rank, ids.to(tl.int64), mask=chosen)
    tl.debug_barrier()
    picked = tl.load(q_rows + w, mask=w < width, other=0)
    is_run = is_run | chosen
    slots = tl.where(chosen, first + row_rank, slots)
    real = w < width
    tl.store(q_tokens + OWED + w, tl.load(token + picked, mask=real, other=0), mask=real)
    tl.store(q_positions + OWED + w, P + tl.load(depth + picked, mask=real, other=0), mask=real)
    tl.store(q_cache_rows + OWED + w, P + first + w, mask=real)
    tl.store(q_start + OWED + w, tl.load(start + picked, mask=real, other=0).to(tl.int32), mask=real)
    tl.store(q_end + OWED + w, tl.load(end + picked, mask=real, other=0).to(tl.int32), mask=real)
    if OWED:  # the committed token at row P - 1: it sees the prefix and no tree row
        tl.store(q_tokens, tl.load(owed_token))
        tl.store(q_positions, P - 1)
        tl.store(q_cache_rows, P - 1)
        tl.store(q_start, -1)
        tl.store(q_end, _DEAD_START)
    tl.store(run + ids, is_run.to(tl.int1), mask=live)
    tl.store(slot + ids, slots, mask=live)
    tl.store(used, first + width)
    # Every cache row of the tree range invisible, then each node's DFS times at its slot's row.
    s = tl.arange(0, SLOT_BLOCK)
    tl.store(kv_start + P + s, _DEAD_START, mask=s < n_slots)
    tl.store(kv_end + P + s, _DEAD_END, mask=s < n_slots)
    tl.debug_barrier()
    node = live & is_run
    tl.store(kv_start + P + slots, tl.load(start + ids, mask=node, other=0).to(tl.int32), mask=node)
    tl.store(kv_end + P + slots, tl.load(end + ids, mask=node, other=0).to(tl.int32), mask=node)
    tl.store(index_prefix, P.to(tl.int32))
    tl.store(index_tree_len, n_slots)


@triton.jit(do_not_specialize=["width"])
def children_kernel(parent, token, depth, cum, key, top, run, sent, slot, start, end, count, q_rows, picks,
                    logp, q_top, width, BRANCH: tl.constexpr, GREEDY: tl.constexpr, CHUNK: tl.constexpr,
                    W_BLOCK: tl.constexpr, B_BLOCK: tl.constexpr):
    n = tl.load(count)
    w = tl.arange(0, W_BLOCK)
    real = w < width
    rows = tl.load(q_rows + w, mask=real, other=0)
    p_end = tl.load(end + rows, mask=real, other=BIG)
    p_depth = tl.load(depth + rows, mask=real, other=0)
    p_cum = tl.load(cum + rows, mask=real, other=0.0)
    # A row moves right by BRANCH for each group placed before it (its start), or inside its subtree
    # or before it (its end); a group goes right after its parent's subtree.
    p_start = tl.load(start + rows, mask=real, other=BIG)
    # Groups ending at the same place: the deeper node's group first.
    ahead = ((p_end[None, :] < p_end[:, None]) | ((p_end[None, :] == p_end[:, None])
                                                  & (p_depth[None, :] > p_depth[:, None]))) & real[None, :]
    group_start = p_end + 1 + BRANCH * tl.sum(ahead.to(tl.int64), axis=1)
    tl.debug_barrier()  # every read of the nodes' old times is done: now move the rows'
    # CHUNK live rows at a time against every node at once ([row, node] tables of CHUNK x W_BLOCK): a
    # row's new times depend only on its own old ones and the nodes', so each chunk is read, moved
    # and written before the next, with no chain of dependent loads as a loop over nodes has.
    for base in range(0, n, CHUNK):
        ids = base + tl.arange(0, CHUNK)
        live = ids < n
        row_start = tl.load(start + ids, mask=live, other=0)[:, None]
        row_end = tl.load(end + ids, mask=live, other=0)[:, None]
        e_j, s_j = p_end[None, :], p_start[None, :]
        before_start = tl.sum(((e_j < row_start) & real[None, :]).to(tl.int64), axis=1)
        inside_or_before = tl.sum(((e_j <= row_end) & ((s_j >= row_start) | (e_j < row_start))
                                   & real[None, :]).to(tl.int64), axis=1)
        tl.debug_barrier()  # the chunk's old times are all read
        tl.store(start + ids, tl.reshape(row_start, [CHUNK]) + BRANCH * before_start, mask=live)
        tl.store(end + ids, tl.reshape(row_end, [CHUNK]) + BRANCH * inside_or_before, mask=live)
    tl.store(top + rows, tl.load(q_top + w, mask=real, other=0.0), mask=real)
    k = tl.arange(0, B_BLOCK)
    both = real[:, None] & (k < BRANCH)[None, :]
    new = n + w[:, None] * BRANCH + k[None, :]
    lp = tl.load(logp + w[:, None] * BRANCH + k[None, :], mask=both, other=0.0).to(tl.float64)
    c = p_cum[:, None] + lp
    tl.store(parent + new, rows[:, None] + 0 * k[None, :], mask=both)
    tl.store(token + new, tl.load(picks + w[:, None] * BRANCH + k[None, :], mask=both, other=0), mask=both)
    tl.store(depth + new, p_depth[:, None] + 1 + 0 * k[None, :], mask=both)
    tl.store(cum + new, c, mask=both)
    if GREEDY:
        tl.store(key + new, c, mask=both)
    else:
        tl.store(key + new, p_cum[:, None] + 0.0 * lp, mask=both)
    tl.store(top + new, 0.0 * lp, mask=both)
    tl.store(run + new, (0 * new).to(tl.int1), mask=both)
    tl.store(sent + new, (0 * new).to(tl.int1), mask=both)
    tl.store(slot + new, 0 * new - 1, mask=both)
    times = group_start[:, None] + k[None, :]
    tl.store(start + new, times, mask=both)
    tl.store(end + new, times, mask=both)
    tl.store(count, n + width * BRANCH)


@triton.jit(do_not_specialize=["vocab"])
def best_children_kernel(logq, uniforms, tokens, logp, top, vocab, tiny, BRANCH: tl.constexpr,
                         GUMBEL: tl.constexpr, V_BLOCK: tl.constexpr, B_BLOCK: tl.constexpr):
    # One row: BRANCH argmaxes over its V keys, in registers, each taking the lowest token id among
    # equals (as a stable sort does). Greedy, the keys are the log-probabilities; sampling, the
    # log-probabilities plus a Gumbel key each (float64, as `tree.gumbel_top_k` adds them). Where
    # torch.topk and its sort took two kernels, a max a third, and the Gumbel keys and the gather of
    # the picks' log-probabilities five more, this is one short launch.
    row = tl.program_id(0).to(tl.int64)
    v = tl.arange(0, V_BLOCK)
    x = tl.load(logq + row * vocab + v, mask=v < vocab, other=float("-inf"))
    if GUMBEL:
        u = tl.maximum(tl.load(uniforms + row * vocab + v, mask=v < vocab, other=0.5), tiny)
        keys = x.to(tl.float64) - tl.log(-tl.log(u))
    else:
        keys = x
    k = tl.arange(0, B_BLOCK)
    picked = tl.zeros([B_BLOCK], dtype=tl.int64)
    values = tl.zeros([B_BLOCK], dtype=tl.float32)
    for b in tl.static_range(BRANCH):
        best = tl.argmax(keys, axis=0, tie_break_left=True)
        picked = tl.where(k == b, best, picked)
        values = tl.where(k == b, tl.sum(tl.where(v == best, x, 0.0), axis=0), values)
        keys = tl.where(v == best, float("-inf"), keys)
    tl.store(tokens + row * BRANCH + k, picked, mask=k < BRANCH)
    tl.store(logp + row * BRANCH + k, values, mask=k < BRANCH)
    tl.store(top + row, tl.max(x, axis=0).to(tl.float64))


@triton.jit
def _selection_order(key, depth, run, slot, ids, live, rows):
    """A row's place in the selection's order, as three terms compared in turn: its key (the root
    above all, largest first), its depth (shallowest first), then nodes by slot before candidates
    by row (smallest first; unique, so the order is total)."""
    row_key = tl.where(ids == 0, float("inf"), tl.load(key + ids, mask=live, other=0.0))
    row_depth = tl.load(depth + ids, mask=live, other=0)
    is_run = tl.load(run + ids, mask=live, other=0) != 0
    tie = tl.where(is_run, tl.load(slot + ids, mask=live, other=0), rows + 1 + ids)
    return row_key, row_depth, tie


@triton.jit(do_not_specialize=["rows"])
def rank_kernel(key, depth, run, slot, count, rank, rows, TILE: tl.constexpr, CHUNK: tl.constexpr):
    # Each program ranks TILE rows against every live row, CHUNK at a time: rank = the rows ahead of it.
    n = tl.load(count)
    first = tl.program_id(0) * TILE
    if first < n:
        mine = first + tl.arange(0, TILE).to(tl.int64)
        k_i, d_i, t_i = _selection_order(key, depth, run, slot, mine, mine < n, rows)
        k_i, d_i, t_i = k_i[:, None], d_i[:, None], t_i[:, None]
        ahead = tl.zeros([TILE], dtype=tl.int64)
        for base in range(0, n, CHUNK):
            every = base + tl.arange(0, CHUNK).to(tl.int64)
            every_live = every < n
            k_j, d_j, t_j = _selection_order(key, depth, run, slot, every, every_live, rows)
            k_j, d_j, t_j = k_j[None, :], d_j[None, :], t_j[None, :]
            is_ahead = (k_j > k_i) | ((k_j == k_i) & ((d_j < d_i) | ((d_j == d_i) & (t_j < t_i))))
            ahead += tl.sum((is_ahead & every_live[None, :]).to(tl.int64), axis=1)
        tl.store(rank + mine, ahead, mask=mine < n)


@triton.jit(do_not_specialize=["rows", "size"])
def select_kernel(parent, token, key, run, sent, slot, depth, start, end, count, rank, msg_rows, out, rows,
                  size, BLOCK: tl.constexpr, S_BLOCK: tl.constexpr):
    ids = tl.arange(0, BLOCK).to(tl.int64)
    n = tl.load(count)
    live = ids < n
    s = tl.arange(0, S_BLOCK)
    real = s < tl.minimum(size, n)  # fewer live rows than size: the rest of the message is padding
    pad = (s < size) & ~real
    # The rows ranked 0 .. size - 1, by rank (past the live rows, as in a graph capture's warm-up on a
    # one-row tree: the trash row); msg_rows is the scratch here, and the message's rows at the end.
    row_rank = tl.load(rank + ids, mask=live, other=BIG)
    tl.store(msg_rows + s, rows + 0 * s, mask=real)
    tl.debug_barrier()
    tl.store(msg_rows + row_rank, ids, mask=live & (row_rank < size))
    tl.debug_barrier()
    chosen = tl.load(msg_rows + s, mask=real, other=0)
    tl.debug_barrier()
    c_run = tl.load(run + chosen, mask=real, other=0) != 0
    c_slot = tl.load(slot + chosen, mask=real, other=0)
    c_key = tl.load(key + chosen, mask=real, other=0.0)
    # Message order: nodes by slot, then candidates by key (largest first) and row.
    a_run, b_run = c_run[None, :], c_run[:, None]  # [i, j]: a is j, b is i
    a_slot, b_slot = c_slot[None, :], c_slot[:, None]
    a_key, b_key = c_key[None, :], c_key[:, None]
    a_row, b_row = chosen[None, :], chosen[:, None]
    ahead = ((a_run & ~b_run) | (a_run & b_run & (a_slot < b_slot))
             | (~a_run & ~b_run & ((a_key > b_key) | ((a_key == b_key) & (a_row < b_row))))) & real[None, :]
    place = tl.sum(ahead.to(tl.int64), axis=1)
    c_parent = tl.load(parent + chosen, mask=real, other=-1)
    is_parent = (a_row == c_parent[:, None]) & real[None, :]
    parent_place = tl.where(tl.sum(is_parent.to(tl.int64), axis=1) > 0,
                            tl.sum(tl.where(is_parent, place[None, :], 0), axis=1), -1)
    tl.store(msg_rows + place, chosen, mask=real)
    tl.store(out + place, parent_place, mask=real)
    tl.store(out + size + place, tl.load(token + chosen, mask=real, other=0), mask=real)
    tl.store(out + 2 * size + place, tl.load(depth + chosen, mask=real, other=0), mask=real)
    tl.store(out + 3 * size + place, tl.load(start + chosen, mask=real, other=0), mask=real)
    tl.store(out + 4 * size + place, tl.load(end + chosen, mask=real, other=0), mask=real)
    # Padding (`DeviceTree.packet`): no parent, token 0, an interval no query sees.
    zeros = tl.zeros([S_BLOCK], dtype=tl.int64)
    tl.store(out + s, zeros - 1, mask=pad)
    tl.store(out + size + s, zeros, mask=pad)
    tl.store(out + 2 * size + s, zeros, mask=pad)
    tl.store(out + 3 * size + s, tl.full([S_BLOCK], _DEAD_START, tl.int64), mask=pad)
    tl.store(out + 4 * size + s, tl.full([S_BLOCK], _DEAD_END, tl.int64), mask=pad)
    tl.store(sent + ids, (0 * ids).to(tl.int1), mask=live)
    tl.debug_barrier()
    tl.store(sent + chosen, ~c_run, mask=real)


def reroot(tree, path, k1, next_token, moves) -> None:
    """`DeviceTree.reroot`'s tables, KV moves (into moves (3, slots) int32: src, dst, [count]) and
    q_source, in one launch."""
    reroot_kernel[(1,)](tree.parent, tree.token, tree.depth, tree.cum, tree.key, tree.top, tree.run,
                        tree.sent, tree.slot, tree.start, tree.end, tree.count, tree.used, tree.prefix,
                        tree.owed, tree.owed_token, tree.msg_rows, path, k1, next_token, moves, tree.q_source,
                        tree.scratch, tree.info, tree.rows, tree.slots, path.numel(),
                        BLOCK=_block(tree.rows + 1), SLOT_BLOCK=_block(tree.slots + 1),
                        PATH_BLOCK=_block(path.numel()))


@triton.jit(do_not_specialize=["rows", "slots", "size"])
def reroot_kernel(parent, token, depth, cum, key, top, run, sent, slot, start, end, count, used, prefix, owed,
                  owed_token, msg_rows, path, reply_k1, reply_next, moves, q_source, scratch, info, rows,
                  slots, size, BLOCK: tl.constexpr, SLOT_BLOCK: tl.constexpr, PATH_BLOCK: tl.constexpr):
    ids = tl.arange(0, BLOCK).to(tl.int64)
    n = tl.load(count)
    live = ids < n
    k1 = tl.load(reply_k1)
    next_token = tl.load(reply_next)
    P = tl.load(prefix)
    # The accepted path's rows, flagged in the scratch vector; the last of them
    steps = tl.arange(0, PATH_BLOCK)
    on_path = (steps < k1) & (steps < size)
    path_rows = tl.load(msg_rows + tl.load(path + steps, mask=on_path, other=0), mask=on_path, other=0)
    last = tl.load(msg_rows + tl.load(path + tl.minimum(tl.maximum(k1, 1), size) - 1))
    tl.store(scratch + ids, 0 * ids, mask=ids <= rows)
    tl.debug_barrier()
    tl.store(scratch + path_rows, 1 + 0 * path_rows, mask=on_path)
    tl.debug_barrier()
    committed = tl.load(scratch + ids, mask=ids <= rows, other=0) != 0
    tl.debug_barrier()
    last_run = tl.load(run + last) != 0
    last_token = tl.load(token + last)
    f_parent = tl.load(parent + ids, mask=live, other=-1)
    f_token = tl.load(token + ids, mask=live, other=0)
    f_depth = tl.load(depth + ids, mask=live, other=0)
    f_cum = tl.load(cum + ids, mask=live, other=0.0)
    f_key = tl.load(key + ids, mask=live, other=0.0)
    f_top = tl.load(top + ids, mask=live, other=0.0)
    f_run = tl.load(run + ids, mask=live, other=0) != 0
    f_slot = tl.load(slot + ids, mask=live, other=0)
    f_start = tl.load(start + ids, mask=live, other=0)
    f_end = tl.load(end + ids, mask=live, other=0)
    # the child of the last node holding the next token, if the draft ran it: the new root
    match = live & f_run & (f_parent == last) & (f_token == next_token) & last_run
    found = tl.max(match.to(tl.int32), axis=0) > 0
    root = tl.argmax(match.to(tl.int32), axis=0).to(tl.int64)
    root_start = tl.load(start + root)
    root_end = tl.load(end + root)
    base_cum = tl.load(cum + root)
    base_depth = tl.load(depth + root)
    keep = live & found & (f_start >= root_start) & (f_start <= root_end)
    kept_node = (committed | keep) & f_run & live
    # KV rows of the kept nodes, in slot order (the committed ones first): a flag per slot, its prefix sum
    s = tl.arange(0, SLOT_BLOCK).to(tl.int64)
    in_slots = s < slots
    tl.store(scratch + s, 0 * s, mask=s <= slots)
    tl.store(q_source + s, 0 * s + slots, mask=s <= slots)
    tl.debug_barrier()
    tl.store(scratch + f_slot, 1 + 0 * f_slot, mask=kept_node)
    tl.debug_barrier()
    flag = tl.load(scratch + s, mask=in_slots, other=0)
    new_slot = tl.cumsum(flag, axis=0) - 1
    n_moves = tl.sum(flag, axis=0)
    tl.store(moves + new_slot, (P + s).to(tl.int32), mask=(flag != 0) & in_slots)
    tl.store(moves + slots + s, (P + s).to(tl.int32), mask=in_slots)
    tl.store(moves + 2 * slots, n_moves.to(tl.int32))
    tl.store(q_source + new_slot - k1, s, mask=(flag != 0) & (new_slot >= k1) & in_slots)
    tl.debug_barrier()
    tl.store(scratch + s, new_slot, mask=in_slots)
    tl.debug_barrier()
    row_slot = tl.load(scratch + f_slot, mask=keep & f_run, other=0) - k1
    tl.debug_barrier()
    new_row = tl.cumsum(keep.to(tl.int64), axis=0) - 1
    tl.store(scratch + ids, tl.where(keep, new_row, -1), mask=ids <= rows)
    tl.debug_barrier()
    up = tl.load(scratch + tl.maximum(f_parent, 0), mask=keep, other=-1)
    tl.debug_barrier()  # every read of the old tables is done: write the kept subtree from row 0
    tl.store(parent + new_row, tl.where(f_parent >= 0, up, -1), mask=keep)
    tl.store(token + new_row, f_token, mask=keep)
    tl.store(depth + new_row, f_depth - base_depth, mask=keep)
    tl.store(cum + new_row, f_cum - base_cum, mask=keep)
    tl.store(key + new_row, tl.where(ids == root, 0.0, f_key - base_cum), mask=keep)
    tl.store(top + new_row, f_top, mask=keep)
    tl.store(run + new_row, f_run, mask=keep)
    tl.store(sent + new_row, f_run & False, mask=keep)
    tl.store(slot + new_row, tl.where(f_run, row_slot, -1), mask=keep)
    tl.store(start + new_row, f_start - root_start, mask=keep)
    tl.store(end + new_row, f_end - root_start, mask=keep)
    fresh = ~found  # no subtree survives: a root holding the next token, not yet run
    tl.store(parent, -1, mask=fresh)
    tl.store(token, next_token, mask=fresh)
    tl.store(depth, 0, mask=fresh)
    tl.store(cum, 0.0, mask=fresh)
    tl.store(key, 0.0, mask=fresh)
    tl.store(top, 0.0, mask=fresh)
    tl.store(run, last_run & False, mask=fresh)
    tl.store(sent, last_run & False, mask=fresh)
    tl.store(slot, -1, mask=fresh)
    tl.store(start, 0, mask=fresh)
    tl.store(end, 0, mask=fresh)
    new_count = tl.where(found, tl.sum(keep.to(tl.int64), axis=0), 1)
    new_used = tl.where(found, n_moves - k1, 0)
    tl.store(count, new_count)
    tl.store(used, new_used)
    tl.store(owed, ~last_run)
    tl.store(owed_token, last_token)
    tl.store(prefix, P + k1)
    tl.store(info, new_count)
    tl.store(info + 1, new_used)
    tl.store(info + 2, (~last_run).to(tl.int64))
    tl.store(info + 3, found.to(tl.int64))
