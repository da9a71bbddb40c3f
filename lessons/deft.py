# Student copy, generated from solutions/deft.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Notebooks 13 and 14: DeFT, attention over a tree-structured KV cache, in Triton.

Yao et al., "DeFT: Decoding with Flash Tree-attention for Efficient Tree-structured LLM
Inference" (ICLR 2025), specified in `pyspec_ref.deft`. Phase 1, QKV preparation on the host, is
given (`course.topics.deft.groups`: `node_groups`, `flatten_blocks`). Phase 2 is here.
`deft_node_kernel` / `deft_flatten_kernel`: one program per (tile of a group's queries, KV head);
a tile's rows are (query, query head) pairs, so one K/V tile serves the H_q / H_kv query heads
that share a KV head. The program streams its group's tokens with the online softmax (notebook
12's `online_softmax_step`) and writes a float32 partial output row and its log-sum-exp per
(group, query, head): `tile_rows` and `store_partials`, shared by both kernels, are notebook 13's
exercise. `reduce_partials_kernel` merges each query's partials in increasing group order (§3.4,
the Flash-Decoding merge): no atomics, so two runs give the same bits. Paged KV: `slots` (T,)
int32 maps each flattened token to its cache row. Launches (grids, tiles, TMA on a Hopper GPU):
`course.topics.deft.launch`; input checks: `course.topics.deft.validate`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course.core import interpreter
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.deft import groups, launch
from course.topics.deft import validate as check
from course.topics.deft.groups import FlattenBlocks, KVGroups, NodeGroups, check_inputs, work_item

from .triton_attention import LN2, online_softmax_step

# Phase 1 is given; the checks call it through this module.
node_groups, flatten_blocks = groups.node_groups, groups.flatten_blocks


@triton.jit
def _load_kv_tile(k, v, slots, tokens, inside, kv_head, cols,
                  stride_k_row, stride_k_head, stride_v_row, stride_v_head, PAGED: tl.constexpr):
    """K and V of flattened tokens `tokens` (BLOCK_N) for one KV head: two (BLOCK_N, D) tiles,
    zeros where not `inside`. Paged: token t's row of the cache is slots[t]; else row t."""
    if PAGED:
        kv_rows = tl.load(slots + tokens, mask=inside, other=0).to(tl.int64)
    else:
        kv_rows = tokens.to(tl.int64)
    k_tile = tl.load(k + kv_rows[:, None] * stride_k_row + kv_head * stride_k_head + cols[None, :],
                     mask=inside[:, None], other=0.0)
    v_tile = tl.load(v + kv_rows[:, None] * stride_v_row + kv_head * stride_v_head + cols[None, :],
                     mask=inside[:, None], other=0.0)
    return k_tile, v_tile


