"""Notebook 12: tree attention in Triton, a flash-attention forward that skips invisible key blocks.

Numba's kernels (notebooks 03-11c) spell out every thread: which row it loads, where it
stores it in shared memory, when the warp waits. A Triton program instead works on whole
blocks: `tl.load` of a (BLOCK_N, d) tile, `tl.dot` of two tiles on the tensor cores, and the
compiler chooses the threads, stages the tiles through shared memory and pipelines the loads
of the key loop (`num_stages`). What stays ours is the algorithm: FlashAttention-2's loop
(Dao, 2023, §3.1: one program per query block, the key blocks streamed through an online
softmax, rescaling folded into the accumulator) with the tree mask of FlashSpecInfer §5.1
(key c is visible to query r iff start[c] <= start[r] and end[r] <= end[c]) computed from the
two blocks' DFS times by one broadcast comparison.

Two kernels, as in the ladder's rung 10:
1. `visible_blocks_kernel`, once per tree (shared by the heads): for each query block, the
   list of the key blocks that some query of the block sees, and its length (given, in
   course/topics/triton_attention/blocks.py: it tests the same pairs as your mask);
2. `tree_attention_kernel`, grid (cdiv(N, BLOCK_M), B * H): each program walks only its
   query block's list, so an invisible key block costs nothing, not even a branch.

The step of that loop, the masked online-softmax update of one key block, is the @triton.jit
helper `online_softmax_step` (Triton inlines it): the kernel computes the tree mask of the pair
of blocks and hands it over. DeFT (notebooks 13-14) and EMS-SD (notebook 17) import the same
helper with masks of their own.

Inputs: q, k, v of shape (B, H, N, d) in float16, bfloat16 (GPU only: the interpreter's
bf16 tl.dot is wrong) or float32, d in HEAD_DIMS; start, end int32 (B, N) DFS times. Scores
and the softmax are float32 (exp2, with log2(e)/sqrt(d) folded into one scale); P is cast to
the input dtype for the second tl.dot; the output has the input dtype; the optional LSE is
float32 (natural log), for merging partial results (DeFT, notebooks 13-14).

Input checks live in `course.topics.triton_attention.validate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from course.core import interpreter
from course.core.launch import poisoned_empty
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.core.validate import require_dot_block, require_tree_times
from course.topics.triton_attention import validate as check
from course.topics.triton_attention.blocks import visible_blocks_kernel
from course.topics.triton_attention.validate import DTYPES, HEAD_DIMS

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the kernels' scores are in log2 units
LN2 = tl.constexpr(0.6931471805599453)  # log(x) = log2(x) * ln(2): their LSEs back in natural log


@dataclass(frozen=True)
class Config:
    """A kernel's tile sizes and launch settings: the same config for the same (d, dtype), always."""

    block_m: int  # query rows per program
    block_n: int  # keys per step of the loop
    num_warps: int
    num_stages: int  # copies of the K/V tiles in flight (Triton's software pipelining)


# One config per head dimension and input width, fixed (no autotuning: the result must not depend
# on which config won a race). 16-bit inputs take the tensor cores (wgmma on an H100) with 64 x 64
# tiles. float32 is computed exactly ("ieee": no TF32 rounding), with FMAs, which need far more
# registers per tile: smaller tiles and more warps keep it from spilling to local memory. The
# register counts were read from the compiled sm_90 code (Triton 3.6): none of these spills.
# `python -m course bench triton_attention configs` on a GPU times alternatives.
CONFIGS_16BIT = {16: Config(64, 64, 4, 3), 32: Config(64, 64, 4, 3), 64: Config(64, 64, 4, 3),
                 128: Config(64, 64, 4, 3)}
CONFIGS_FP32 = {16: Config(32, 32, 4, 2), 32: Config(32, 32, 4, 2), 64: Config(64, 32, 8, 2),
                128: Config(32, 32, 8, 2)}


