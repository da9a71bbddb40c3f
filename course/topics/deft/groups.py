"""DeFT's phase 1, QKV preparation on the host (notebooks 13 and 14): what a student is given.

Yao et al., "DeFT: Decoding with Flash Tree-attention for Efficient Tree-structured LLM
Inference" (ICLR 2025). KV-guided grouping (§3.2): DeFT-Node makes one QKV group per node, the
node's tokens with every query that sees them. DeFT-Flatten (§3.3) cuts the DFS-flattened tokens
into blocks of equal length; a block's queries are those that see any of its tokens, and each
node piece of the block gets a bitmask of the block's queries that see it (64 queries per int64
word, as many words as the block needs). The result is a few small int32/int64 tensors
(`NodeGroups`, `FlattenBlocks`): each group's token range, its queries as a CSR list, and for
every query the positions of its partial results, in increasing group order. `work_list` cuts the
groups into the work items of phase 2's kernels (`solutions/deft.py`), and `work_item` (Triton)
reads a program's item back in them. The specification is
`pyspec_ref.deft`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from course.core import interpreter
from course.topics.deft import validate as check
from course.topics.deft.tuning import WORD_BITS


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



def check_inputs(q, k, v, prepared: KVGroups, slots, kind: type | None = None) -> None:
    """Check phase 2's inputs against `prepared`, which must be of `kind` (default: either)."""
    kind = kind or (FlattenBlocks if isinstance(prepared, FlattenBlocks) else NodeGroups)
    check.attention_inputs(q, k, v, prepared, slots, kind,
                           "flatten_blocks" if kind is FlattenBlocks else "node_groups")


def work_list(prepared: KVGroups, queries_per_tile: int) -> tuple[torch.Tensor, ...]:
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


@triton.jit
def work_item(work_group, work_tile, group_start, group_end, group_ptr):
    """In a phase-2 kernel launched over `work_list`'s items: this program's work item
    w = program_id(0), tile work_tile[w] of group g = work_group[w]: (tile, the group's tokens
    [token_start, token_end), its first partial `first` = group_ptr[g], its number of queries `count`)."""
    work = tl.program_id(0)
    g = tl.load(work_group + work)
    tile = tl.load(work_tile + work)
    token_start = tl.load(group_start + g)
    token_end = tl.load(group_end + g)
    first = tl.load(group_ptr + g)
    count = tl.load(group_ptr + g + 1) - first
    return tile, token_start, token_end, first, count


interpreter.prepare(work_item)
