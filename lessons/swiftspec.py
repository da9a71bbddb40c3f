# Student copy, generated from solutions/swiftspec.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Notebook 18: SwiftSpec's tree-aware KV cache, in Triton: in-place compaction and non-square attention.

SwiftSpec ("SwiftSpec: Ultra-Low Latency LLM Decoding by Scaling Asynchronous Speculative Decoding")
keeps a KV cache as [prefix | tree] (§3.2, Figure 5): rows 0..P-1 the committed prefix, the next T
rows the nodes of the current draft tree. The bookkeeping is specified in `pyspec_ref.kvcache`.

1. `compact_kernel`: after verification, the committed path's rows move to the end of the prefix
   and the surviving subtree is compacted after it (§3.2), in place, with the meaning of
   `pyspec_ref.kvcache.apply_moves` (every read sees the old cache). Every move shifts a row left
   (dst < src) and moves may overlap. One program owns one (sample, stacked row) slice, so programs
   never touch each other's bytes; inside it the moves, sorted by dst, go BLOCK_M at a time: load
   the chunk's sources, `tl.debug_barrier()`, store. Within a chunk that makes the moves
   simultaneous; across chunks a later move i has src_i > dst_i > dst_j for every earlier move j,
   so no load reads a row an earlier store wrote (memmove's front-to-back copy, tiled).

2. `tree_cache_attention_kernel`: the non-square attention of §3.1 (Figure 4): w query nodes against
   the whole cache, a w x (P + T) mask. Query q sees every prefix row, and tree row j iff
   kv_start[j] <= start[q] and end[q] <= kv_end[j] (FlashSpecInfer §5.1's interval test). One
   program per (block of packed (query head of a GQA group, query) rows, KV head, sample): the
   group's query heads share the KV head's loads. Whole prefix blocks need no mask; a tree block no
   row of the program sees is skipped before its K and V are loaded. FlashAttention-2's online
   softmax, fp32.

The launches (grids, tiles, buffers, Flash-Decoding's split of the keys and `merge_splits_kernel`)
are in `course.topics.kvcache.launch`, the baseline `naive_compact` in
`course.topics.kvcache.baselines`, input checks in `course.topics.kvcache.validate`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course.core import interpreter
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.core.validate import require_scale
from course.topics.kvcache import launch
from course.topics.kvcache import validate as check
from course.topics.kvcache.launch import plan_tensors  # noqa: F401  (the checks build their moves with it)
from course.topics.kvcache.validate import CacheBatch, check_attention_inputs, check_moves

from .triton_attention import LN2, online_softmax_step

# --------------------------------------------------------------------------- compaction


@triton.jit
def compact_kernel(cache, src, dst, counts, D, stride_b, stride_r, stride_c, stride_d, stride_moves,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (stacked row r, sample b): cache[b, r, dst[m]] = old cache[b, r, src[m]] for
    the sample's counts[b] moves, which are sorted by dst with dst < src (see the module doc)."""
    r = tl.program_id(0)
    b = tl.program_id(1)
    n = tl.load(counts + b)
    base = cache + b.to(tl.int64) * stride_b + r.to(tl.int64) * stride_r
    cols = tl.arange(0, BLOCK_D)
    col_in = cols < D
    for m0 in range(0, n, BLOCK_M):
        # This chunk's moves m0 .. m0 + BLOCK_M - 1, those below n live: their source and destination
        # slots (sample b's row of src and dst, stride_moves apart, as int64 for the addresses), then
        # their rows, each of D columns (col_in): read every source row of the chunk, wait until all
        # threads have read (a destination of one move can be the source of another move of the
        # chunk), then write the destinations.
        # YOUR CODE HERE: exercise swiftspec.compact_kernel, region 1 (delete the todo line when you start)
        todo("swiftspec.compact_kernel", region=1, lines=8)


# --------------------------------------------------------------------------- non-square attention


@triton.jit
def tree_cache_attention_kernel(
    Q, K, V, Out, Lse, q_start, q_end, kv_start, kv_end, prefix_lengths, tree_lengths, query_counts,
    W, C,
    stride_qb, stride_qh, stride_qw, stride_qd,
    stride_kb, stride_kh, stride_kc, stride_kd,
    stride_vb, stride_vh, stride_vc, stride_vd,
    qk_scale, SPLITS, Part_out, Part_lse, ROWS,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, RETURN_LSE: tl.constexpr, SPLIT_KV: tl.constexpr,
):
    """One program per (block of BLOCK_M packed rows and one of SPLITS key ranges, KV head,
    sample). Packed row p stands for query head kv_head * GROUP + p // W and query p % W (valid if
    p < GROUP * W and the query is not padding). Keys: the sample's rows [0, P + T) of the cache,
    prefix first, cut into SPLITS ranges of whole blocks; with SPLIT_KV each program writes its
    range's partial result and LSE (ROWS = B * Hq * W rows per split) for `merge_splits_kernel`."""
    tile = tl.program_id(0) // SPLITS
    split = tl.program_id(0) % SPLITS
    kv_head = tl.program_id(1)
    b = tl.program_id(2)
    packed = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    # Each packed row's query w (of W), its query head (the GQA group's heads share this KV head),
    # and whether it is real: inside the GROUP * W rows and not one of the sample's padding queries.
    # YOUR CODE HERE: exercise swiftspec.tree_cache_attention_kernel, region 1 (delete the todo line when you start)
    todo("swiftspec.tree_cache_attention_kernel", region=1, lines=4, defines="w, head, valid")
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    prefix = tl.load(prefix_lengths + b)
    used = tl.where(n_valid > 0, prefix + tl.load(tree_lengths + b), 0)  # nothing to do: no keys
    prefix = tl.minimum(prefix, used)
    # This program's key range [lo, hi): whole blocks, so the prefix/tree boundary `full` below
    # falls between ranges or inside one, never inside a block of the unmasked loop.
    chunk = tl.cdiv(tl.cdiv(used, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(used, lo + chunk)
    dims = tl.arange(0, D)
    b64 = b.to(tl.int64)
    q_rows = Q + b64 * stride_qb + head.to(tl.int64) * stride_qh + w.to(tl.int64) * stride_qw
    q = tl.load(q_rows[:, None] + dims[None, :] * stride_qd, mask=valid[:, None], other=0.0)
    qs = tl.load(q_start + b64 * W + w, mask=valid, other=-1)  # the query nodes' DFS intervals
    qe = tl.load(q_end + b64 * W + w, mask=valid, other=-1)
    k_base = K + b64 * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + kv_head.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scaled scores (log2)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, D], tl.float32)  # running sum of exp2(score - m_i) * v
    # 1. Whole blocks of the prefix: every query sees every row, no mask (padding rows compute
    #    zeros against them and are dropped at the end).
    full = (prefix // BLOCK_N) * BLOCK_N
    for j0 in range(lo, tl.minimum(full, hi), BLOCK_N):
        keys = (j0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        k = tl.load(k_base + keys[:, None] * stride_kc + dims[None, :] * stride_kd)
        v = tl.load(v_base + keys[:, None] * stride_vc + dims[None, :] * stride_vd)
        # Notebook 12's step, with every key visible (the prefix).
        m_i, l_i, acc = online_softmax_step(q, k, v, keys[None, :] >= 0, m_i, l_i, acc, qk_scale, PRECISION)
    # 2. The rest: the prefix's last partial block, then the tree rows, under the non-square mask.
    for j0 in range(tl.maximum(full, lo), hi, BLOCK_N):
        keys = j0 + tl.arange(0, BLOCK_N)
        # Which keys are rows of the sample (key_in: below `used`), of its prefix, of its tree; the
        # DFS interval [ks, ke] of the node stored in each tree row (row c of sample b: kv_start and
        # kv_end at b64 * C + c; nothing loaded for the other rows). Then visible[r, c]: packed row r
        # is a real query and key c is a prefix row, or a tree row holding an ancestor of r's node
        # (or the node itself): FlashSpecInfer's interval test.
        # YOUR CODE HERE: exercise swiftspec.tree_cache_attention_kernel, region 2 (delete the todo line when you start)
        todo("swiftspec.tree_cache_attention_kernel", region=2, lines=7, defines="key_in, visible")
        if tl.max(tl.max(visible.to(tl.int32), axis=1), axis=0) > 0:  # else skip the block's K, V
            rows64 = keys.to(tl.int64)
            k = tl.load(k_base + rows64[:, None] * stride_kc + dims[None, :] * stride_kd,
                        mask=key_in[:, None], other=0.0)
            v = tl.load(v_base + rows64[:, None] * stride_vc + dims[None, :] * stride_vd,
                        mask=key_in[:, None], other=0.0)
            m_i, l_i, acc = online_softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, PRECISION)
    sees = valid & (l_i > 0.0)  # a real query that saw at least one key
    l_safe = tl.where(sees, l_i, 1.0)
    out = tl.where(sees[:, None], acc / l_safe[:, None], 0.0)
    o_rows = ((b64 * (tl.num_programs(1) * GROUP) + head.to(tl.int64)) * W + w.to(tl.int64))
    in_range = packed < GROUP * W
    lse = tl.where(sees, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    if SPLIT_KV:  # a partial result: fp32, merged by LSE afterwards (Flash-Decoding)
        part = split * ROWS + o_rows
        tl.store(Part_out + part[:, None] * D + dims[None, :], out, mask=in_range[:, None])
        tl.store(Part_lse + part, lse, mask=in_range)
    else:
        tl.store(Out + o_rows[:, None] * D + dims[None, :], out.to(Out.dtype.element_ty),
                 mask=in_range[:, None])
        if RETURN_LSE:
            tl.store(Lse + o_rows, lse, mask=in_range)


interpreter.prepare(compact_kernel, tree_cache_attention_kernel)


# --------------------------------------------------------------------------- launchers


def compact(cache: torch.Tensor, src, dst, counts) -> torch.Tensor:
    """SwiftSpec §3.2 compaction, in place: cache[b, :, dst[b, m]] = old cache[b, :, src[b, m]] for
    m < counts[b]. cache: (B, R, C, d) (R stacked rows, e.g. layers x {k, v} x KV heads; C slots),
    any float dtype and strides; src/dst: (B, M) int32 (padded), counts (B,) int32. Moves must shift
    left (dst < src) with distinct destinations; they may overlap each other's sources (applied as if
    simultaneously, `pyspec_ref.kvcache.apply_moves`). Bad input raises ValueError/TypeError before
    anything is written. Returns cache."""
    moves = check_moves(cache, src, dst, counts)
    require_written(compact_kernel)
    return launch.compact_launch(compact_kernel, cache, moves)()


def tree_cache_attention(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end, prefix_lengths,
                         tree_lengths, *, query_counts=None, scale=None, return_lse: bool = False,
                         checked: CacheBatch | None = None):
    """SwiftSpec §3.1 non-square tree attention of W query nodes over a [prefix | tree] KV cache.

    q: (B, Hq, W, d); k_cache, v_cache: (B, Hkv, C, d) with Hq a multiple of Hkv (grouped-query
    attention), same dtype as q; views with a contiguous last dimension are fine (no copy is made).
    Sample b's rows [0, P_b) are its prefix (prefix_lengths, visible to every query) and rows
    [P_b, P_b + T_b) its tree (tree_lengths); kv_start/kv_end (B, C) int32 are the DFS times of the
    node in each tree row (rows in any order; prefix and unused entries ignored); q_start/q_end (B, W)
    the query nodes' DFS times. Query i sees tree row j iff kv_start[j] <= q_start[i] and
    q_end[i] <= kv_end[j]. query_counts (B,) optional: queries >= count are padding (output 0, LSE
    -inf). A query that sees no row at all also gets 0 (LSE -inf). float16, bfloat16 (GPU only) or
    float32, fp32 accumulation; d in 16, 32, 64, 128. Returns out (B, Hq, W, d) in q's dtype, and
    with return_lse=True also the natural-log LSE (B, Hq, W) float32. Equals
    `pyspec_ref.kvcache.nonsquare_tree_attention` per (sample, head).

    checked: `check_attention_inputs`' result for this very layout, from an earlier call (a model
    runs every layer over the same tree: checked once per step, not once per layer); the index
    arguments are then not read, and only the shapes of q and the caches are compared with it.
    """
    require_scale(scale)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if checked is None:
        checked = check_attention_inputs(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end,
                                         prefix_lengths, tree_lengths, query_counts)
    else:
        checked = check.same_cache_layout(checked, q, k_cache, v_cache)
    require_written(online_softmax_step, tree_cache_attention_kernel)
    return launch.tree_attention_launch(tree_cache_attention_kernel, q, k_cache, v_cache, checked, scale,
                                        return_lse)()
