"""DeFT: attention over a tree-structured KV cache, written the way the paper reads.

Yao et al., "DeFT: Decoding with Flash Tree-attention for Efficient Tree-structured LLM
Inference" (ICLR 2025). Several decoding branches share prefixes: a few-shot prompt with b
continuations, a tree of thoughts, a speculative token tree. Their KV cache is a tree.

The KV tree
-----------
Nodes 0..M-1 with a parent array ``parents`` numbered parent-before-child
(``parents[0] == -1``, ``0 <= parents[i] < i``), and ``lengths[i] >= 1`` tokens in node i.
The prompt is node 0, the root. ``query_nodes[i]`` is the node whose last token query i
continues: the query's own key and value are already appended to that node, so query i sees
exactly the tokens of every node on the root path of ``query_nodes[i]``, that node included.

The flattened token layout (DeFT-Flatten, §3.3)
------------------------------------------------
The nodes' tokens are concatenated in DFS preorder, children in increasing id (the order
of `pyspec_ref.trees.dfs_order`); ``token_offsets`` gives each node's first token. A
subtree is then one contiguous run of tokens, and the T tokens are numbered 0..T-1.

What this module specifies
--------------------------
* `tree_kv_attention`: the definition, softmax over each query's visible tokens.
* `node_groups`: DeFT-Node's KV-guided grouping (§3.2): one QKV group per node, holding
  the node's KV and every query that sees it.
* `flatten_blocks`: DeFT-Flatten's flattened tree KV splitting (§3.3, the DeFT-Flatten
  algorithm of the appendix): the token range cut into blocks of equal length; a block's
  queries are those that see any of its tokens, and each node piece ("segment") of the block
  carries a bitmask of the block's queries that see it.
* `group_partials` and `reduce_partials`: phase 2 (§3.4): each group's partial attention
  with its log-sum-exp, and the tree-topology-aware global reduction, which merges each
  query's partials by their LSE (the Flash-Decoding merge, `pyspec_ref.merge_attention`).
* `io_bytes`: the IO model comparing sequence-based decoding, a dense tree mask, DeFT-Node,
  DeFT-Flatten and the read-once floor (DeFT's IO comparison of KV, mask and partial IO).

Everything is standard-library Python on lists: slow, tiny, obviously correct.
"""

from __future__ import annotations

import math

from ._validate import as_sequence, index, int_list, positive_int, real_matrix
from .attention import attention_with_lse, merge_attention
from .trees import ancestors, dfs_order, validate_topological

__all__ = [
    "flatten_blocks",
    "group_partials",
    "io_bytes",
    "node_groups",
    "reduce_partials",
    "token_offsets",
    "tree_kv_attention",
    "validate_kv_tree",
    "visible_tokens",
]

IO_METHODS = ("sequence", "dense_mask", "deft_node", "deft_flatten", "read_once")  # io_bytes' methods
PARTIAL_BYTES = 4  # partial outputs and their LSEs are float32 (fp32 accumulation)
INDEX_BYTES = 4  # query ids and token -> segment entries are int32


# --------------------------------------------------------------------------- the KV tree


def validate_kv_tree(
    parents: object, lengths: object, query_nodes: object = None
) -> tuple[list[int], list[int], list[int]]:
    """Check a KV tree and its queries; return (parents, lengths, query_nodes) as lists.

    DeFT's tree-structured KV cache (§3): `parents` numbered parent-before-child (the root,
    the prompt, is node 0), `lengths[i] >= 1` tokens per node, and `query_nodes` (when
    given; None means "no queries", an empty list) node ids, each the node a query continues.
    Several queries may continue the same node.
    """
    p = validate_topological(parents, "parents")
    sizes = int_list(lengths, "lengths")
    if len(sizes) != len(p):
        raise ValueError(f"lengths has {len(sizes)} entries, expected M = {len(p)} (one per node of parents)")
    for i, n in enumerate(sizes):
        if n < 1:
            raise ValueError(f"lengths[{i}] = {n}: every node holds at least one token")
    if query_nodes is None:
        return p, sizes, []
    nodes = int_list(query_nodes, "query_nodes")
    return p, sizes, [index(x, f"query_nodes[{i}]", len(p), "node") for i, x in enumerate(nodes)]