@triton.jit
def _attend_all(q_tile, k, v, slots, k_desc, v_desc, token_start, token_end, kv_head, cols, stride_k_row,
                stride_k_head, stride_v_row, stride_v_head, qk_scale, m, l, acc,
                BLOCK_N: tl.constexpr, PAGED: tl.constexpr, TMA: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the tokens [token_start, token_end), every one visible to every row, into (m, l, acc):
    whole tiles with the constant mask True (through TMA descriptors where `launch.kv_descriptors`
    made them), the ragged end masked. DeFT-Node's loop, and DeFT-Flatten's for its dense programs."""
    whole_end = token_start + (token_end - token_start) // BLOCK_N * BLOCK_N
    for start in range(token_start, whole_end, BLOCK_N):
        if TMA:
            k_tile = k_desc.load([start, kv_head * cols.shape[0]])
            v_tile = v_desc.load([start, kv_head * cols.shape[0]])
        else:
            tokens = start + tl.arange(0, BLOCK_N)
            k_tile, v_tile = _load_kv_tile(k, v, slots, tokens, tokens < token_end, kv_head, cols,
                                           stride_k_row, stride_k_head, stride_v_row, stride_v_head, PAGED)
        m, l, acc = online_softmax_step(q_tile, k_tile, v_tile, True, m, l, acc, qk_scale, PRECISION)
    if whole_end < token_end:
        tokens = whole_end + tl.arange(0, BLOCK_N)
        inside = tokens < token_end
        k_tile, v_tile = _load_kv_tile(k, v, slots, tokens, inside, kv_head, cols, stride_k_row,
                                       stride_k_head, stride_v_row, stride_v_head, PAGED)
        m, l, acc = online_softmax_step(q_tile, k_tile, v_tile, inside[None, :], m, l, acc, qk_scale,
                                        PRECISION)
    return m, l, acc


@triton.jit
def tile_rows(q, member_query, tile, first, count, kv_head, stride_q_row, stride_q_head,
              GROUP: tl.constexpr, QUERIES_PER_TILE: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """The rows of a work item's tile, for both DeFT kernels: (member, head, valid, q_tile).

    Row r is the pair (member r // GROUP of the tile, query head kv_head * GROUP + r % GROUP):
    member is the row's query as a position among its group's queries (its query id is
    member_query[first + member]), head its query head, valid whether the row holds a real pair
    (inside QUERIES_PER_TILE * GROUP rows and member < count), and q_tile the (BLOCK_M, D) rows
    of q, zeros for the invalid rows.
    """
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    # YOUR CODE HERE: exercise deft.deft_node_kernel, region 1 (delete the todo line when you start)
    todo("deft.deft_node_kernel", region=1, lines=6, defines="member, head, valid, q_tile")
    return member, head, valid, q_tile


@triton.jit
def store_partials(out_part, lse_part, m, l, acc, first, member, head, valid,
                   HEADS_Q: tl.constexpr, D: tl.constexpr):
    """Finish the online softmax of a tile's rows and store each valid row's partial, number
    first + member (its place in member_query): out_part[p, h, :] starts at element
    (p * HEADS_Q + h) * D, lse_part[p, h] is element p * HEADS_Q + h. Every valid row saw a token
    (a group's queries see all of a node, a block's some of it), so l > 0 there."""
    l = tl.where(l > 0, l, 1.0)
    out = acc / l[:, None]
    lse = (m + tl.log2(l)) * LN2  # back to natural log
    cols = tl.arange(0, D)
    # YOUR CODE HERE: exercise deft.deft_node_kernel, region 2 (delete the todo line when you start)
    todo("deft.deft_node_kernel", region=2, lines=4)


@triton.jit
def deft_node_kernel(
    q, k, v, slots, k_desc, v_desc, out_part, lse_part,
    group_start, group_end, group_ptr, member_query, work_group, work_tile,
    stride_q_row, stride_q_head, stride_k_row, stride_k_head, stride_v_row, stride_v_head,
    qk_scale,
    HEADS_Q: tl.constexpr, GROUP: tl.constexpr, QUERIES_PER_TILE: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, TMA: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program per (tile of one node group's queries, KV head): the group's partials. Every
    token of the node is visible to every query of its group: no mask but the ragged end."""
    kv_head = tl.program_id(1)
    tile, token_start, token_end, first, count = work_item(work_group, work_tile, group_start, group_end,
                                                            group_ptr)
    member, head, valid, q_tile = tile_rows(q, member_query, tile, first, count, kv_head, stride_q_row,
                                            stride_q_head, GROUP, QUERIES_PER_TILE, D, BLOCK_M)
    cols = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scores (log2 units)
    l = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)  # running sum of exp2(score - m) * v
    # Every token of the node is visible to every query of its group: no mask but the ragged end.
    m, l, acc = _attend_all(q_tile, k, v, slots, k_desc, v_desc, token_start, token_end, kv_head, cols,
                            stride_k_row, stride_k_head, stride_v_row, stride_v_head, qk_scale, m, l, acc,
                            BLOCK_N, PAGED, TMA, PRECISION)
    store_partials(out_part, lse_part, m, l, acc, first, member, head, valid, HEADS_Q, D)


@triton.jit
def deft_flatten_kernel(
    q, k, v, slots, k_desc, v_desc, out_part, lse_part,
    group_start, group_end, group_ptr, member_query, work_group, work_tile, work_dense,
    token_words, num_words,
    stride_q_row, stride_q_head, stride_k_row, stride_k_head, stride_v_row, stride_v_head,
    qk_scale,
    HEADS_Q: tl.constexpr, GROUP: tl.constexpr, QUERIES_PER_TILE: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, TMA: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program per (tile of one block's queries, KV head): the block's partials. As
    `deft_node_kernel`, but a query sees only some of the block's tokens: the score tile is masked
    by the bitmask words of each token (token_words)."""
    kv_head = tl.program_id(1)
    tile, token_start, token_end, first, count = work_item(work_group, work_tile, group_start, group_end,
                                                            group_ptr)
    member, head, valid, q_tile = tile_rows(q, member_query, tile, first, count, kv_head, stride_q_row,
                                            stride_q_head, GROUP, QUERIES_PER_TILE, D, BLOCK_M)
    cols = tl.arange(0, D)
    # The bitmask word of this tile's members (QUERIES_PER_TILE divides 64: one word for the tile),
    # and each row's bit in it, an int64 1 shifted by its member's place in the word.
    # YOUR CODE HERE: exercise deft.deft_flatten_kernel, region 1 (delete the todo line when you start)
    todo("deft.deft_flatten_kernel", region=1, lines=2, defines="word, row_bit")
    # Most blocks of a speculative tree are prefix: every member sees every token, and the host
    # said so (work_dense, `groups.work_list`). Those take a loop without the words' loads and the bit
    # tests; the other loop loads each token's word with the K/V tiles, its address known ahead.
    dense = tl.load(work_dense + tl.program_id(0)) != 0
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if dense:  # DeFT-Node's loop: only the block's end is masked
        m, l, acc = _attend_all(q_tile, k, v, slots, k_desc, v_desc, token_start, token_end, kv_head, cols,
                                stride_k_row, stride_k_head, stride_v_row, stride_v_head, qk_scale, m, l, acc,
                                BLOCK_N, PAGED, TMA, PRECISION)
    else:
        for start in range(token_start, token_end, BLOCK_N):
            tokens = start + tl.arange(0, BLOCK_N)
            inside = tokens < token_end
            k_tile, v_tile = _load_kv_tile(k, v, slots, tokens, inside, kv_head, cols, stride_k_row,
                                           stride_k_head, stride_v_row, stride_v_head, PAGED)
            # visible[r, c]: row r's query sees token c of this tile (the bit of its member number
            # in word `word` of token c's bitmask, token_words), and the token lies inside the block.
            # The row's bit is fixed (row_bit, above the loop): one AND per entry, no 64-bit shift.
            # YOUR CODE HERE: exercise deft.deft_flatten_kernel, region 2 (delete the todo line when you start)
            todo("deft.deft_flatten_kernel", region=2, lines=2, defines="visible")
            # A row may see nothing in this tile (or in none so far): the step keeps its max at -inf
            # and its sums at 0, without a NaN (it subtracts 0 instead of -inf).
            m, l, acc = online_softmax_step(q_tile, k_tile, v_tile, visible, m, l, acc, qk_scale, PRECISION)
    store_partials(out_part, lse_part, m, l, acc, first, member, head, valid, HEADS_Q, D)


@triton.jit
def reduce_partials_kernel(
    out_part, lse_part, query_ptr, query_parts, out, lse,
    HEADS_Q: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """One program per (query, BLOCK_H query heads): merge the query's partials for those heads, in
    increasing group order: out = sum_p exp(lse_p - lse) out_p with lse = log sum_p exp(lse_p),
    around a running maximum that starts at -inf (§3.4, the Flash-Decoding merge)."""
    query = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    real = heads < HEADS_Q  # the last program's spare heads (H_q not a multiple of BLOCK_H)
    cols = tl.arange(0, D)
    first = tl.load(query_ptr + query)
    last = tl.load(query_ptr + query + 1)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of the lse's seen, per head
    l = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp(lse_p - m)
    acc = tl.zeros([BLOCK_H, D], tl.float32)  # running sum of exp(lse_p - m) * out_p
    for i in range(first, last):
        # Pair i's partial, number part = query_parts[i] (int64): its lse's and out rows for the
        # program's heads (a spare head reads lse = 0 and out = 0: finite, and never stored). Fold
        # them into (m, l, acc): the Flash-Decoding merge as a running recurrence.
        # YOUR CODE HERE: exercise deft.reduce_partials_kernel, region 1 (delete the todo line when you start)
        todo("deft.reduce_partials_kernel", region=1, lines=10, defines="l, acc, m")
    result = (acc / l[:, None]).to(out.dtype.element_ty)
    # The merged rows stored for the real heads: result, and lse = m + log(l), at row
    # query * HEADS_Q + head of (Q, H_q, d) out and (Q, H_q) lse.
    # YOUR CODE HERE: exercise deft.reduce_partials_kernel, region 2 (delete the todo line when you start)
    todo("deft.reduce_partials_kernel", region=2, lines=3)


interpreter.prepare(_load_kv_tile, _attend_all, tile_rows, store_partials, deft_node_kernel,
                    deft_flatten_kernel, reduce_partials_kernel)


def _kernels_of(prepared) -> tuple:
    """Phase 2's first kernel for `prepared` and the exercise helpers it calls: what
    `require_written` must see written before a launch."""
    kernel = deft_flatten_kernel if isinstance(prepared, FlattenBlocks) else deft_node_kernel
    return kernel, tile_rows, store_partials, online_softmax_step


def group_partials(q, k, v, prepared: KVGroups, *, slots=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 2, step 1 alone: (out_part (P, H_q, d) float32, lse_part (P, H_q) float32), row p the
    partial of the p-th (group, query) pair of `prepared` (from `node_groups` or `flatten_blocks`)."""
    check_inputs(q, k, v, prepared, slots)
    kernel, *helpers = _kernels_of(prepared)
    require_written(kernel, *helpers)
    run, out_part, lse_part = launch.partials_launch(kernel, q, k, v, prepared, slots)
    run()
    return out_part, lse_part


def reduce_partials(out_part, lse_part, query_ptr, query_parts, *, out_dtype=torch.float32):
    """Phase 2, step 2 alone: merge each query's partials by LSE; return (out (Q, H_q, d) of
    `out_dtype`, lse (Q, H_q) float32). Query i merges rows query_parts[query_ptr[i] : query_ptr[i + 1]]."""
    check.partials(out_part, lse_part, query_ptr, query_parts, out_dtype)
    require_written(reduce_partials_kernel)
    run, out, lse = launch.reduce_launch(reduce_partials_kernel, out_part, lse_part, query_ptr, query_parts,
                                         out_dtype)
    run()
    return out, lse


def _attention(q, k, v, prepared, slots, return_lse, kind):
    check_inputs(q, k, v, prepared, slots, kind)
    kernel, *helpers = _kernels_of(prepared)
    require_written(kernel, *helpers, reduce_partials_kernel)
    out, lse = launch.attention_launch(kernel, reduce_partials_kernel, q, k, v, prepared, slots)()
    return (out, lse) if return_lse else out


def deft_node_attention(q, k, v, prepared: NodeGroups, *, slots=None, return_lse: bool = False):
    """DeFT-Node attention: q (Q, H_q, d) over the KV tree of `prepared` (from `node_groups`).
    k, v: (T, H_kv, d) in the flattened DFS layout, or with `slots` a paged cache (S, H_kv, d).
    Returns out (Q, H_q, d) in q's dtype, and with return_lse=True also lse (Q, H_q) float32."""
    return _attention(q, k, v, prepared, slots, return_lse, NodeGroups)


def deft_flatten_attention(q, k, v, prepared: FlattenBlocks, *, slots=None, return_lse: bool = False):
    """DeFT-Flatten attention: as `deft_node_attention`, over the blocks of `flatten_blocks`."""
    return _attention(q, k, v, prepared, slots, return_lse, FlattenBlocks)
