# Student copy, generated from solutions/deft.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Notebooks 13 and 14: DeFT, attention over a tree-structured KV cache, in Triton.

Yao et al., "DeFT: Decoding with Flash Tree-attention for Efficient Tree-structured LLM
Inference" (ICLR 2025). The KV tree, its flattened DFS layout and the grouping rules are
specified in `pyspec_ref.deft`; this module computes the same thing on a GPU in two phases.

Phase 1, QKV preparation (host, PyTorch; `node_groups`, `flatten_blocks`). KV-guided
grouping (§3.2): DeFT-Node makes one QKV group per node, the node's tokens with every query
that sees them. DeFT-Flatten (§3.3) cuts the flattened tokens into blocks of equal length;
a block's queries are those that see any of its tokens, and each node piece of the block
gets a bitmask of the block's queries that see it (64 queries per int64 word, as many words
as the block needs). The result is a few small int32/int64 tensors (`NodeGroups`,
`FlattenBlocks`): each group's token range, its queries as a CSR list, and for every query
the positions of its partial results, in increasing group order.

Phase 2, attention (Triton). `deft_node_kernel` / `deft_flatten_kernel`: one program per
(tile of a group's queries, KV head). The rows of the program's tile are (query, query head)
pairs: with grouped-query attention, the H_q / H_kv query heads that share a KV head are rows
of the same tile, so each KV tile the program loads serves all of them. The program streams
over its group's tokens with the online softmax (FlashAttention-2) and writes one float32
partial output row and its log-sum-exp per (group, query, head). `reduce_partials_kernel`,
one program per (query, block of heads), then merges each query's partials in increasing
group order with a running maximum that starts at -inf (§3.4's tree-topology-aware global
reduction, the Flash-Decoding merge): no atomics, so two runs give the same bits.

Paged KV: pass `slots`, (T,) int32, mapping each flattened token to its row of the cache;
the kernels gather K and V rows through it. Contiguous KV is the case slots = None, k and v
of shape (T, H_kv, d).

The token loops are `for` loops over run-time bounds, which Triton pipelines on a GPU (the
K/V loads of the next tiles in flight while one computes); `course.core.interpreter` makes such
bounds work in Triton 3.6's interpreter too. The step of the token loop is notebook 12's
`online_softmax_step`, with DeFT's masks. Both kernels share what a student would otherwise
write twice: `tile_rows` (a tile's (query, query head) rows and their q) and `store_partials`
(the partials' stores), both part of notebook 13's exercise; `_load_kv_tile` loads one K/V tile,
contiguous or paged, and `_attend_all` is the loop over tokens every row sees (DeFT-Node's, and
DeFT-Flatten's for the programs whose mask is all ones); on a Hopper GPU its whole tiles of
contiguous KV come through TMA tensor descriptors (`_kv_descriptors`).

Input checks live in `course.topics.deft.validate`; tile sizes and the block-length model,
fitted to the H100, in `course.topics.deft.tuning`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from course.core import interpreter, runtime
from course.core.launch import poisoned_empty
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.deft import validate as check
from course.topics.deft.tuning import HEADS_PER_MERGE, MERGE_WARPS, WORD_BITS, TileShape, tile_shape

from .triton_attention import LN2, LOG2_E, online_softmax_step

# --------------------------------------------------------------------------- phase 1 (host)


def _preorder(p: list[int]) -> list[int]:
    """Node ids in DFS preorder, children in increasing id (the flattened layout's node order)."""
    children: list[list[int]] = [[] for _ in p]
    for i in range(1, len(p)):
        children[p[i]].append(i)
    order, stack = [], [0]
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(reversed(children[v]))
    return order


def _layout(p: list[int], sizes: list[int]) -> tuple[list[int], list[int]]:
    """(preorder, offsets): offsets[v] is the flattened index of node v's first token."""
    order = _preorder(p)
    offsets, position = [0] * len(p), 0
    for v in order:
        offsets[v] = position
        position += sizes[v]
    return order, offsets


def _queries_by_node(p: list[int], nodes: list[int]) -> list[list[int]]:
    """seen_by[v]: the queries whose root path holds v, increasing (O(sum of query depths))."""
    seen_by: list[list[int]] = [[] for _ in p]
    for i, v in enumerate(nodes):
        while v != -1:
            seen_by[v].append(i)
            v = p[v]
    return seen_by


def _ints(values, device, dtype=torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


@dataclass(frozen=True, eq=False, kw_only=True)
class KVGroups:
    """Phase 1's output: the QKV groups of one KV tree, as small index tensors on one device.

    Group g covers the flattened tokens [group_start[g], group_end[g]); its queries are
    member_query[group_ptr[g] : group_ptr[g + 1]] (CSR). Each (group, query) pair is one
    *partial*, numbered by its position p in member_query. Query i's partials are
    query_parts[query_ptr[i] : query_ptr[i + 1]], in increasing group order: the order in
    which the reduction merges them.
    """

    num_queries: int
    num_tokens: int
    group_start: torch.Tensor  # (G,) int32
    group_end: torch.Tensor  # (G,) int32
    group_ptr: torch.Tensor  # (G + 1,) int32
    member_query: torch.Tensor  # (P,) int32
    query_ptr: torch.Tensor  # (Q + 1,) int32
    query_parts: torch.Tensor  # (P,) int32
    max_group_queries: int
    max_group_tokens: int
    work_lists: dict = field(default_factory=dict, repr=False)  # filled by the launchers, per tile shape

    @property
    def device(self) -> torch.device:
        return self.group_start.device

    @property
    def num_groups(self) -> int:
        return int(self.group_start.shape[0])

    @property
    def num_partials(self) -> int:
        return int(self.member_query.shape[0])


@dataclass(frozen=True, eq=False, kw_only=True)
class NodeGroups(KVGroups):
    """DeFT-Node's groups (`node_groups`): group g is node group_node[g]."""

    group_node: torch.Tensor  # (G,) int32


@dataclass(frozen=True, eq=False, kw_only=True)
class FlattenBlocks(KVGroups):
    """DeFT-Flatten's groups (`flatten_blocks`): group g is block group_block[g] of the tokens.

    Blocks no query sees are left out. The block's node pieces are segments: segment s
    covers tokens [segment_start[s], segment_end[s]) of node segment_node[s];
    token_segment[t] is the segment of token t. Bit j of segment_words[s, w] is set iff
    the block's query number 64 w + j (its position in the block's member list) sees
    segment s; num_words = segment_words.shape[1] is the largest number of words a block
    needs (the rest are 0). token_words[t] = segment_words[token_segment[t]], each token's
    words: the kernel reads them with one load whose address it knows ahead, where
    segment_words[token_segment[t]] would be a load waiting on a load.
    """

    block_tokens: int
    group_block: torch.Tensor  # (G,) int32
    token_segment: torch.Tensor  # (T,) int32
    segment_node: torch.Tensor  # (S,) int32
    segment_start: torch.Tensor  # (S,) int32
    segment_end: torch.Tensor  # (S,) int32
    segment_words: torch.Tensor  # (S, num_words) int64
    token_words: torch.Tensor  # (T, num_words) int64

    @property
    def num_words(self) -> int:
        return int(self.segment_words.shape[1])


def _query_lists(members: list[list[int]], n_queries: int, device):
    """CSR tensors of the groups' members and of each query's partial positions."""
    group_ptr, member_query = [0], []
    parts: list[list[int]] = [[] for _ in range(n_queries)]
    for queries in members:
        for i in queries:
            parts[i].append(len(member_query))
            member_query.append(i)
        group_ptr.append(len(member_query))
    query_ptr = [0]
    for own in parts:
        query_ptr.append(query_ptr[-1] + len(own))
    return dict(group_ptr=_ints(group_ptr, device), member_query=_ints(member_query, device),
                query_ptr=_ints(query_ptr, device),
                query_parts=_ints([x for own in parts for x in own], device),
                max_group_queries=max(len(m) for m in members))


def node_groups(parents, lengths, query_nodes, device) -> NodeGroups:
    """Phase 1 of DeFT-Node (§3.2, KV-guided grouping): one QKV group per node some query sees.

    Groups come in increasing node id, each with its queries in increasing id; equal to
    `pyspec_ref.deft.node_groups`. Host work O(M + sum of query depths).
    """
    p, sizes, nodes = check.kv_tree(parents, lengths, query_nodes)
    device = check.torch_device(device)
    _, offsets = _layout(p, sizes)
    seen_by = _queries_by_node(p, nodes)
    groups = [v for v in range(len(p)) if seen_by[v]]
    return NodeGroups(
        num_queries=len(nodes), num_tokens=sum(sizes),
        group_node=_ints(groups, device),
        group_start=_ints([offsets[v] for v in groups], device),
        group_end=_ints([offsets[v] + sizes[v] for v in groups], device),
        max_group_tokens=max(sizes[v] for v in groups),
        **_query_lists([seen_by[v] for v in groups], len(nodes), device),
    )


def _signed64(word: int) -> int:
    """An unsigned 64-bit word as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return word - (1 << 64) if word >= 1 << 63 else word


def _blocks(p: list[int], sizes: list[int], seen_by: list[list[int]], block_tokens: int):
    """(block index, its node pieces (node, start, stop), its queries) of every block some query sees."""
    _, offsets = _layout(p, sizes)
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(-(-sum(sizes) // block_tokens))]
    for v in _preorder(p):  # token order: cut each node at the block boundaries it crosses
        start, end = offsets[v], offsets[v] + sizes[v]
        while start < end:
            block = start // block_tokens
            stop = min(end, (block + 1) * block_tokens)
            pieces[block].append((v, start, stop))
            start = stop
    for block, block_pieces in enumerate(pieces):
        queries = sorted({i for v, _, _ in block_pieces for i in seen_by[v]})
        if queries:
            yield block, block_pieces, queries


def flatten_blocks(parents, lengths, query_nodes, block_tokens, device) -> FlattenBlocks:
    """Phase 1 of DeFT-Flatten (§3.3): equal blocks of the DFS-flattened tokens, with bitmasks.

    block_tokens: a multiple of 16 (`course.topics.deft.tuning.suggest_block_tokens` picks one).
    Blocks no query sees are left out; the others equal
    `pyspec_ref.deft.flatten_blocks(..., word_bits=64)`. A block with more than 64 queries gets
    more bitmask words. Host work O(M + blocks + sum over blocks of the queries
    of each of its segments).
    """
    p, sizes, nodes = check.kv_tree(parents, lengths, query_nodes)
    check.block_tokens(block_tokens)
    device = check.torch_device(device)
    seen_by = _queries_by_node(p, nodes)
    total = sum(sizes)
    kept, members, segments = [], [], []
    for block, block_pieces, queries in _blocks(p, sizes, seen_by, block_tokens):
        position = {i: j for j, i in enumerate(queries)}
        for v, start, stop in block_pieces:
            words = [0] * -(-len(queries) // WORD_BITS)
            for i in seen_by[v]:
                j = position[i]
                words[j // WORD_BITS] |= 1 << (j % WORD_BITS)
            segments.append((v, start, stop, words))
        kept.append(block)
        members.append(queries)
    n_words = max(len(s[3]) for s in segments)
    token_segment = [0] * total
    for s, (_, start, stop, _) in enumerate(segments):
        token_segment[start:stop] = [s] * (stop - start)
    token_segment = _ints(token_segment, device)
    segment_words = _ints([[_signed64(w) for w in s[3]] + [0] * (n_words - len(s[3])) for s in segments],
                          device, torch.int64)
    return FlattenBlocks(
        num_queries=len(nodes), num_tokens=total, block_tokens=block_tokens,
        group_block=_ints(kept, device),
        group_start=_ints([b * block_tokens for b in kept], device),
        group_end=_ints([min(total, (b + 1) * block_tokens) for b in kept], device),
        max_group_tokens=block_tokens,
        token_segment=token_segment,
        segment_node=_ints([s[0] for s in segments], device),
        segment_start=_ints([s[1] for s in segments], device),
        segment_end=_ints([s[2] for s in segments], device),
        segment_words=segment_words,
        token_words=segment_words[token_segment.long()].contiguous(),
        **_query_lists(members, len(nodes), device),
    )


# --------------------------------------------------------------------------- phase 2 (Triton)


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
    """Fold the tokens [token_start, token_end), every one visible to every row, into (m, l, acc).

    The online softmax (notebook 12's step, FlashAttention-2 Algorithm 1), in base 2 with the
    scale folded in. The whole tiles pass the constant True as their mask, which the compiler
    folds away: no select on the scores. Only the ragged end, if any, takes a masked step.
    With TMA (contiguous KV on a Hopper GPU, `_kv_descriptors`) the whole tiles come through
    tensor descriptors: the copy engine computes the addresses and writes shared memory, so
    the warps spend no registers or instructions on them. DeFT-Node's loop, and DeFT-Flatten's
    for its dense programs.
    """
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
def _work_item(work_group, work_tile, group_start, group_end, group_ptr):
    """This program's work item w = program_id(0), tile work_tile[w] of group g = work_group[w]:
    (tile, the group's tokens [token_start, token_end), its first partial `first` = group_ptr[g],
    its number of queries `count`)."""
    work = tl.program_id(0)
    g = tl.load(work_group + work)
    tile = tl.load(work_tile + work)
    token_start = tl.load(group_start + g)
    token_end = tl.load(group_end + g)
    first = tl.load(group_ptr + g)
    count = tl.load(group_ptr + g + 1) - first
    return tile, token_start, token_end, first, count


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
    """Finish the online softmax of a tile's rows and store each valid row's partial.

    The row's pair is partial number first + member (its place in member_query): out_part[p, h, :]
    starts at element (p * HEADS_Q + h) * D, lse_part[p, h] is element p * HEADS_Q + h. A row
    past its group's queries saw zeros and is never stored; every real row saw a token (a group's
    queries see all of a node, and a block's queries some of it), so l > 0 there.
    """
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
    """One program per (tile of one node group's queries, KV head): the group's partials.

    Work item w is tile work_tile[w] of group work_group[w]: the group's members
    QUERIES_PER_TILE * tile ... (+ QUERIES_PER_TILE - 1). Row r of the tile is member
    r // GROUP with query head kv_head * GROUP + r % GROUP, so one K/V tile load serves
    every query head that shares this KV head. The program streams over the node's tokens
    (all visible to all its queries: no mask) and writes partial out and lse (natural log)
    at position group_ptr[g] + member.
    """
    kv_head = tl.program_id(1)
    tile, token_start, token_end, first, count = _work_item(work_group, work_tile, group_start, group_end,
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
    """One program per (tile of one block's queries, KV head): the block's partials.

    As `deft_node_kernel`, but a block holds pieces of several nodes, and a query of the
    block sees only some of them: the score tile is masked by the segments' bitmasks, read
    per token (token_words). A tile's QUERIES_PER_TILE members divide 64, so all its rows read
    the same bitmask word.
    """
    kv_head = tl.program_id(1)
    tile, token_start, token_end, first, count = _work_item(work_group, work_tile, group_start, group_end,
                                                            group_ptr)
    member, head, valid, q_tile = tile_rows(q, member_query, tile, first, count, kv_head, stride_q_row,
                                            stride_q_head, GROUP, QUERIES_PER_TILE, D, BLOCK_M)
    cols = tl.arange(0, D)
    word = (tile * QUERIES_PER_TILE) // 64  # the bitmask word of this tile's members
    row_bit = tl.full([BLOCK_M], 1, tl.int64) << (member % 64).to(tl.int64)  # each row's bit in it
    # Most blocks of a speculative tree are prefix: every member sees every token, and the host
    # said so (work_dense, `_work_list`). Those take a loop without the words' loads and the bit
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
            # YOUR CODE HERE: exercise deft.deft_flatten_kernel, region 1 (delete the todo line when you start)
            todo("deft.deft_flatten_kernel", region=1, lines=2, defines="visible")
            # A row may see nothing in this tile (or in none so far): the step keeps its max at -inf
            # and its sums at 0, without a NaN (it subtracts 0 instead of -inf).
            m, l, acc = online_softmax_step(q_tile, k_tile, v_tile, visible, m, l, acc, qk_scale, PRECISION)
    store_partials(out_part, lse_part, m, l, acc, first, member, head, valid, HEADS_Q, D)


@triton.jit
def reduce_partials_kernel(
    out_part, lse_part, query_ptr, query_parts, out, lse,
    HEADS_Q: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """One program per (query, BLOCK_H query heads): merge the query's partials for those heads.

    §3.4's global reduction, the Flash-Decoding merge, in a fixed order (increasing group):
    out = sum_p exp(lse_p - lse) out_p with lse = log sum_p exp(lse_p), computed around a
    running maximum that starts at -inf. Each step folds one partial: its BLOCK_H lse's and
    its (BLOCK_H, D) rows of out_part, which lie next to each other in memory (out_part is
    (P, H_q, d)), so one step reads BLOCK_H * D * 4 contiguous bytes. A program per head
    instead would read 512 bytes a step and wait a memory round trip for each; with 32 heads
    that is 32 times the programs, each mostly waiting. No atomics, so the result is the same
    bits every run.
    """
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
        part = tl.load(query_parts + i).to(tl.int64)
        # A spare head reads lse = 0 and out = 0: finite, and never stored.
        lse_p = tl.load(lse_part + part * HEADS_Q + heads, mask=real, other=0.0)
        out_p = tl.load(out_part + (part * HEADS_Q + heads[:, None]) * D + cols[None, :], mask=real[:, None],
                        other=0.0)
        # Fold this partial into (m, l, acc): the Flash-Decoding merge as a running recurrence.
        # YOUR CODE HERE: exercise deft.reduce_partials_kernel, region 1 (delete the todo line when you start)
        todo("deft.reduce_partials_kernel", region=1, lines=6, defines="l, acc, m")
    result = acc / l[:, None]
    where = query * HEADS_Q + heads
    tl.store(out + where[:, None] * D + cols[None, :], result.to(out.dtype.element_ty), mask=real[:, None])
    tl.store(lse + where, m + tl.log(l), mask=real)


interpreter.prepare(_work_item, _load_kv_tile, _attend_all, tile_rows, store_partials, deft_node_kernel,
                    deft_flatten_kernel, reduce_partials_kernel)


# --------------------------------------------------------------------------- launchers


def _work_list(prepared: KVGroups, queries_per_tile: int) -> tuple[torch.Tensor, ...]:
    """(group, tile, dense) of every work item: group g has ceil(its queries / queries_per_tile) tiles.

    dense[w] is 1 when every member of item w sees every token of its group (always, for
    DeFT-Node; for DeFT-Flatten, when all of the block's segments have the members' bits set).
    Built once per tile shape and kept on `prepared`, so a repeated call launches at once.
    """
    cached = prepared.work_lists.get(queries_per_tile)
    if cached is None:
        counts = (prepared.group_ptr[1:] - prepared.group_ptr[:-1]).long()
        tiles = (counts + queries_per_tile - 1) // queries_per_tile
        groups = torch.repeat_interleave(torch.arange(len(tiles), device=prepared.device), tiles)
        first_item = torch.cumsum(tiles, 0) - tiles
        tile = torch.arange(len(groups), device=prepared.device) - torch.repeat_interleave(first_item, tiles)
        dense = _dense_items(prepared, groups.tolist(), tile.tolist(), counts.tolist(), queries_per_tile)
        cached = (groups.to(torch.int32), tile.to(torch.int32), _ints(dense, prepared.device))
        prepared.work_lists[queries_per_tile] = cached
    return cached


def _dense_items(prepared: KVGroups, groups: list[int], tiles: list[int], counts: list[int],
                 queries_per_tile: int) -> list[int]:
    """1 for each work item (group, tile) whose members see every token of the group, else 0."""
    if not isinstance(prepared, FlattenBlocks):
        return [1] * len(groups)
    block_segments: dict[int, list[list[int]]] = {}
    for start, words in zip(prepared.segment_start.tolist(), prepared.segment_words.tolist(), strict=True):
        block_segments.setdefault(start // prepared.block_tokens, []).append(words)
    blocks = prepared.group_block.tolist()
    dense = []
    for g, tile in zip(groups, tiles, strict=True):
        first = tile * queries_per_tile
        word, shift = divmod(first, WORD_BITS)  # a tile's members share one word (tile_shape)
        members = ((1 << min(queries_per_tile, counts[g] - first)) - 1) << shift
        dense.append(int(all(words[word] & members == members for words in block_segments[blocks[g]])))
    return dense


def _kv_descriptors(k, v, block_n: int, paged: bool):
    """(k_desc, v_desc, True): TMA tensor descriptors of whole (block_n, d) K and V tiles, where
    the hardware has the copy engine (compute capability 9.0 and later) and the KV is one
    contiguous (T, H_kv, d) array of 16-bit floats; else (k, v, False), and the kernels load
    through pointers (the interpreter, older GPUs, a paged cache, whose rows are gathered one
    by one, and float32, whose FMAs rather than its loads set the pace).
    TMA wants 16-byte aligned rows; k and v are checked contiguous here, so the row stride
    H_kv * d * itemsize is a multiple of 16 for every head dim the checks accept."""
    usable = (not paged and not runtime.SIMULATOR and k.is_cuda and k.dtype != torch.float32
              and torch.cuda.get_device_capability(k.device)[0] >= 9
              and all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (k, v)))
    if not usable:
        return k, v, False
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows, heads_kv, d = k.shape
    return (TensorDescriptor.from_tensor(k.view(rows, heads_kv * d), [block_n, d]),
            TensorDescriptor.from_tensor(v.view(rows, heads_kv * d), [block_n, d]), True)


def _partials_launch(q, k, v, prepared: KVGroups, slots, tiles: TileShape | None = None):
    """Allocate the partial buffers and return (a function launching phase 2's first kernel, buffers)."""
    n_queries, heads_q, d = q.shape
    heads_kv = k.shape[1]
    group = heads_q // heads_kv
    flatten = isinstance(prepared, FlattenBlocks)
    shape = tiles or tile_shape(d, group, prepared.block_tokens if flatten else None, dtype=q.dtype)
    work_group, work_tile, work_dense = _work_list(prepared, shape.queries_per_tile)
    out_part = poisoned_empty((prepared.num_partials, heads_q, d), dtype=torch.float32, device=q.device)
    lse_part = poisoned_empty((prepared.num_partials, heads_q), dtype=torch.float32, device=q.device)
    paged = slots is not None
    # The token loop is pipelined: num_stages K/V tiles in flight (tile_shape: float32 tiles are
    # twice as large, 64 KiB per K + V tile at d = 128, so they get at most 2).
    common = dict(HEADS_Q=heads_q, GROUP=group, QUERIES_PER_TILE=shape.queries_per_tile, D=d,
                  BLOCK_M=shape.block_m, BLOCK_N=shape.block_n, PAGED=paged,
                  PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=shape.num_warps,
                  num_stages=shape.num_stages)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    qk_scale = LOG2_E / math.sqrt(d)
    grid = (int(work_group.shape[0]), heads_kv)
    index = slots if paged else prepared.group_start  # an unused pointer when the KV is contiguous
    k_desc, v_desc, tma = _kv_descriptors(k, v, shape.block_n, paged)
    common["TMA"] = tma
    head = (q, k, v, index, k_desc, v_desc, out_part, lse_part, prepared.group_start, prepared.group_end,
            prepared.group_ptr, prepared.member_query, work_group, work_tile)
    if flatten:
        def launch():
            deft_flatten_kernel[grid](*head, work_dense, prepared.token_words, prepared.num_words, *strides,
                                      qk_scale, **common)
    else:
        def launch():
            deft_node_kernel[grid](*head, *strides, qk_scale, **common)
    return launch, out_part, lse_part


def _reduce_launch(out_part, lse_part, query_ptr, query_parts, out_dtype):
    """Allocate out and lse and return (a function launching the reduction, out, lse)."""
    n_queries = query_ptr.shape[0] - 1
    _, heads_q, d = out_part.shape
    out = poisoned_empty((n_queries, heads_q, d), dtype=out_dtype, device=out_part.device)
    lse = poisoned_empty((n_queries, heads_q), dtype=torch.float32, device=out_part.device)
    block_h = min(HEADS_PER_MERGE, triton.next_power_of_2(heads_q))
    grid = (n_queries, triton.cdiv(heads_q, block_h))

    def launch():
        reduce_partials_kernel[grid](out_part, lse_part, query_ptr, query_parts, out, lse,
                                     HEADS_Q=heads_q, D=d, BLOCK_H=block_h, num_warps=MERGE_WARPS)
    return launch, out, lse


def _kernels_of(prepared) -> tuple:
    """Phase 2's first kernel for `prepared` and the exercise helpers it calls (its rows and stores,
    notebook 12's step): what `require_written` must see written before a launch."""
    kernel = deft_flatten_kernel if isinstance(prepared, FlattenBlocks) else deft_node_kernel
    return kernel, tile_rows, store_partials, online_softmax_step


def _check(q, k, v, prepared, slots, kind: type | None = None) -> None:
    """Check phase 2's inputs against `prepared`, which must be of `kind` (default: either)."""
    kind = kind or (FlattenBlocks if isinstance(prepared, FlattenBlocks) else NodeGroups)
    check.attention_inputs(q, k, v, prepared, slots, kind,
                           "flatten_blocks" if kind is FlattenBlocks else "node_groups")


def group_partials(q, k, v, prepared: KVGroups, *, slots=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 2, step 1 alone: (out_part (P, H_q, d) float32, lse_part (P, H_q) float32).

    Row p is the partial of the p-th (group, query) pair of `prepared` (query
    prepared.member_query[p]): attention over the tokens of its group that the query sees,
    with their log-sum-exp (natural log). `prepared` from `node_groups` or `flatten_blocks`.
    """
    _check(q, k, v, prepared, slots)
    require_written(*_kernels_of(prepared))
    launch, out_part, lse_part = _partials_launch(q, k, v, prepared, slots)
    launch()
    return out_part, lse_part


def reduce_partials(out_part, lse_part, query_ptr, query_parts, *, out_dtype=torch.float32):
    """Phase 2, step 2 alone: merge each query's partials by LSE; return (out, lse).

    out_part (P, H_q, d) and lse_part (P, H_q) float32 partials; query i merges rows
    query_parts[query_ptr[i] : query_ptr[i + 1]] in that order. out is (Q, H_q, d) of
    `out_dtype`, lse (Q, H_q) float32 (natural log).
    """
    check.partials(out_part, lse_part, query_ptr, query_parts, out_dtype)
    require_written(reduce_partials_kernel)
    launch, out, lse = _reduce_launch(out_part, lse_part, query_ptr, query_parts, out_dtype)
    launch()
    return out, lse


def _launch_both(q, k, v, prepared, slots, tiles: TileShape | None = None):
    """A function that runs phase 2's two kernels and returns (out, lse), buffers it reuses."""
    require_written(*_kernels_of(prepared), reduce_partials_kernel)
    partials, out_part, lse_part = _partials_launch(q, k, v, prepared, slots, tiles)
    reduce, out, lse = _reduce_launch(out_part, lse_part, prepared.query_ptr, prepared.query_parts, q.dtype)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        partials()
        reduce()
        return out, lse
    return run


def prepare_attention(q, k, v, prepared: KVGroups, *, slots=None,
                      tiles: TileShape | None = None) -> Callable[[], torch.Tensor]:
    """Check the inputs once and return a function that runs only the two kernels.

    The attention functions check their inputs on every call (finite values, slot ranges:
    a pass over q, k and v and a wait for the GPU); a benchmark that wants the kernels' own
    time calls this once and times the function it returns. Each call returns the output
    (Q, H_q, d), written into the same buffer every time. `tiles` (from
    `course.topics.deft.tuning.tile_shape`) overrides the first kernel's launch settings, for
    benchmarks that time alternatives.
    """
    _check(q, k, v, prepared, slots)
    run = _launch_both(q, k, v, prepared, slots, tiles)
    return lambda: run()[0]


def _attention(q, k, v, prepared, slots, return_lse, kind):
    _check(q, k, v, prepared, slots, kind)
    out, lse = _launch_both(q, k, v, prepared, slots)()
    return (out, lse) if return_lse else out


def deft_node_attention(q, k, v, prepared: NodeGroups, *, slots=None, return_lse: bool = False):
    """DeFT-Node attention: q (Q, H_q, d) over the KV tree of `prepared` (from `node_groups`).

    k, v: (T, H_kv, d) in the flattened DFS layout, or with `slots` (T,) int32 a paged cache
    (S, H_kv, d). H_q a multiple of H_kv; d in 16, 32, 64, 128; float16, bfloat16 (GPU only) or
    float32, accumulated in float32. Returns out (Q, H_q, d) in q's dtype, and with
    return_lse=True also lse (Q, H_q) float32.
    """
    return _attention(q, k, v, prepared, slots, return_lse, NodeGroups)


def deft_flatten_attention(q, k, v, prepared: FlattenBlocks, *, slots=None, return_lse: bool = False):
    """DeFT-Flatten attention: as `deft_node_attention`, over the blocks of `flatten_blocks`."""
    return _attention(q, k, v, prepared, slots, return_lse, FlattenBlocks)