def token_offsets(parents: object, lengths: object) -> list[int]:
    """offsets[v] = the flattened index of node v's first token (DeFT §3.3, DFS flattening).

    Nodes are laid out in DFS preorder, children in increasing id, each node's tokens
    contiguous; node v holds tokens offsets[v] .. offsets[v] + lengths[v] - 1. The total
    T is sum(lengths).
    """
    p, sizes, _ = validate_kv_tree(parents, lengths)
    offsets = [0] * len(p)
    position = 0
    for v in dfs_order(p):
        offsets[v] = position
        position += sizes[v]
    return offsets


def _node_paths(p: list[int], query_nodes: list[int]) -> list[list[int]]:
    """The root path of each query's node, root first (ancestors(), reversed)."""
    return [list(reversed(ancestors(p, node))) for node in query_nodes]


def visible_tokens(parents: object, lengths: object, query_nodes: object) -> list[list[int]]:
    """The flattened token indices each query sees, increasing (DeFT's tree-structured KV cache).

    Query i sees every token of every node on the root path of query_nodes[i] (the node
    itself included). In DFS preorder an ancestor's tokens come before its descendants', so
    the list is the path's node ranges concatenated root first.
    """
    p, sizes, nodes = validate_kv_tree(parents, lengths, query_nodes)
    offsets = token_offsets(p, sizes)
    return [
        [t for v in path for t in range(offsets[v], offsets[v] + sizes[v])]
        for path in _node_paths(p, nodes)
    ]


def _visibility_mask(tokens: list[list[int]], total: int) -> list[list[bool]]:
    rows = []
    for seen in tokens:
        row = [False] * total
        for t in seen:
            row[t] = True
        rows.append(row)
    return rows


def tree_kv_attention(
    q: object,
    k: object,
    v: object,
    parents: object,
    lengths: object,
    query_nodes: object,
    scale: object = None,
) -> tuple[list[list[float]], list[float]]:
    """(out, lse) of attention over a KV tree, one head: the definition DeFT computes.

    q is Q x d (row i = query i), k and v are T x d in the flattened layout
    (`token_offsets`). out[i] = softmax over the tokens query i sees (`visible_tokens`) of
    scale * q[i].k[t], applied to v; lse[i] is the log-sum-exp of those scores
    (`pyspec_ref.attention_with_lse` with that Q x T mask). Scale defaults to 1/sqrt(d).
    """
    p, sizes, nodes = validate_kv_tree(parents, lengths, query_nodes)
    total = sum(sizes)
    q_rows = real_matrix(q, "q", n_rows=len(nodes), rows_note=f"Q = {len(nodes)} (one per query node)")
    real_matrix(k, "k", n_rows=total, rows_note=f"T = {total} (the tree's tokens, sum of lengths)")
    mask = _visibility_mask(visible_tokens(p, sizes, nodes), total)
    return attention_with_lse(q_rows, k, v, mask, scale)


# --------------------------------------------------------------------------- phase 1: grouping


def _queries_by_node(p: list[int], nodes: list[int]) -> list[list[int]]:
    """seen_by[v] = the queries whose root path holds node v, increasing."""
    seen_by: list[list[int]] = [[] for _ in p]
    for i, path in enumerate(_node_paths(p, nodes)):
        for v in path:
            seen_by[v].append(i)
    return seen_by


def node_groups(
    parents: object, lengths: object, query_nodes: object
) -> list[tuple[int, int, int, list[int]]]:
    """DeFT-Node's QKV groups (§3.2, KV-guided grouping): one per node some query sees.

    Each group is (node, token_start, token_end, queries): the node's KV, tokens
    [token_start, token_end) of the flattened layout, with every query that sees the node
    (increasing ids). Nodes in increasing id; a node no query sees forms no group. Each
    node's KV is then loaded once for all the queries that share it, instead of once per
    query as in sequence-based decoding.
    """
    p, sizes, nodes = validate_kv_tree(parents, lengths, query_nodes)
    offsets = token_offsets(p, sizes)
    seen_by = _queries_by_node(p, nodes)
    return [
        (v, offsets[v], offsets[v] + sizes[v], list(seen_by[v]))
        for v in range(len(p))
        if seen_by[v]
    ]


