"""The decoder's bookkeeping as a few Triton kernels: one per phase instead of dozens of tiny ones.

A round's bookkeeping (which nodes the draft runs next, where their children go, which nodes the
target verifies, what the accepted path moves and emits) is a few hundred numbers per sample, but
written with torch operations it is 20 to 80 kernels per phase, each a few microseconds of launch
and ramp for nanoseconds of work: as long as a one-layer draft pass. Each kernel here does one
phase's bookkeeping for one sample per program, reading and writing the same buffers as the torch
statement of it in `course.capstone.bookkeeping.TorchBookkeeping`, and giving the same results (the
tests compare them): the draws and top-k picks themselves stay in torch, so that both statements
take identical numbers; what is fused is integer and float64-addition arithmetic, which is exact.

Flags (finished, lag) are torch.bool tensors (Triton reads them as u1; loads are compared with 0).
Every kernel loads all it needs before its first store, with a barrier between, so that no thread
of a program overwrites what another thread has still to read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from course.core import interpreter

from . import tree
from .tree import EPS, FIELDS

# The table's columns, as Triton's compiler accepts a module's globals: constexpr only (the interpreter
# also takes plain ints, so only a GPU compile would notice).
CUM, DEPTH, END, ID, OPEN, PARENT, PRIOR, RANK, START, TOKEN = (
    tl.constexpr(getattr(tree, name)) for name in ("CUM", "DEPTH", "END", "ID", "OPEN", "PARENT", "PRIOR",
                                                    "RANK", "START", "TOKEN"))


@triton.jit
def draft_inputs_kernel(table, prefix, lag, lag_token, root, tokens, positions, rows, q_start, q_end, ids,
                        scratch_row, BEFORE, SIZE, RUNS, WIDTH, FIRST: tl.constexpr, FIELDS_: tl.constexpr,
                        BLOCK: tl.constexpr):
    """One program per sample: the queries of one draft step. FIRST: slot 0 the lag token (the last
    accepted node, if the draft has not run it; else a padding slot writing the scratch row), slot 1
    the root. Otherwise the RUNS best nodes not yet run (largest OPEN), marked as run."""
    b = tl.program_id(0)
    here = tl.load(prefix + b)
    base = table + b * SIZE * FIELDS_
    if FIRST:
        has_lag = tl.load(lag + b) != 0
        lag_tok = tl.load(lag_token + b)
        root_tok = tl.load(root + b)
        tl.debug_barrier()
        tl.store(tokens + b * WIDTH, lag_tok)
        tl.store(positions + b * WIDTH, tl.maximum(here - 1, 0))
        tl.store(rows + b * WIDTH, tl.where(has_lag, here - 1, scratch_row))
        tl.store(tokens + b * WIDTH + 1, root_tok)
        tl.store(positions + b * WIDTH + 1, here)
        tl.store(rows + b * WIDTH + 1, here)
        tl.store(ids + b, here * 0)
        tl.store(base + OPEN, float("-inf"))
    else:
        offs = tl.arange(0, BLOCK)
        frontier = tl.load(base + offs * FIELDS_ + OPEN, mask=offs < BEFORE, other=float("-inf"))
        for r in range(RUNS):
            best = tl.argmax(frontier, axis=0, tie_break_left=True)
            node = base + best * FIELDS_
            token = tl.load(node + TOKEN).to(tl.int64)
            depth = tl.load(node + DEPTH).to(tl.int64)
            first = tl.load(node + START).to(tl.int32)
            last = tl.load(node + END).to(tl.int32)
            tl.store(tokens + b * WIDTH + r, token)
            tl.store(positions + b * WIDTH + r, here + depth)
            tl.store(rows + b * WIDTH + r, here + best)
            tl.store(q_start + b * WIDTH + r, first)
            tl.store(q_end + b * WIDTH + r, last)
            tl.store(ids + b * RUNS + r, best.to(tl.int64))
            tl.store(node + OPEN, float("-inf"))
            frontier = tl.where(offs == best, float("-inf"), frontier)


@triton.jit
def add_children_kernel(table, prefix, ids, picks, logp, bias, kv_start, kv_end, spans, kv_width, first_child,
                        SIZE, RUNS, BRANCH, KEY_RULE: tl.constexpr, FIELDS_: tl.constexpr, EPS_: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """One program per (sample, run node): its BRANCH children (tokens `picks`, draft log-probabilities
    `logp`) at their fixed ids, with depth, interval, cumulative log-probability, prior and rank, and
    their intervals at their draft cache rows (the statement: `DraftTrees.add_children`). KEY_RULE:
    the index of the key rule in `tree.KEYS` (0 cum, 1 parent, 2 static); bias: (steps, BRANCH)."""
    b = tl.program_id(0)
    r = tl.program_id(1)
    k = tl.arange(0, BLOCK_K)
    live = k < BRANCH
    parent = tl.load(ids + b * RUNS + r)
    node = table + (b * SIZE + parent) * FIELDS_
    depth = tl.load(node + DEPTH) + 1.0
    start = tl.load(node + START)
    cum_parent = tl.load(node + CUM)
    prior_parent = tl.load(node + PRIOR)
    span = tl.load(spans + depth.to(tl.int64))
    here = tl.load(prefix + b)
    at = (b * RUNS + r) * BRANCH + k
    token = tl.load(picks + at, mask=live, other=0).to(tl.float64)
    cum = cum_parent + tl.load(logp + at, mask=live, other=0.0).to(tl.float64)
    prior = prior_parent + tl.load(bias + (depth - 1.0).to(tl.int64) * BRANCH + k, mask=live, other=0.0)
    child = first_child + r * BRANCH + k
    child_f = child.to(tl.float64)
    first = (start + 1.0) + k.to(tl.float64) * span
    last = first + (span - 1.0)
    if KEY_RULE == 0:
        key = prior + cum
    elif KEY_RULE == 1:
        key = prior + cum_parent
    else:
        key = prior + cum * 0.0
    rank = key - EPS_ * (depth * SIZE + child_f)
    tl.debug_barrier()
    row = table + (b * SIZE + child) * FIELDS_
    tl.store(row + ID, child_f, mask=live)
    tl.store(row + PARENT, parent.to(tl.float64) + child_f * 0.0, mask=live)
    tl.store(row + TOKEN, token, mask=live)
    tl.store(row + DEPTH, depth + child_f * 0.0, mask=live)
    tl.store(row + START, first, mask=live)
    tl.store(row + END, last, mask=live)
    tl.store(row + CUM, cum, mask=live)
    tl.store(row + RANK, rank, mask=live)
    tl.store(row + OPEN, rank, mask=live)
    tl.store(row + PRIOR, prior, mask=live)
    cache_row = b * kv_width + here + child
    tl.store(kv_start + cache_row, first.to(tl.int32), mask=live)
    tl.store(kv_end + cache_row, last.to(tl.int32), mask=live)


@triton.jit
def choose_kernel(table, prefix, local, chosen, tokens, positions, rows, q_start, q_end, kv_start, kv_end,
                  v_parents, v_tokens, kv_width, SIZE, N, FIELDS_: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """One program per sample: the N nodes of largest RANK in ascending id order (a subtree holding
    the root), and everything the target pass and the verification read about them."""
    b = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    base = table + b * SIZE * FIELDS_
    rank = tl.load(base + offs * FIELDS_ + RANK, mask=offs < SIZE, other=float("-inf"))
    picked = offs < 0
    for _ in range(N):
        best = tl.argmax(rank, axis=0, tie_break_left=True)
        picked = picked | (offs == best)
        rank = tl.where(offs == best, float("-inf"), rank)
    order = tl.cumsum(picked.to(tl.int32), axis=0) - 1  # a picked id's position among the picked
    tl.store(local + b * SIZE + offs, order.to(tl.int64), mask=picked)
    tl.store(chosen + b * N + order, offs.to(tl.int64), mask=picked)
    tl.debug_barrier()
    j = tl.arange(0, BLOCK_N)
    live = j < N
    ids = tl.load(chosen + b * N + j, mask=live, other=0)
    node = base + ids * FIELDS_
    parent = tl.load(node + PARENT, mask=live, other=-1.0).to(tl.int64)
    local_parent = tl.load(local + b * SIZE + tl.maximum(parent, 0), mask=live & (parent >= 0), other=-1)
    token = tl.load(node + TOKEN, mask=live, other=0.0).to(tl.int64)
    depth = tl.load(node + DEPTH, mask=live, other=0.0).to(tl.int64)
    first = tl.load(node + START, mask=live, other=0.0).to(tl.int32)
    last = tl.load(node + END, mask=live, other=0.0).to(tl.int32)
    here = tl.load(prefix + b)
    tl.debug_barrier()
    at = b * N + j
    tl.store(v_parents + at, tl.where(parent < 0, -1, local_parent).to(tl.int32), mask=live)
    tl.store(v_tokens + at, token.to(tl.int32), mask=live)
    tl.store(tokens + at, token, mask=live)
    tl.store(positions + at, here + depth, mask=live)
    tl.store(rows + at, here + j, mask=live)
    tl.store(q_start + at, first, mask=live)
    tl.store(q_end + at, last, mask=live)
    tl.store(kv_start + b * kv_width + here + j, first, mask=live)
    tl.store(kv_end + b * kv_width + here + j, last, mask=live)


@triton.jit
def commit_kernel(path, next_token, chosen, table, prefix, prefix32, root, n_out, done, limit, eos, out, lag,
                  lag_token, status, counter, t_src, t_dst, t_counts, d_src, d_dst, d_counts, kv_start,
                  kv_end, batch, out_width, kv_width, last_round, span0, SIZE, N, FIELDS_: tl.constexpr,
                  COUNT: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per sample: after verification, the moves of the accepted path's KV in both
    caches (the compaction kernels run next), the emitted tokens, the state of the next round and
    its fresh tree (the statement: `TorchBookkeeping.commit`)."""
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_N)
    live = j < N
    node_of = tl.load(path + b * N + j, mask=live, other=-1).to(tl.int64)
    accepted = tl.sum((node_of >= 0).to(tl.int64), axis=0) - 1
    inactive = tl.load(done + b) != 0
    active = tl.load(done + b) == 0
    here = tl.load(prefix + b)
    emitted_so_far = tl.load(n_out + b)
    old_root = tl.load(root + b)
    nxt = tl.load(next_token + b).to(tl.int64)
    most = tl.load(limit)
    end_token = tl.load(eos)
    node = tl.load(chosen + b * N + tl.maximum(node_of, 0), mask=live, other=0)
    token = tl.load(table + (b * SIZE + node) * FIELDS_ + TOKEN, mask=live, other=0.0).to(tl.int64)
    after = tl.load(path + b * N + j + 1, mask=j + 1 < N, other=-1).to(tl.int64)
    node_after = tl.load(chosen + b * N + tl.maximum(after, 0), mask=j + 1 < N, other=0)
    token_after = tl.load(table + (b * SIZE + node_after) * FIELDS_ + TOKEN, mask=j + 1 < N,
                          other=0.0).to(tl.int64)
    last = tl.sum(tl.where(j == accepted, node, 0), axis=0)
    last_open = tl.load(table + (b * SIZE + last) * FIELDS_ + OPEN)
    last_run = last_open == float("-inf")
    last_token = tl.sum(tl.where(j == accepted, token, 0), axis=0)
    rounds = tl.load(counter)
    tl.debug_barrier()
    emitted = tl.where(j == accepted, nxt, token_after)
    valid = live & (j <= accepted) & active
    hit_eos = tl.max(tl.where(valid & (emitted == end_token), 1, 0), axis=0) > 0
    step = tl.where(active, accepted + 1, 0)
    total = emitted_so_far + step
    finished = inactive | hit_eos | (total >= most)
    new_prefix = here + step
    new_root = tl.where(active, nxt, old_root)
    dst = (here + j).to(tl.int32)
    tl.store(t_src + b * N + j, (here + tl.maximum(node_of, 0)).to(tl.int32), mask=live)
    tl.store(t_dst + b * N + j, dst, mask=live)
    tl.store(t_counts + b, step.to(tl.int32))
    tl.store(d_src + b * N + j, (here + node).to(tl.int32), mask=live)
    tl.store(d_dst + b * N + j, dst, mask=live)
    tl.store(d_counts + b, tl.where(active, accepted + last_run.to(tl.int64), 0).to(tl.int32))
    tl.store(out + b * out_width + tl.minimum(emitted_so_far + j, out_width - 1), emitted, mask=valid)
    tl.store(n_out + b, total)
    tl.store(done + b, finished)
    tl.store(lag + b, active & (last_open != float("-inf")))
    tl.store(lag_token + b, last_token)
    tl.store(prefix + b, new_prefix)
    tl.store(prefix32 + b, new_prefix.to(tl.int32))
    tl.store(root + b, new_root)
    tl.store(status + b, finished.to(tl.int64))
    tl.store(status + batch + b, tl.where(active, accepted, -1))
    tl.store(status + 2 * batch + b, total)
    tl.store(table + b * SIZE * FIELDS_ + TOKEN, new_root.to(tl.float64))
    tl.store(table + b * SIZE * FIELDS_ + OPEN, 0.0)
    tl.store(kv_start + b * kv_width + new_prefix, 0)
    tl.store(kv_end + b * kv_width + new_prefix, span0)
    if COUNT:
        if b == 0:
            tl.store(counter, tl.minimum(rounds + 1, last_round))


