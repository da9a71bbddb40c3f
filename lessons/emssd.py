# Student copy, generated from solutions/emssd.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Notebook 17: EMS-SD, attention over an unpadded multi-sample batch, in Triton.

Ni et al., "EMS-SD: Efficient Multi-sample Speculative Decoding for Accelerating Large Language
Models" (NAACL 2025), §3, specified in `pyspec_ref.kvcache`. "Unpad input tokens": the counts[b]
new tokens of each sample b are concatenated, q (T, H, d), `offsets` (the B + 1 exclusive prefix
sums of counts) says where each sample's start. "Unpad KV cache": sample b owns the rows from
kv_starts[b], kv_lengths[b] cached then counts[b] new; its token i sees [start_b, start_b + len_b + i].

`unpadded_attention_kernel`: one program per (tile of BLOCK_M consecutive flat tokens, query
head). It restores every row's sample and position by a binary search over `offsets` (ceil(log2 B)
steps, where the paper's Algorithm 2 scans the counts: B steps), then streams over the KV rows of
each sample its tile touches with the online softmax (notebook 12's `online_softmax_step`), rows of
other samples masked out: nothing is read for padding. The padded baseline is
`course.topics.kvcache.baselines`; the launch (grid, tiles, buffers) `course.topics.kvcache.launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from course.core import interpreter
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.core.validate import require_scale
from course.topics.kvcache import launch
from course.topics.kvcache.validate import Batch, check_batch, same_layout

from .triton_attention import LN2, online_softmax_step


@triton.jit
def unpadded_attention_kernel(
    q, k, v, out, lse, offsets, kv_starts, kv_lengths,
    total, stride_q_row, stride_q_head, stride_k_row, stride_k_head, stride_v_row, stride_v_head,
    stride_o_row, stride_o_head, qk_scale,
    BATCH: tl.constexpr, STEPS: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program per (tile of BLOCK_M flat tokens, query head); row r is flat token
    tile * BLOCK_M + r. The online softmax runs in base 2, the scale folded into qk_scale."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    valid = rows < total
    t = tl.minimum(rows, total - 1)  # padding rows past the end search as the last token
    # Index restoration: sample[r] = the last b in [0, BATCH) with offsets[b] <= t[r] (skipping
    # empty samples, whose offsets equal the next one's), by STEPS = ceil(log2 BATCH) halvings of
    # [lo, hi]; then position[r] = t[r] - offsets[sample[r]], the row's index among its sample's
    # new tokens. (The paper's Algorithm 2 scans the counts from sample 0 instead: BATCH steps.)
    # Then the first and the last sample of the tile's valid rows, b_first and b_last.
    # YOUR CODE HERE: exercise emssd.unpadded_attention_kernel, region 1 (delete the todo line when you start)
    todo("emssd.unpadded_attention_kernel", region=1, lines=11, defines="sample, position, b_first, b_last")
    q_tile = tl.load(q + rows.to(tl.int64)[:, None] * stride_q_row + head * stride_q_head + cols[None, :],
                     mask=valid[:, None], other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scores (log2 units)
    l = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)  # running sum of exp2(score - m) * v
    for b in range(b_first, b_last + 1):
        # Sample b: its count of new tokens (from offsets), its KV region (kv_starts[b] as int64, and
        # kv_lengths[b] cached rows), `mine`, the tile's real rows that belong to it, and `width`, the
        # keys of its region: its cached ones and its new ones, written right after them.
        # YOUR CODE HERE: exercise emssd.unpadded_attention_kernel, region 2 (delete the todo line when you start)
        todo("emssd.unpadded_attention_kernel", region=2, lines=6, defines="count, kv_start, kv_len, mine, width")
        if count > 0:
            for j0 in range(0, width, BLOCK_N):
                cols_kv = j0 + tl.arange(0, BLOCK_N)  # b's key indices in this block
                inside = cols_kv < width
                kv_rows = kv_start + cols_kv.to(tl.int64)
                k_tile = tl.load(k + kv_rows[:, None] * stride_k_row + kv_head * stride_k_head
                                 + cols[None, :], mask=inside[:, None], other=0.0)
                v_tile = tl.load(v + kv_rows[:, None] * stride_v_row + kv_head * stride_v_head
                                 + cols[None, :], mask=inside[:, None], other=0.0)
                # visible[r, c]: row r belongs to sample b and key j0 + c is one it sees: b's
                # cache and b's new tokens up to its own position (causal), i.e.
                # j <= kv_len + position[r] (which also keeps j inside b's region).
                # YOUR CODE HERE: exercise emssd.unpadded_attention_kernel, region 3 (delete the todo line when you start)
                todo("emssd.unpadded_attention_kernel", region=3, lines=1, defines="visible")
                # The online softmax step of notebook 12. Rows of other samples see nothing here:
                # their max may still be -inf, and the step keeps them at -inf and 0, without NaN.
                m, l, acc = online_softmax_step(q_tile, k_tile, v_tile, visible, m, l, acc, qk_scale,
                                                PRECISION)
    l = tl.where(l > 0, l, 1.0)  # every valid row sees at least its own key; padding rows none
    result = acc / l[:, None]
    out_rows = rows.to(tl.int64)
    tl.store(out + out_rows[:, None] * stride_o_row + head * stride_o_head + cols[None, :],
             result.to(out.dtype.element_ty), mask=valid[:, None])
    tl.store(lse + out_rows * tl.num_programs(1) + head, (m + tl.log2(l)) * LN2, mask=valid)


interpreter.prepare(unpadded_attention_kernel)


def unpadded_attention(q, k_cache, v_cache, counts, kv_starts, kv_lengths, *, scale=None,
                       return_lse: bool = False, checked: Batch | None = None):
    """EMS-SD attention of a concatenated batch over per-sample KV regions (§3), in Triton.

    q: (T, H, d) (T = sum(counts)); k_cache, v_cache: (S, H_kv, d), H a multiple of H_kv; counts,
    kv_starts, kv_lengths: one int >= 0 per sample (lists or 1-D int tensors), laid out as the
    module doc says. float16, bfloat16 (GPU only) or float32, accumulated in float32; d in
    HEAD_DIMS. Returns out (T, H, d) in q's dtype, and with return_lse=True also lse (T, H) float32
    (natural log). Equals `pyspec_ref.kvcache.unpadded_attention` per head.

    checked: `check_batch`'s result for this very layout from an earlier call (a model's layers
    share one batch); the index arguments are then not read, only the shapes compared with it.
    """
    require_scale(scale)
    if checked is None:
        batch = check_batch(q, k_cache, v_cache, counts, kv_starts, kv_lengths)
    else:
        batch = same_layout(checked, q, k_cache, v_cache)
    require_written(unpadded_attention_kernel, online_softmax_step)
    run, out, lse = launch.unpadded_launch(unpadded_attention_kernel, q, k_cache, v_cache, batch, scale)
    run()
    return (out, lse) if return_lse else out