def flatten_blocks(
    parents: object, lengths: object, query_nodes: object, block_tokens: object, word_bits: object = 64
) -> list[dict]:
    """DeFT-Flatten's QKV groups (§3.3: flattened tree KV splitting and its bit mask).

    The flattened tokens [0, T) are cut into blocks of `block_tokens` (the last may be
    shorter). Block b is a dict:

    * "token_start", "token_end": its tokens [b * block_tokens, min(T, (b + 1) * block_tokens));
    * "queries": the queries that see at least one of its tokens, increasing ids;
    * "segments": the pieces of nodes inside the block, in token order, each
      (node, token_start, token_end, mask_words): a node cut by a block boundary gives one
      segment in each block it touches. Bit j of mask_words[w] (an int of `word_bits` bits,
      least significant bit first) is set iff block query number w * word_bits + j, i.e.
      queries[w * word_bits + j], sees that node. There are ceil(len(queries) / word_bits)
      words (none for a block no query sees).

    The segments tile [0, T) exactly. A block no query sees is still listed (its "queries"
    is empty); a kernel skips it.
    """
    p, sizes, nodes = validate_kv_tree(parents, lengths, query_nodes)
    block = positive_int(block_tokens, "block_tokens")
    bits = positive_int(word_bits, "word_bits")
    offsets = token_offsets(p, sizes)
    seen_by = _queries_by_node(p, nodes)
    total = sum(sizes)
    order = dfs_order(p)  # the nodes in token order
    blocks = []
    for start in range(0, total, block):
        end = min(start + block, total)
        pieces = [
            (v, max(start, offsets[v]), min(end, offsets[v] + sizes[v]))
            for v in order
            if offsets[v] < end and offsets[v] + sizes[v] > start
        ]
        queries = sorted({i for v, _, _ in pieces for i in seen_by[v]})
        position = {i: j for j, i in enumerate(queries)}
        n_words = -(-len(queries) // bits)
        segments = []
        for v, s, e in pieces:
            words = [0] * n_words
            for i in seen_by[v]:
                j = position[i]
                words[j // bits] |= 1 << (j % bits)
            segments.append((v, s, e, words))
        blocks.append({"token_start": start, "token_end": end, "queries": queries, "segments": segments})
    return blocks


# --------------------------------------------------------------------------- phase 2: partials


def _group_members(group: object, where: str, bits: int) -> tuple[list[int], list[list[int]]]:
    """(query ids, the tokens each of them sees in this group) for a node group or a block."""
    if isinstance(group, dict):
        for key in ("queries", "segments"):
            if key not in group:
                raise ValueError(f"{where} has no {key!r} entry: expected a block of flatten_blocks")
        queries = int_list(group["queries"], f"{where}['queries']", allow_empty=True)
        tokens: list[list[int]] = [[] for _ in queries]
        for n, segment in enumerate(as_sequence(group["segments"], f"{where}['segments']", "a list")):
            name = f"{where}['segments'][{n}]"
            parts = as_sequence(segment, name, "(node, token_start, token_end, mask_words)")
            if len(parts) != 4:
                raise ValueError(f"{name} must be (node, token_start, token_end, mask_words)")
            s, e = int_list(parts[1:3], name)
            if s > e:
                raise ValueError(f"{name} has token_start {s} > token_end {e}")
            words = int_list(parts[3], f"{name} mask_words", allow_empty=True)
            for j in range(len(queries)):
                if j // bits < len(words) and words[j // bits] >> (j % bits) & 1:
                    tokens[j].extend(range(s, e))
        return queries, tokens
    parts = as_sequence(group, where, "(node, token_start, token_end, queries) or a block dict")
    if len(parts) != 4:
        raise ValueError(f"{where} must be (node, token_start, token_end, queries), got {len(parts)} items")
    s, e = int_list(parts[1:3], where)
    if s > e:
        raise ValueError(f"{where} has token_start {s} > token_end {e}")
    queries = int_list(parts[3], f"{where} queries")
    return queries, [list(range(s, e)) for _ in queries]


def group_partials(
    q: object, k: object, v: object, groups: object, scale: object = None, word_bits: object = 64
) -> list[list[tuple[int, list[float], float]]]:
    """DeFT phase 2, step 1 (§3.4): each QKV group's partial attention, with its LSE, per query.

    `groups` is the output of `node_groups` or of `flatten_blocks` (with the same
    `word_bits`). For every group g and every query i of g, the partial is attention of
    q[i] over the tokens of g that query i sees (a node group: all its tokens; a block: the
    segments whose bit for i is set), with that partial's log-sum-exp.

    Returns partials[i] = [(g, out, lse), ...] in increasing group index g: the partials
    of query i, as `reduce_partials` merges them. One head; q is Q x d, k and v T x d.
    """
    bits = positive_int(word_bits, "word_bits")
    q_rows = real_matrix(q, "q")
    k_rows = real_matrix(k, "k", n_cols=len(q_rows[0]), cols_note=f"d = {len(q_rows[0])} (the width of q)")
    v_rows = real_matrix(v, "v", n_rows=len(k_rows), rows_note=f"T = {len(k_rows)} (the rows of k)")
    partials: list[list[tuple[int, list[float], float]]] = [[] for _ in q_rows]
    for g, group in enumerate(as_sequence(groups, "groups", "a list of node groups or blocks")):
        queries, tokens = _group_members(group, f"groups[{g}]", bits)
        for i, seen in zip(queries, tokens, strict=True):
            index(i, f"groups[{g}] query", len(q_rows), "query")
            if not seen:
                continue  # a block query always sees a token; nothing to add otherwise
            for t in seen:
                index(t, f"groups[{g}] token", len(k_rows), "token")
            out, lse = attention_with_lse([q_rows[i]], [k_rows[t] for t in seen], [v_rows[t] for t in seen],
                                          scale=scale)
            partials[i].append((g, out[0], lse[0]))
    return partials


def reduce_partials(partials: object) -> tuple[list[list[float]], list[float]]:
    """Phase 2, step 2 (§3.4, tree-topology-aware global reduction): merge each query's partials.

    partials[i] is the list of (group, out, lse) of query i (`group_partials`). Query i's
    groups cover each of its visible tokens exactly once, so merging their partials by
    log-sum-exp (`pyspec_ref.merge_attention`, the Flash-Decoding merge) gives its exact
    attention. The math does not depend on the order; a kernel merges in increasing group
    index so that its float rounding does not either. Returns (out, lse), one row per query.
    """
    rows = as_sequence(partials, "partials", "a list (one entry per query) of lists of (group, out, lse)")
    outs, lses = [], []
    for i, parts in enumerate(rows):
        items = as_sequence(parts, f"partials[{i}]", "a list of (group, out, lse)")
        if not items:
            raise ValueError(f"partials[{i}] is empty: query {i} belongs to no group, so it sees no token")
        for n, item in enumerate(items):
            if len(as_sequence(item, f"partials[{i}][{n}]", "(group, out, lse)")) != 3:
                raise ValueError(f"partials[{i}][{n}] must be (group, out, lse)")
        try:
            out, lse = merge_attention([item[1] for item in items], [item[2] for item in items])
        except (TypeError, ValueError) as error:  # name the argument: merge_attention says outs/lses
            raise type(error)(f"partials[{i}]: {error}") from None
        if outs and len(out) != len(outs[0]):
            raise ValueError(f"partials[{i}] has output rows of {len(out)} values, partials[0] of "
                             f"{len(outs[0])}: every query's partials must have one width")
        outs.append(out)
        lses.append(lse)
    return outs, lses


# --------------------------------------------------------------------------- the IO model


def io_bytes(
    method: object,
    parents: object,
    lengths: object,
    query_nodes: object,
    d: object,
    heads_kv: object,
    heads_q: object,
    dtype_bytes: object,
    block_tokens: object = 256,
    query_block: object = 64,
    word_bits: object = 64,
) -> dict[str, int]:
    """Bytes one attention call moves between global memory and the chips' on-chip memory.

    DeFT's IO comparison (the KV-cache, mask and partial-result IO it tabulates for
    sequence-based decoding, a dense tree mask and DeFT). Returns
    {"kv", "queries", "masks", "partials", "total"} in bytes.

    Common assumptions. A token's KV is 2 * heads_kv * d * dtype_bytes bytes (a key and a
    value row per KV head). Every kernel is grouped-query aware: one program serves the
    heads_q / heads_kv query heads that share a KV head, so KV and masks are read once per
    KV head, not per query head. A group's queries fit on chip (a tile of queries stays
    resident while its KV streams by). Queries are read (heads_q * d * dtype_bytes bytes
    each time) and the output written once (Q * heads_q * d * dtype_bytes). Partials are
    float32: an output row and an LSE per query head, (d + 1) * 4 bytes, written by phase
    2's first step and read back by the reduction (counted twice). Index lists are int32.
    What an L2 cache would catch is still counted: this is DeFT's global-memory IO.

    * "sequence" (Flash-Decoding style, one sequence per query): each query reads its
      whole root path's KV, re-reading shared prefixes once per query. No mask (the
      sequence is exactly what it sees), no partials (one split per sequence).
    * "dense_mask" (Tree Attention-Medusa style): the queries, in blocks of `query_block`,
      each read the whole tree's KV (T tokens) with a Q x T mask of one byte per entry,
      read once per KV head.
    * "deft_node" (§3.2): each node some query sees is read once; each group reads its
      queries and the int32 ids of them (per KV head); one partial per (group, query).
    * "deft_flatten" (§3.3): each block some query sees is read once (block_tokens
      tokens, the last block shorter), with its queries, their ids, its segments' bitmask
      words (word_bits / 8 bytes each, ceil(queries / word_bits) per segment) and an int32
      token -> segment entry per token, all per KV head; one partial per (block, query).
    * "read_once": the floor: each token some query sees read once, queries read and
      output written once, nothing else.
    """
    if not isinstance(method, str) or method not in IO_METHODS:
        raise ValueError(f"method must be one of {IO_METHODS}, got {method!r}")
    p, sizes, nodes = validate_kv_tree(parents, lengths, query_nodes)
    if not nodes:
        raise ValueError("query_nodes must not be empty")
    d_, hkv, hq, nbytes = (
        positive_int(x, name)
        for x, name in ((d, "d"), (heads_kv, "heads_kv"), (heads_q, "heads_q"), (dtype_bytes, "dtype_bytes"))
    )
    if hq % hkv:
        raise ValueError(f"heads_q = {hq} must be a multiple of heads_kv = {hkv} (grouped-query attention)")
    block = positive_int(block_tokens, "block_tokens")
    qblock = positive_int(query_block, "query_block")
    bits = positive_int(word_bits, "word_bits")
    if bits % 8:
        raise ValueError(f"word_bits must be a multiple of 8 (whole bytes), got {bits}")

    kv_token = 2 * hkv * d_ * nbytes
    query_row = hq * d_ * nbytes  # one query (all its heads), or one output row
    partial_row = hq * (d_ + 1) * PARTIAL_BYTES
    n_queries = len(nodes)
    out_written = n_queries * query_row
    kv = queries = masks = partials = 0
    if method == "sequence":
        kv = sum(len(seen) for seen in visible_tokens(p, sizes, nodes)) * kv_token
        queries = n_queries * query_row + out_written
    elif method == "dense_mask":
        total = sum(sizes)
        kv = math.ceil(n_queries / qblock) * total * kv_token
        queries = n_queries * query_row + out_written
        masks = hkv * n_queries * total
    elif method == "deft_node":
        groups = node_groups(p, sizes, nodes)
        members = sum(len(g[3]) for g in groups)
        kv = sum(g[2] - g[1] for g in groups) * kv_token
        queries = members * query_row + out_written
        masks = hkv * members * INDEX_BYTES
        partials = 2 * members * partial_row
    elif method == "deft_flatten":
        blocks = [b for b in flatten_blocks(p, sizes, nodes, block, bits) if b["queries"]]
        members = sum(len(b["queries"]) for b in blocks)
        kv = sum(b["token_end"] - b["token_start"] for b in blocks) * kv_token
        queries = members * query_row + out_written
        words = sum(len(b["segments"]) * -(-len(b["queries"]) // bits) for b in blocks)
        tokens = sum(b["token_end"] - b["token_start"] for b in blocks)
        masks = hkv * (words * bits // 8 + members * INDEX_BYTES + tokens * INDEX_BYTES)
        partials = 2 * members * partial_row
    else:  # read_once
        seen = [False] * len(p)
        for path in _node_paths(p, nodes):
            for v in path:
                seen[v] = True
        kv = sum(n for n, s in zip(sizes, seen, strict=True) if s) * kv_token
        queries = n_queries * query_row + out_written
    return {"kv": kv, "queries": queries, "masks": masks, "partials": partials,
            "total": kv + queries + masks + partials}