def config_for(d: int, dtype: torch.dtype) -> Config:
    """The kernel's config for head dimension d and input dtype."""
    if d not in HEAD_DIMS:
        raise ValueError(f"d must be one of {HEAD_DIMS}, got {d!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype}")
    return (CONFIGS_FP32 if dtype == torch.float32 else CONFIGS_16BIT)[d]


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
    ### BEGIN SOLUTION
    # Scores in log2 units: qk_scale = log2(e) / sqrt(d), so exp2(s) = exp(q.k / sqrt(d)).
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row that has seen no key yet keeps m = -inf; subtracting 0 instead of -inf keeps
    # exp2(-inf - (-inf)) = NaN out: its p and alpha are then exp2(-inf) = 0.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)  # rescales what the earlier key blocks added
    p = tl.math.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    ### END SOLUTION
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
    # A row past N gets the interval [-1, -1]: it sees no key, and stays finite (see the end).
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
        ### BEGIN SOLUTION
        sees = (key_start[None, :] <= row_start[:, None]) & (row_end[:, None] <= key_end[None, :])
        ### END SOLUTION
        m_i, l_i, acc = online_softmax_step(q, k, v, sees, m_i, l_i, acc, qk_scale, DOT_PRECISION)
    # Every real row sees itself, so l > 0; a row past N has l = 0 and must not divide by it.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(Out + base + rows[:, None] * D + dims[None, :], out.to(Out.dtype.element_ty),
             mask=row_in[:, None])
    if RETURN_LSE:
        # log(sum exp(q.k / sqrt(d))) = ln(2) * (m + log2(l)), m and l in log2 units.
        lse = (m_i + tl.math.log2(l_safe)) * LN2
        tl.store(Lse + bh.to(tl.int64) * N + rows, lse, mask=row_in)


interpreter.prepare(online_softmax_step, tree_attention_kernel)


def visible_blocks(start: torch.Tensor, end: torch.Tensor, block_m: int = 64,
                   block_n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The key blocks each query block must visit: (kv_count (B, TM), kv_list (B, TM, TN)) int32,
    TM = cdiv(N, block_m), TN = cdiv(N, block_n); kv_list[b, i, :kv_count[b, i]] are the key
    blocks, in increasing order, in which some query of query block i sees some key."""
    batch, n = require_tree_times(start, end)
    require_dot_block(block_m=block_m, block_n=block_n)
    tm, tn = triton.cdiv(n, block_m), triton.cdiv(n, block_n)
    kv_count = poisoned_empty((batch, tm), dtype=torch.int32, device=start.device)
    kv_list = torch.zeros((batch, tm, tn), dtype=torch.int32, device=start.device)
    visible_blocks_kernel[(tm, batch)](start, end, kv_count, kv_list, n, tm, tn,
                                       BLOCK_M=block_m, BLOCK_N=block_n)
    return kv_count, kv_list


def prepare_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                      end: torch.Tensor, *, return_lse: bool = False,
                      config: Config | None = None) -> Callable:
    """Check the inputs once and return a function that runs both kernels into preallocated
    outputs (what `tree_attention` does, minus the checks: for timing the kernels alone).

    The returned function has `.attention()`, which launches only the attention kernel on the
    block lists of the last call (for timing it without the once-per-tree kernel). `config`
    replaces `config_for(d, q.dtype)`, to compare configs on a GPU."""
    require_written(online_softmax_step, tree_attention_kernel)
    batch, heads, n, d = check.attention_inputs(q, k, v, start, end, return_lse)
    if config is None:
        config = config_for(d, q.dtype)
    elif not isinstance(config, Config):
        raise TypeError(f"config must be a Config or None, got {type(config).__name__}")
    require_dot_block(BLOCK_M=config.block_m, BLOCK_N=config.block_n, d=d)
    for name in ("num_warps", "num_stages"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.{name} must be a positive int, got {value!r}")
    if config.num_warps & (config.num_warps - 1):
        raise ValueError(f"config.num_warps must be a power of two, got {config.num_warps}")
    tm, tn = triton.cdiv(n, config.block_m), triton.cdiv(n, config.block_n)
    kv_count = poisoned_empty((batch, tm), dtype=torch.int32, device=q.device)
    kv_list = torch.zeros((batch, tm, tn), dtype=torch.int32, device=q.device)
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    lse = poisoned_empty((batch, heads, n), dtype=torch.float32, device=q.device) if return_lse else out
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32: no TF32 rounding of q, k, p, v
    qk_scale = LOG2_E / math.sqrt(d)

    def attention():
        tree_attention_kernel[(tm, batch * heads)](
            q, k, v, start, end, kv_count, kv_list, out, lse, n, heads, tm, tn, qk_scale,
            D=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, DOT_PRECISION=precision,
            RETURN_LSE=return_lse, num_warps=config.num_warps, num_stages=config.num_stages)
        return (out, lse) if return_lse else out

    def both():
        visible_blocks_kernel[(tm, batch)](start, end, kv_count, kv_list, n, tm, tn,
                                           BLOCK_M=config.block_m, BLOCK_N=config.block_n)
        return attention()

    both.attention = attention
    return both


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor,
                   end: torch.Tensor, *, return_lse: bool = False):
    """softmax(q k^T / sqrt(d), masked by the tree) v for (B, H, N, d) q, k, v (float16, bfloat16 or
    float32; bfloat16 only on a GPU) and (B, N) int32 DFS times. Returns out (B, H, N, d) in q's
    dtype, or (out, lse) with lse float32 (B, H, N) when return_lse=True."""
    return prepare_attention(q, k, v, start, end, return_lse=return_lse)()
