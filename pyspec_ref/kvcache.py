"""KV-cache bookkeeping for batched and tree speculative decoding, written the way the papers read.

Two seed papers, two problems of the same kind: after verification, the KV cache must keep
exactly the entries of the accepted tokens, without paying for the ones that were not.

EMS-SD: multi-sample speculative decoding without padding
----------------------------------------------------------
Ni et al., "EMS-SD: Efficient Multi-sample Speculative Decoding for Accelerating Large
Language Models" (NAACL 2025), §3, Algorithm 2 and Appendix B. A batch of B samples; in one
step sample b feeds ``counts[b]`` new input tokens (its last accepted token plus its draft
tokens) and later accepts ``accepted[b] <= counts[b]`` of them.

* Vanilla: pad the inputs to the widest sample and keep every sample's KV cache the same
  length, so that the batch stays a rectangle. Every padding slot is computed and stored
  (`padded_layout`, `vanilla_kv_growth`).
* "Unpad KV cache": sample b owns a region of one flat cache starting at ``kv_starts[b]``;
  it holds ``kv_lengths[b]`` cached tokens, and the step's new tokens are written right
  after them. Each sample advances by its *own* accepted count (`advance_kv_lengths`).
* "Unpad input tokens": the new tokens of all samples are concatenated into one sequence,
  with ``counts`` and their prefix sums ``offsets`` (`concatenate_inputs`); the attention
  kernel restores each flat token's sample and position (`restore_indices`) and attends to
  its sample's cache plus its sample's new tokens causally (`unpadded_attention`).

Conventions: ``offsets`` has B + 1 entries, ``offsets[b]`` is sample b's first flat token and
``offsets[B]`` the total (the ``cu_seqlens`` of variable-length FlashAttention); a sample may
feed zero tokens (a finished sample) and then owns no flat token.

SwiftSpec: the tree-aware KV cache
----------------------------------
SwiftSpec ("SwiftSpec: Ultra-Low Latency LLM Decoding by Scaling Asynchronous Speculative
Decoding"), §3.1 (parallel tree generation, non-square tree attention, Figure 4) and §3.2
(tree-aware KV cache, Figure 5). The draft model's cache is laid out [prefix | tree]: slots
0..P-1 hold the committed prefix, and tree node v sits at slot ``P + start[v]``, its
FlashSpecInfer §5.1 DFS preorder index (`pyspec_ref.trees.dfs_times`). The tree's root is
the last committed token. After verification accepts a root path ``verified_path``:

* the path's nodes except its last are committed: their KV moves to the end of the prefix,
  in path order;
* the last verified node becomes the new root; its subtree survives, re-numbered in DFS
  order and compacted right after the new prefix (`reroot`, `compact_plan`);
* every other node is discarded.

Because the tree is stored in preorder, the surviving subtree is ONE contiguous run of
slots, and every move goes left (src >= dst): see `compact_plan` and `apply_moves_in_order`.
`nonsquare_tree_mask` / `nonsquare_tree_attention` give the attention of the w nodes being
expanded against the prefix and the whole tree (§3.1); `expand_tree` and `best_subtree`
give maximum-likelihood tree growth and the choice of the subtree sent for verification.

Everything is standard-library Python on lists: slow, tiny, obviously correct.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections.abc import Callable, Mapping

from ._validate import as_int, as_real, as_sequence, index, int_list, positive_int, real_matrix
from .attention import attention_with_lse
from .trees import depths, dfs_order, dfs_times, validate_parents, validate_times

__all__ = [
    "advance_kv_lengths",
    "apply_moves",
    "apply_moves_in_order",
    "best_subtree",
    "compact_plan",
    "concatenate_inputs",
    "expand_tree",
    "nonsquare_tree_attention",
    "nonsquare_tree_mask",
    "padded_layout",
    "reroot",
    "restore_index_scan",
    "restore_indices",
    "unpadded_attention",
    "unpadded_layout",
    "vanilla_kv_growth",
]

Matrix = list[list[float]]


# --------------------------------------------------------------------------- validation


def _nonneg_int(value: object, name: str) -> int:
    """`value` as an int >= 0."""
    n = as_int(value, name)
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def _nonneg_list(value: object, name: str, n: int | None = None, note: str = "") -> list[int]:
    """A non-empty list of ints >= 0, of length n if given."""
    items = int_list(value, name)
    if n is not None and len(items) != n:
        raise ValueError(f"{name} has {len(items)} entries, expected {note or n}")
    for i, x in enumerate(items):
        if x < 0:
            raise ValueError(f"{name}[{i}] = {x} must be >= 0")
    return items


def _batch(counts: object, *others: tuple[object, str]) -> tuple[list[int], ...]:
    """counts (one per sample, >= 0) and further per-sample int lists of the same length."""
    c = _nonneg_list(counts, "counts")
    note = f"B = {len(c)} (one per sample, like counts)"
    return (c, *(_nonneg_list(v, name, len(c), note) for v, name in others))


def _offsets(counts: list[int]) -> list[int]:
    """Exclusive prefix sums with the total appended: B + 1 entries."""
    return [0, *itertools.accumulate(counts)]


def _check_regions(starts: list[int], sizes: list[int], what: str, cache_len: int | None) -> None:
    """Sample regions [starts[b], starts[b] + sizes[b]) must lie in the cache and be disjoint."""
    for b, (s, n) in enumerate(zip(starts, sizes, strict=True)):
        if cache_len is not None and s + n > cache_len:
            raise ValueError(
                f"sample {b}'s {what} [{s}, {s + n}) runs past the end of the cache "
                f"({cache_len} slots): KV position out of range"
            )
    live = sorted((s, s + n, b) for b, (s, n) in enumerate(zip(starts, sizes, strict=True)) if n > 0)
    for (s0, e0, b0), (s1, e1, b1) in itertools.pairwise(live):
        if s1 < e0:
            raise ValueError(
                f"the {what}s of samples {b0} [{s0}, {e0}) and {b1} [{s1}, {e1}) overlap: "
                "each sample must own its own slots of the cache"
            )


# --------------------------------------------------------------------------- EMS-SD: inputs


def concatenate_inputs(tokens_per_sample: object) -> tuple[list[int], list[int], list[int]]:
    """EMS-SD §3 "unpad input tokens": (flat tokens, counts, offsets) of a ragged batch.

    The samples' new input tokens are concatenated with no padding; ``counts[b]`` is sample
    b's number of tokens and ``offsets`` (B + 1 entries) their exclusive prefix sums, so
    sample b's tokens are ``flat[offsets[b]:offsets[b + 1]]``. A sample may be empty.
    """
    samples = as_sequence(tokens_per_sample, "tokens_per_sample", "a list of per-sample token lists")
    if not samples:
        raise ValueError("tokens_per_sample must not be empty: a batch has at least one sample")
    rows: list[list[int]] = []
    for b, s in enumerate(samples):
        row = int_list(s, f"tokens_per_sample[{b}]", allow_empty=True)
        for i, t in enumerate(row):
            if t < 0:
                raise ValueError(f"tokens_per_sample[{b}][{i}] = {t}: a token id must be >= 0")
        rows.append(row)
    counts = [len(r) for r in rows]
    return [t for r in rows for t in r], counts, _offsets(counts)


def restore_index_scan(counts: object, token: object) -> tuple[int, int]:
    """(sample, position in sample) of flat token `token` by a linear scan (EMS-SD Algorithm 2).

    The paper's kernel restores each token's sample by walking the samples' counts from the
    first one, subtracting, until the token falls inside a sample: O(B) work for every
    token, repeated by every thread that handles it. Kept as the reference that
    `restore_indices` (O(log B) per token) is checked against.
    """
    c = _batch(counts)[0]
    t = index(token, "token", sum(c), "input token")
    b, rest = 0, t
    while rest >= c[b]:  # terminates: t < sum(c)
        rest -= c[b]
        b += 1
    return b, rest


def restore_indices(counts: object) -> list[tuple[int, int]]:
    """(sample, position in sample) of every flat token, by prefix sums and a binary search.

    EMS-SD §3 "unpad input tokens" restores each concatenated token's sample index and
    position inside the attention kernel; its Algorithm 2 scans the counts linearly
    (`restore_index_scan`). Better: compute the prefix sums ``offsets`` once (O(B), one
    scan for the whole batch instead of one per token) and find token t's sample as the
    last b with offsets[b] <= t, by binary search: ``bisect_right(offsets, t) - 1``,
    O(log B) per token, and every thread of a tile reads the same few offsets (cached).
    ``bisect_right`` skips empty samples (equal offsets) to the non-empty one that owns t.
    The position is t - offsets[sample]. (A precomputed per-token table is O(1) per token
    at O(total) memory.)
    """
    c = _batch(counts)[0]
    offsets = _offsets(c)
    out: list[tuple[int, int]] = []
    for t in range(offsets[-1]):
        b = bisect_right(offsets, t) - 1
        out.append((b, t - offsets[b]))
    return out


# --------------------------------------------------------------------------- EMS-SD: layouts


def _layout(counts: list[int], kv_lengths: list[int], padded: bool) -> dict[str, int]:
    """The slot arithmetic of one verification step (see `padded_layout`)."""
    batch = len(counts)
    real_inputs = sum(counts)
    real_kv = sum(kv_lengths) + real_inputs
    real_pairs = sum(c * n + c * (c + 1) // 2 for c, n in zip(counts, kv_lengths, strict=True))
    if padded:
        w, width = max(counts), max(kv_lengths)
        input_slots, kv_slots = batch * w, batch * (width + w)
        pairs = batch * (w * width + w * (w + 1) // 2)
    else:
        w, width = 0, 0
        input_slots, kv_slots, pairs = real_inputs, real_kv, real_pairs
    return {
        "batch": batch,
        "input_width": w,
        "kv_width": width,
        "input_slots": input_slots,
        "real_inputs": real_inputs,
        "wasted_input_slots": input_slots - real_inputs,
        "kv_slots": kv_slots,
        "real_kv": real_kv,
        "wasted_kv_slots": kv_slots - real_kv,
        "attention_pairs": pairs,
        "real_attention_pairs": real_pairs,
        "wasted_attention_pairs": pairs - real_pairs,
    }


def padded_layout(counts: object, kv_lengths: object) -> dict[str, int]:
    """Slots of one verification step in EMS-SD's vanilla (padded) batch (§3, Appendix B).

    Vanilla keeps the batch rectangular: inputs are padded to W = max(counts) per sample,
    and every sample's KV cache has the same length L = max(kv_lengths) (a sample that
    accepted fewer tokens in earlier steps carries padding slots). After the step's tokens
    are written every sample holds L + W slots. Returned (all ints):

    * ``input_slots`` = B*W, ``real_inputs`` = sum(counts), ``wasted_input_slots``;
    * ``kv_slots`` = B*(L + W), ``real_kv`` = sum(kv_lengths) + sum(counts), ``wasted_kv_slots``;
    * ``attention_pairs``: (query, key) pairs computed, B * sum_{i<W} (L + i + 1) (query i of
      a sample sees the cache and new tokens 0..i), vs ``real_attention_pairs`` =
      sum_b sum_{i<counts[b]} (kv_lengths[b] + i + 1), and ``wasted_attention_pairs``;
    * ``batch``, ``input_width`` = W, ``kv_width`` = L.
    """
    c, n = _batch(counts, (kv_lengths, "kv_lengths"))
    return _layout(c, n, padded=True)


def unpadded_layout(counts: object, kv_lengths: object) -> dict[str, int]:
    """`padded_layout`'s numbers for EMS-SD's unpadded batch (§3): nothing is wasted.

    Concatenated inputs (sum(counts) slots) and per-sample KV regions (kv_lengths[b] +
    counts[b] slots each): every ``wasted_*`` entry is 0; ``input_width`` and ``kv_width``
    are 0 (there is no common width).
    """
    c, n = _batch(counts, (kv_lengths, "kv_lengths"))
    return _layout(c, n, padded=False)


def vanilla_kv_growth(accepted_steps: object, kv_lengths: object) -> dict[str, list]:
    """How padding accumulates in the vanilla KV cache over decoding steps (EMS-SD §3, Appendix B).

    ``accepted_steps[s][b]`` tokens of sample b are accepted at step s. Vanilla keeps the
    samples aligned, so after each step every sample's cache grows by the batch's MAXIMUM
    accepted count; with EMS-SD's unpadded cache each sample grows by its own. Returns
    ``padded_length`` (the common length after each step), ``unpadded_lengths`` (per step,
    per sample) and ``wasted_kv_slots`` (per step: B * padded_length - sum of real lengths).
    The waste per step is B * E[max_b a_b] - sum_b E[a_b]: it grows with the batch size.
    """
    lengths = _nonneg_list(kv_lengths, "kv_lengths")
    steps = as_sequence(accepted_steps, "accepted_steps", "a list of per-step accepted-count lists")
    if not steps:
        raise ValueError("accepted_steps must not be empty")
    note = f"B = {len(lengths)} (one per sample, like kv_lengths)"
    padded, real = max(lengths), list(lengths)
    out: dict[str, list] = {"padded_length": [], "unpadded_lengths": [], "wasted_kv_slots": []}
    for s, row in enumerate(steps):
        a = _nonneg_list(row, f"accepted_steps[{s}]", len(lengths), note)
        padded += max(a)
        real = [n + x for n, x in zip(real, a, strict=True)]
        out["padded_length"].append(padded)
        out["unpadded_lengths"].append(list(real))
        out["wasted_kv_slots"].append(len(real) * padded - sum(real))
    return out


def advance_kv_lengths(
    kv_starts: object, kv_lengths: object, counts: object, accepted: object, capacities: object
) -> list[int]:
    """New per-sample cache lengths after verification (EMS-SD §3 "unpad KV cache").

    Sample b owns cache slots [kv_starts[b], kv_starts[b] + capacities[b]); it held
    kv_lengths[b] tokens, wrote counts[b] new ones after them and keeps the first
    accepted[b] of those: its new length is kv_lengths[b] + accepted[b], and its next
    tokens are written at kv_starts[b] + that length -- each sample advances by its own
    accepted count, with no padding. Refused: accepted[b] > counts[b] (more accepted than
    proposed), a step whose writes do not fit the sample's capacity (cache overflow), and
    overlapping sample regions.
    """
    c, starts, lengths, acc, caps = _batch(
        counts,
        (kv_starts, "kv_starts"),
        (kv_lengths, "kv_lengths"),
        (accepted, "accepted"),
        (capacities, "capacities"),
    )
    _check_regions(starts, caps, "region", None)
    for b in range(len(c)):
        if acc[b] > c[b]:
            raise ValueError(
                f"accepted[{b}] = {acc[b]} > counts[{b}] = {c[b]}: "
                "a sample cannot accept more tokens than it proposed"
            )
        if lengths[b] + c[b] > caps[b]:
            raise ValueError(
                f"cache overflow: sample {b} holds kv_lengths[{b}] = {lengths[b]} tokens and wrote "
                f"counts[{b}] = {c[b]} more, but capacities[{b}] = {caps[b]}"
            )
    return [n + a for n, a in zip(lengths, acc, strict=True)]


def unpadded_attention(
    q_flat: object,
    k_cache: object,
    v_cache: object,
    counts: object,
    kv_starts: object,
    kv_lengths: object,
    scale: object = None,
) -> tuple[Matrix, list[float]]:
    """Attention of a concatenated, unpadded batch over per-sample KV regions (EMS-SD §3).

    ``q_flat`` has one row per flat token (`concatenate_inputs` order). The step's new keys
    and values are already written after each sample's cached ones ("append, then attend"):
    sample b's token at position i sees cache slots [kv_starts[b], kv_starts[b] +
    kv_lengths[b] + i], i.e. its sample's cache and its sample's new tokens 0..i (causal).
    Returns (out, lse) as `pyspec_ref.attention_with_lse` (Vaswani et al., 2017 Eq. 1) per
    token. Refused: a region [start, start + length + count) out of the cache or
    overlapping another sample's, and q_flat rows not matching sum(counts).
    """
    c, starts, lengths = _batch(counts, (kv_starts, "kv_starts"), (kv_lengths, "kv_lengths"))
    total = sum(c)
    if total == 0:
        raise ValueError("counts are all 0: there is no query token to attend for")
    Q = real_matrix(q_flat, "q_flat", n_rows=total, rows_note=f"sum(counts) = {total}")
    d = len(Q[0])
    K = real_matrix(k_cache, "k_cache", n_cols=d, cols_note=f"d = {d} (the width of q_flat)")
    V = real_matrix(v_cache, "v_cache", n_rows=len(K), rows_note=f"{len(K)} (the rows of k_cache)")
    _check_regions(starts, [n + x for n, x in zip(lengths, c, strict=True)], "KV region", len(K))
    out: Matrix = []
    lse: list[float] = []
    for t, (b, i) in enumerate(restore_indices(c)):
        keys = range(starts[b], starts[b] + lengths[b] + i + 1)
        o, l = attention_with_lse([Q[t]], [K[j] for j in keys], [V[j] for j in keys], scale=scale)
        out.append(o[0])
        lse.append(l[0])
    return out, lse


# --------------------------------------------------------------------------- SwiftSpec: re-rooting


def _root_path(p: list[int], verified_path: object) -> list[int]:
    """verified_path as a list: starts at the root, each node a child of the one before."""
    path = int_list(verified_path, "verified_path")
    for i, v in enumerate(path):
        index(v, f"verified_path[{i}]", len(p), "node")
    if p[path[0]] != -1:
        raise ValueError(
            f"verified_path[0] = {path[0]} is not the root (node {p.index(-1)}): "
            "verified_path must be a path down from the root"
        )
    for i in range(1, len(path)):
        if p[path[i]] != path[i - 1]:
            raise ValueError(
                f"verified_path[{i}] = {path[i]} is not a child of verified_path[{i - 1}] = "
                f"{path[i - 1]} (its parent is {p[path[i]]}): verified_path must be a path "
                "down from the root"
            )
    return path


def reroot(parents: object, verified_path: object) -> dict[str, object]:
    """The draft tree after verification, re-rooted at the last verified node (SwiftSpec §3.2).

    ``verified_path`` is a root path [root, v1, ..., vk] of the tree. Returned:

    * ``prefix_nodes`` = [root, ..., v_{k-1}]: committed; their KV joins the prefix in order;
    * ``new_root`` = vk; ``kept``: vk's subtree in old ids, in DFS preorder (FlashSpecInfer
      §5.1, children by increasing id), so new node i is old node kept[i];
    * ``parents``: the kept subtree's parent array in new ids (new_root is node 0), and its
      DFS times ``start``, ``end`` (`pyspec_ref.trees.dfs_times`; start[i] == i);
    * ``new_of_old``: {old id: new id} for the kept nodes;
    * ``discarded``: sorted old ids that are neither committed nor kept (rejected branches).
    """
    p = validate_parents(parents)
    path = _root_path(p, verified_path)
    new_root = path[-1]
    start, end = dfs_times(p)
    kept = dfs_order(p)[start[new_root] : end[new_root] + 1]
    new_of_old = {old: new for new, old in enumerate(kept)}
    new_parents = [-1 if old == new_root else new_of_old[p[old]] for old in kept]
    new_start, new_end = dfs_times(new_parents)
    gone = set(path[:-1]) | set(kept)
    return {
        "prefix_nodes": path[:-1],
        "new_root": new_root,
        "kept": kept,
        "parents": new_parents,
        "start": new_start,
        "end": new_end,
        "new_of_old": new_of_old,
        "discarded": [v for v in range(len(p)) if v not in gone],
    }


def compact_plan(prefix_len: object, parents: object, verified_path: object) -> list[tuple[int, int]]:
    """The (src, dst) slot moves of SwiftSpec's tree-aware KV cache after verification (§3.2).

    Layout [prefix | tree]: node v at slot prefix_len + start[v] (DFS preorder). Committed
    node path[i] (i < k) moves to slot prefix_len + i, the end of the prefix; the kept
    subtree (new node j = `reroot`'s kept[j]) moves to prefix_len + k + j, the next free
    slots, in DFS order. The new prefix has prefix_len + k slots and the new tree follows.
    Moves with src == dst are left out (the entry is already in place). Sorted by dst.

    Properties (tested): every committed or kept entry lands exactly once, no two moves
    share a dst, and src >= dst for every move (a node's preorder index is at least its
    depth, and the subtree's run starts at start[vk] >= k): the cache only shifts left,
    which is why an in-order copy by increasing dst is safe (`apply_moves_in_order`).
    """
    p_len = _nonneg_int(prefix_len, "prefix_len")
    p = validate_parents(parents)
    r = reroot(p, verified_path)
    start, _ = dfs_times(p)
    committed = r["prefix_nodes"]
    dsts = [*committed, *r["kept"]]
    moves = [(p_len + start[v], p_len + slot) for slot, v in enumerate(dsts)]
    return sorted(((s, d) for s, d in moves if s != d), key=lambda m: m[1])


def _moves(cache: object, moves: object) -> tuple[list, list[tuple[int, int]]]:
    """The cache as a list and the moves as checked (src, dst) pairs."""
    entries = as_sequence(cache, "cache", "a sequence of cache entries (one per slot)")
    pairs = as_sequence(moves, "moves", "a sequence of (src, dst) pairs")
    n = len(entries)
    out: list[tuple[int, int]] = []
    written: dict[int, int] = {}
    for i, m in enumerate(pairs):
        pair = as_sequence(m, f"moves[{i}]", "a (src, dst) pair")
        if len(pair) != 2:
            raise ValueError(f"moves[{i}] has {len(pair)} entries, expected 2: (src, dst)")
        src = index(pair[0], f"moves[{i}] src", n, "cache slot")
        dst = index(pair[1], f"moves[{i}] dst", n, "cache slot")
        if dst in written:
            raise ValueError(
                f"moves[{i}] and moves[{written[dst]}] both write slot {dst}: "
                "one entry would be lost"
            )
        written[dst] = i
        out.append((src, dst))
    return entries, out


def apply_moves(cache: object, moves: object) -> list:
    """The cache after all moves, applied as if simultaneously (SwiftSpec §3.2 compaction).

    new[dst] = old[src] for every (src, dst); other slots keep their entries. Every read
    sees the OLD cache, so overlapping source and destination ranges are safe: this is
    the meaning a GPU compaction kernel must reproduce. Returns a new list; the given
    cache is never modified (so it is unchanged on error). Refused: slots out of range,
    two moves writing one slot.
    """
    entries, pairs = _moves(cache, moves)
    new = list(entries)
    for src, dst in pairs:
        new[dst] = entries[src]
    return new


def apply_moves_in_order(cache: object, moves: object) -> list:
    """The cache after the moves applied one by one, in list order, in place (SwiftSpec §3.2).

    The naive copy loop: a move reads the cache AS LEFT BY the earlier moves. It equals
    `apply_moves` iff no move reads a slot that an earlier move overwrote -- true for
    `compact_plan` (sorted by dst, every src >= dst: a left shift copied front to back,
    like memmove), false e.g. for a right shift [(0, 1), (1, 2)]. Returns a new list.
    """
    entries, pairs = _moves(cache, moves)
    new = list(entries)
    for src, dst in pairs:
        new[dst] = new[src]
    return new


# --------------------------------------------------------------------------- SwiftSpec: non-square masks


def nonsquare_tree_mask(
    start: object, end: object, query_nodes: object, prefix_len: object = 0
) -> list[list[bool]]:
    """Mask of w query nodes against [prefix | tree] (SwiftSpec §3.1, Figure 4).

    In parallel tree generation the draft model runs only the w nodes being expanded,
    but their keys are the whole cache: a w x (P + N) mask, not N x N. Row r is query
    node q = query_nodes[r]: the P prefix slots are all visible; tree slot j holds the
    node whose DFS start is j, visible iff it is an ancestor of q or q itself
    (FlashSpecInfer §5.1 interval test start[k] <= start[q] and end[q] <= end[k]).
    """
    s, e = validate_times(start, end)
    p_len = _nonneg_int(prefix_len, "prefix_len")
    queries = int_list(query_nodes, "query_nodes")
    node_at = [0] * len(s)
    for v, t in enumerate(s):
        node_at[t] = v
    rows: list[list[bool]] = []
    for r, q in enumerate(queries):
        q = index(q, f"query_nodes[{r}]", len(s), "node")
        tree = [s[k] <= s[q] and e[q] <= e[k] for k in node_at]
        rows.append([True] * p_len + tree)
    return rows


def nonsquare_tree_attention(
    q: object,
    k_cache: object,
    v_cache: object,
    start: object,
    end: object,
    query_nodes: object,
    prefix_len: object = 0,
    scale: object = None,
) -> tuple[Matrix, list[float]]:
    """Attention of w query nodes over [prefix | tree] with `nonsquare_tree_mask` (SwiftSpec §3.1).

    ``q`` has one row per entry of query_nodes; k_cache / v_cache hold at least P + N rows
    (prefix, then the tree in DFS order; rows beyond are unused capacity). Returns
    (out, lse) as `pyspec_ref.attention_with_lse` (Vaswani et al., 2017 Eq. 1).
    """
    mask = nonsquare_tree_mask(start, end, query_nodes, prefix_len)
    used = len(mask[0])
    Q = real_matrix(q, "q", n_rows=len(mask), rows_note=f"w = {len(mask)} (one per query node)")
    d = len(Q[0])
    K = real_matrix(k_cache, "k_cache", n_cols=d, cols_note=f"d = {d} (the width of q)")
    if len(K) < used:
        raise ValueError(
            f"k_cache has {len(K)} rows, but prefix_len + N = {used} slots are in use: "
            "KV position out of range"
        )
    V = real_matrix(v_cache, "v_cache", n_rows=len(K), rows_note=f"{len(K)} (the rows of k_cache)")
    return attention_with_lse(Q, K[:used], V[:used], mask, scale)


# --------------------------------------------------------------------------- SwiftSpec: tree growth


def _logprobs(dist: object, path: tuple[int, ...]) -> list[tuple[int, float]]:
    """logprobs_of(path) as (token, log-probability) pairs: tokens >= 0, finite values <= 0."""
    name = f"logprobs_of({path})"
    if not isinstance(dist, Mapping):
        raise TypeError(f"{name} must return a mapping token -> log-probability, got {type(dist).__name__}")
    out: list[tuple[int, float]] = []
    for tok, lp in dist.items():
        t = as_int(tok, f"a token of {name}")
        if t < 0:
            raise ValueError(f"{name} has token {t}: a token id must be >= 0")
        x = as_real(lp, f"{name}[{t}]")
        if x > 0.0:
            raise ValueError(f"{name}[{t}] = {x} is not a log-probability (must be <= 0)")
        out.append((t, x))
    return out


def expand_tree(
    logprobs_of: Callable[[tuple[int, ...]], Mapping[int, float]],
    root_token: object,
    w: object,
    steps: object,
) -> dict[str, list]:
    """Maximum-likelihood draft-tree expansion with a priority queue (SwiftSpec §3.1).

    Node 0 is the root, token ``root_token``, cumulative log-probability 0. Each node's
    candidate children come from ``logprobs_of(tokens on the root path, root first)`` (a
    mapping token -> log-probability, e.g. the draft's top-k); a candidate's cumulative
    log-probability is its parent's plus its own. Each of ``steps`` rounds pops the w most
    probable candidates from a heap (ties: first pushed first) and adds them as nodes; the
    draft model then runs those w nodes at once (the queries of `nonsquare_tree_mask`),
    which is the call to logprobs_of that pushes their children -- skipped after the last
    round. Returns ``parents``, ``tokens``, ``cum_logprob`` (per node, topologically
    numbered) and ``rounds`` (the node ids added in each round).
    """
    root = _nonneg_int(root_token, "root_token")
    width = positive_int(w, "w")
    n_steps = positive_int(steps, "steps")
    if not callable(logprobs_of):
        raise TypeError(f"logprobs_of must be callable, got {type(logprobs_of).__name__}")
    parents, tokens, cum, paths = [-1], [root], [0.0], [(root,)]
    heap: list[tuple[float, int, int, int]] = []
    order = itertools.count()

    def push_children(node: int) -> None:
        for t, lp in _logprobs(logprobs_of(paths[node]), paths[node]):
            heapq.heappush(heap, (-(cum[node] + lp), next(order), node, t))

    push_children(0)
    rounds: list[list[int]] = []
    for step in range(n_steps):
        added: list[int] = []
        while heap and len(added) < width:
            neg, _, parent, t = heapq.heappop(heap)
            parents.append(parent)
            tokens.append(t)
            cum.append(-neg)
            paths.append((*paths[parent], t))
            added.append(len(parents) - 1)
        rounds.append(added)
        if step < n_steps - 1:
            for node in added:
                push_children(node)
    return {"parents": parents, "tokens": tokens, "cum_logprob": cum, "rounds": rounds}


def best_subtree(parents: object, cumulative_logprob: object, size: object) -> list[int]:
    """The `size` most probable nodes, a connected subtree containing the root (SwiftSpec §3.1).

    SwiftSpec sends the most probable subtree of the draft tree for verification. Take
    the `size` nodes with the largest cumulative log-probability (ties: shallower first,
    then smaller id). Why this greedy choice is optimal: log-probabilities are <= 0, so
    cumulative log-probability never increases down a path (checked). Hence every chosen
    node's parent is chosen too (it ranks at least as high, and before it on ties), so the
    set is a connected subtree containing the root; and for any increasing score f (e.g.
    f = exp, the expected number of accepted tokens of SpecInfer-style verification under
    the draft's probabilities) its sum of f(cum) is the sum of the `size` largest values
    of f(cum) over all nodes, which no other node set of that size exceeds. Sorted ids.
    """
    p = validate_parents(parents)
    n = len(p)
    cum = [as_real(x, f"cumulative_logprob[{i}]") for i, x in enumerate(
        as_sequence(cumulative_logprob, "cumulative_logprob", "a sequence of real numbers"))]
    if len(cum) != n:
        raise ValueError(f"cumulative_logprob has {len(cum)} entries, expected N = {n} (one per node)")
    k = positive_int(size, "size")
    if k > n:
        raise ValueError(f"size = {k} is larger than the tree ({n} nodes)")
    for v in range(n):
        if p[v] != -1 and cum[v] > cum[p[v]]:
            raise ValueError(
                f"cumulative_logprob[{v}] = {cum[v]} > cumulative_logprob[{p[v]}] = {cum[p[v]]} "
                f"(its parent): log-probabilities are <= 0, so it cannot grow down a path"
            )
    depth = depths(p)
    ranked = sorted(range(n), key=lambda v: (-cum[v], depth[v], v))
    return sorted(ranked[:k])

