# Student copy, generated from solutions/triton_attention.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Notebook 12: tree attention in Triton, a flash-attention forward that skips invisible key blocks.

FlashAttention-2's loop (Dao, 2023, §3.1: one program per query block, the key blocks streamed
through an online softmax) with the tree mask of FlashSpecInfer §5.1: key c is visible to query r
iff start[c] <= start[r] and end[r] <= end[c], computed from the two blocks' DFS times by one
broadcast comparison. Each program walks only the key blocks in its query block's list (built
once per tree by the given `visible_blocks_kernel`), so an invisible key block costs nothing.
`online_softmax_step`, the masked update of one key block, is the helper DeFT (13-14), EMS-SD
(17) and SwiftSpec (18) call with masks of their own.

Scores and the softmax are float32 in log2 units (exp2, log2(e)/sqrt(d) folded into one scale);
P is cast to the input dtype for the second tl.dot; the LSE is float32, natural log. Configs,
block lists and the launcher the benches time: `course.topics.triton_attention.launch`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from course.core import interpreter
from course.core.launch import poisoned_empty
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.triton_attention import validate as check
from course.topics.triton_attention.launch import LOG2_E, config_for, dot_precision, visible_blocks
from course.topics.triton_attention.validate import HEAD_DIMS  # noqa: F401  (the checks read it here)

LN2 = tl.constexpr(0.6931471805599453)  # log(x) = log2(x) * ln(2): the LSEs back in natural log


@triton.jit
def online_softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """FlashAttention-2's inner step for one key block: fold its scores into the running state.

    q (BLOCK_M, D), k and v (BLOCK_N, D), visible (BLOCK_M, BLOCK_N) bool (or anything that
    broadcasts to it): which keys each row sees. The running state of every row, float32, in
    log2 units: m_i (BLOCK_M) the max score so far (-inf before any visible key), l_i (BLOCK_M)
    the sum of exp2(score - m_i), acc (BLOCK_M, D) the sum of exp2(score - m_i) * v. qk_scale =
    log2(e) / sqrt(d) (or another scale, times log2(e)). Returns the updated (m_i, l_i, acc);
    the caller divides acc by l_i once, after its loop. A row that has seen no key yet keeps
    m_i = -inf and l_i = acc = 0. DeFT (notebooks 13-14) and EMS-SD (notebook 17) call it too,
    with their own masks.
    """
    # The block's scores s (BLOCK_M, BLOCK_N), -inf where not visible; the new row max m_new; the
    # rescale factor of the old state; the probabilities p; the updated l_i and acc.
    # YOUR CODE HERE: exercise triton_attention.online_softmax_step, region 1 (delete the todo line when you start)
    todo("triton_attention.online_softmax_step", region=1, lines=8, defines="m_new, l_i, acc")
    return m_new, l_i, acc


@triton.jit
def tree_attention_kernel(Q, K, V, start, end, kv_count, kv_list, Out, Lse, N, H, TM, TN, qk_scale,
                          D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, RETURN_LSE: tl.constexpr):
    """One program per (query block, batch entry x head): FlashAttention-2's forward loop over
    the key blocks in this query block's list, masked by the tree's DFS intervals."""
    i = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    base = bh.to(tl.int64) * N * D  # q, k, v and out are contiguous (B, H, N, D)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    row_in = rows < N
    q = tl.load(Q + base + rows[:, None] * D + dims[None, :], mask=row_in[:, None], other=0.0)
    # A row past N gets the interval [-1, -1]: it sees no key, so its l stays 0 (the end divides by l).
    row_start = tl.load(start + b * N + rows, mask=row_in, other=-1)
    row_end = tl.load(end + b * N + rows, mask=row_in, other=-1)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scaled scores (log2)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, D], tl.float32)  # running sum of exp2(score - m_i) * v
    blocks = b * TM + i
    count = tl.load(kv_count + blocks)
    for index in range(0, count):
        j = tl.load(kv_list + blocks * TN + index)
        keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
        key_in = keys < N
        k = tl.load(K + base + keys[:, None] * D + dims[None, :], mask=key_in[:, None], other=0.0)
        v = tl.load(V + base + keys[:, None] * D + dims[None, :], mask=key_in[:, None], other=0.0)
        # A key past N gets the empty interval [N, -1], which contains no row.
        key_start = tl.load(start + b * N + keys, mask=key_in, other=N)
        key_end = tl.load(end + b * N + keys, mask=key_in, other=-1)
        # sees (BLOCK_M, BLOCK_N): the tree mask of this pair of blocks, two vectors of intervals
        # compared by broadcasting.
        # YOUR CODE HERE: exercise triton_attention.tree_attention_kernel, region 1 (delete the todo line when you start)
        todo("triton_attention.tree_attention_kernel", region=1, lines=1, defines="sees")
        m_i, l_i, acc = online_softmax_step(q, k, v, sees, m_i, l_i, acc, qk_scale, DOT_PRECISION)
    # After the loop: out = acc / l, stored in the input dtype for the rows < N, and (RETURN_LSE) each
    # row's natural-log LSE at Lse[bh, row]; m_i and l_i are in log2 units.
    # YOUR CODE HERE: exercise triton_attention.tree_attention_kernel, region 2 (delete the todo line when you start)
    todo("triton_attention.tree_attention_kernel", region=2, lines=6)


interpreter.prepare(online_softmax_step, tree_attention_kernel)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor, *, return_lse: bool = False):
    """softmax(q k^T / sqrt(d), masked by the tree) v for (B, H, N, d) q, k, v (float16, bfloat16 or
    float32; bfloat16 only on a GPU) and (B, N) int32 DFS times. Returns out (B, H, N, d) in q's
    dtype, or (out, lse) with lse float32 (B, H, N) when return_lse=True."""
    require_written(online_softmax_step, tree_attention_kernel)
    batch, heads, n, d = check.attention_inputs(q, k, v, start, end, return_lse)
    config = config_for(d, q.dtype)
    kv_count, kv_list = visible_blocks(start, end, config.block_m, config.block_n)
    tm, tn = kv_list.shape[1:]
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    lse = poisoned_empty((batch, heads, n), dtype=torch.float32, device=q.device) if return_lse else out
    tree_attention_kernel[(tm, batch * heads)](
        q, k, v, start, end, kv_count, kv_list, out, lse, n, heads, tm, tn, LOG2_E / math.sqrt(d),
        D=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, DOT_PRECISION=dot_precision(q.dtype),
        RETURN_LSE=return_lse, num_warps=config.num_warps, num_stages=config.num_stages)
    return (out, lse) if return_lse else out