@triton.jit
def plain_advance_kernel(logits, token, prefix, prefix32, root, n_out, done, limit, eos, out, counter,
                         out_width, last_step, V: tl.constexpr, GREEDY: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program per sample: plain decoding's step after the target pass: the argmax (greedy) or
    the token drawn beforehand (sample), emitted, and the state advanced (statement:
    `TorchBookkeeping.advance`)."""
    b = tl.program_id(0)
    if GREEDY:
        v = tl.arange(0, BLOCK_V)
        scores = tl.load(logits + b * V + v, mask=v < V, other=float("-inf")).to(tl.float32)
        picked = tl.argmax(scores, axis=0, tie_break_left=True).to(tl.int64)
    else:
        picked = tl.load(token + b)
    inactive = tl.load(done + b) != 0
    active = tl.load(done + b) == 0
    here = tl.load(prefix + b)
    emitted_so_far = tl.load(n_out + b)
    old_root = tl.load(root + b)
    most = tl.load(limit)
    end_token = tl.load(eos)
    steps = tl.load(counter)
    tl.debug_barrier()
    step = active.to(tl.int64)
    total = emitted_so_far + step
    tl.store(out + b * out_width + tl.minimum(emitted_so_far, out_width - 1), picked, mask=active)
    tl.store(n_out + b, total)
    tl.store(prefix + b, here + step)
    tl.store(prefix32 + b, (here + step).to(tl.int32))
    tl.store(root + b, tl.where(active, picked, old_root))
    tl.store(done + b, inactive | (total >= most) | (picked == end_token))
    if not GREEDY:
        if b == 0:
            tl.store(counter, tl.minimum(steps + 1, last_step))


interpreter.prepare(draft_inputs_kernel, add_children_kernel, choose_kernel, commit_kernel,
                    plain_advance_kernel)


def block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


__all__ = ["CUM", "DEPTH", "END", "EPS", "FIELDS", "ID", "OPEN", "PARENT", "RANK", "START", "TOKEN",
           "add_children_kernel", "block", "choose_kernel", "commit_kernel", "draft_inputs_kernel",
           "plain_advance_kernel"]
