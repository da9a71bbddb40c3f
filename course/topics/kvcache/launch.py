"""Launching the kvcache kernels (notebooks 17 and 18): grids, buffers, tiles, the split merge, timing.

The kernels are the student's (`lessons/emssd.py` and `lessons/swiftspec.py`, or `solutions/` with
COURSE_IMPL=solutions); this module launches them. Each `*_launch` builds a function that launches
one kernel into buffers allocated once, so a repeated call costs the launch alone: the student's
launchers call it once, the `prepare_*` functions keep it. A `prepare_*` function loads the chosen
implementation's kernels (`course.core.impl.load`, default COURSE_IMPL's, or `impl=`), checks the
inputs once and returns that function: what the benches time and the capstone's CUDA graphs capture.

* EMS-SD (notebook 17): `unpadded_launch`, `prepare_unpadded_attention`; `search_steps`, the
  binary search's length.
* SwiftSpec (notebook 18): `compact_launch`, `prepare_compact`, `prepare_compact_buffers` (moves
  rewritten on the device between launches), `plan_tensors` (`pyspec_ref.kvcache.compact_plan`'s
  lists as the kernel's tensors); `tree_attention_launch`, `prepare_tree_attention`. Where the grid
  would leave SMs idle (`tuning.kv_splits`) the tree attention cuts the keys into ranges; each
  program writes its range's partial result and LSE, and `merge_splits_kernel` merges them by LSE
  (Flash-Decoding, Dao et al., 2023).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from course.core import interpreter, runtime
from course.core.impl import load
from course.core.launch import poisoned_empty
from course.core.stubs import require_written
from course.core.validate import require_dot_block, require_scale
from course.topics.kvcache import validate as check
from course.topics.kvcache.tuning import AttentionConfig, attention_config, kv_splits, unpadded_config
from course.topics.kvcache.validate import (
    Batch,
    CacheBatch,
    Moves,
    check_attention_inputs,
    check_batch,
    check_moves,
)

LOG2_E = math.log2(math.e)  # exp(x) = exp2(x * log2(e)): the kernels' scores are in log2 units

# --------------------------------------------------------------------------- EMS-SD (notebook 17)


def search_steps(batch: int) -> int:
    """Steps of the binary search over samples 0..B-1: ceil(log2 B) (0 for one sample)."""
    return (batch - 1).bit_length()


def unpadded_launch(kernel, q, k_cache, v_cache, batch: Batch, scale):
    """Allocate the outputs and return (a function launching `kernel`, unpadded_attention_kernel,
    out, lse)."""
    total, heads, d = q.shape
    group = heads // k_cache.shape[1]
    config = unpadded_config(d, q.dtype)
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    lse = poisoned_empty((total, heads), dtype=torch.float32, device=q.device)
    qk_scale = (1.0 / math.sqrt(d) if scale is None else float(scale)) * LOG2_E
    grid = (triton.cdiv(total, config.block_m), heads)
    args = (q, k_cache, v_cache, out, lse, batch.offsets, batch.starts, batch.lengths, total,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
            v_cache.stride(1), out.stride(0), out.stride(1), qk_scale)
    meta = dict(BATCH=batch.size, STEPS=search_steps(batch.size), GROUP=group, D=d,
                BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=config.num_warps)

    def launch():
        kernel[grid](*args, **meta)
    return launch, out, lse


def prepare_unpadded_attention(q, k_cache, v_cache, counts, kv_starts, kv_lengths, *, scale=None,
                               impl: str | None = None) -> Callable[[], torch.Tensor]:
    """Check once; return a function that only launches `impl`'s unpadded_attention_kernel (for
    timing). Returns out."""
    emssd = load("emssd", impl)
    require_scale(scale)
    batch = check_batch(q, k_cache, v_cache, counts, kv_starts, kv_lengths)
    require_written(emssd.unpadded_attention_kernel, emssd.online_softmax_step)
    launch, out, _ = unpadded_launch(emssd.unpadded_attention_kernel, q, k_cache, v_cache, batch, scale)

    def run() -> torch.Tensor:
        launch()
        return out
    return run


# ------------------------------------------------------------------ SwiftSpec: compaction (notebook 18)


def compact_config(d: int) -> tuple[int, int]:
    block_d = triton.next_power_of_2(d)
    block_m = runtime.pick(sim=16, gpu=max(16, min(128, 8192 // block_d)))
    return block_m, block_d


def compact_launch(kernel, cache: torch.Tensor, moves: Moves) -> Callable[[], torch.Tensor]:
    """A function launching `kernel`, compact_kernel, over `moves` (checked) in place; it returns cache."""
    batch, rows, _, d = cache.shape
    block_m, block_d = compact_config(d)
    args = (cache, moves.src, moves.dst, moves.counts, d, *cache.stride(), moves.src.stride(0))

    def launch() -> torch.Tensor:
        if moves.total:
            kernel[(rows, batch)](*args, BLOCK_M=block_m, BLOCK_D=block_d, num_warps=4)
        return cache
    return launch


def prepare_compact(cache: torch.Tensor, src, dst, counts, *,
                    impl: str | None = None) -> Callable[[], torch.Tensor]:
    """Check once; return a function that only launches `impl`'s compaction (for timing)."""
    kernel = load("swiftspec", impl).compact_kernel
    moves = check_moves(cache, src, dst, counts)
    require_written(kernel)
    return compact_launch(kernel, cache, moves)


def prepare_compact_buffers(cache: torch.Tensor, src, dst, counts, *,
                            impl: str | None = None) -> Callable[[], torch.Tensor]:
    """`prepare_compact` for moves that are rewritten on the device between launches (a decoder that
    builds each round's moves inside a CUDA graph). The buffers' dtypes, shapes and devices are
    checked once, with the moves they hold now; each launch then applies whatever they hold: int32,
    contiguous, sorted by dst with dst <= src (a move with dst == src leaves its row as it is) and
    distinct destinations. Nothing checks those later values: the caller's construction must
    guarantee them, as the moves of an accepted path do (path ids increase, so node i of the path
    moves from tree row id_i >= i to row i)."""
    kernel = load("swiftspec", impl).compact_kernel
    check_moves(cache, src, dst, counts)
    for name, buffer in (("src", src), ("dst", dst), ("counts", counts)):
        if buffer.dtype != torch.int32 or not buffer.is_contiguous():
            raise TypeError(f"{name} must be a contiguous int32 tensor: the kernel reads it as it is, "
                            f"got {buffer.dtype}{'' if buffer.is_contiguous() else ' (not contiguous)'}")
    require_written(kernel)
    return compact_launch(kernel, cache, Moves(src, dst, counts, total=src.shape[1]))


def plan_tensors(plans, device=None, width: int | None = None):
    """`pyspec_ref.kvcache.compact_plan` outputs (one list of (src, dst) per sample) as the
    (src, dst, counts) tensors of `compact`: src/dst int32 (B, M) padded with 0, counts int32 (B,).
    M = the longest plan (at least 1), or `width`."""
    rows, width = check.compact_plans(plans, width)
    src = torch.zeros((len(rows), width), dtype=torch.int32)
    dst = torch.zeros((len(rows), width), dtype=torch.int32)
    for b, pairs in enumerate(rows):
        for m, (s, t) in enumerate(pairs):
            src[b, m], dst[b, m] = s, t
    counts = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    device = device if device is not None else runtime.torch_device()
    return src.to(device), dst.to(device), counts.to(device)


# ------------------------------------------------------------------- SwiftSpec: attention (notebook 18)


@triton.jit
def merge_splits_kernel(Part_out, Part_lse, Out, Lse, ROWS, SPLITS, D: tl.constexpr, BLOCK_R: tl.constexpr,
                        RETURN_LSE: tl.constexpr):
    """BLOCK_R output rows per program: merge the SPLITS partial results of each row by their LSE
    (notebook 02's merge_attention, over S parts: weights exp(lse_s - max), a part that saw no key
    has lse = -inf and weight 0), in a fixed order (deterministic)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside = rows < ROWS
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for s in range(SPLITS):
        m = tl.maximum(m, tl.load(Part_lse + s * ROWS + rows, mask=inside, other=float("-inf")))
    safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, D], tl.float32)
    for s in range(SPLITS):
        weight = tl.exp(tl.load(Part_lse + s * ROWS + rows, mask=inside, other=float("-inf")) - safe)
        part = tl.load(Part_out + (s * ROWS + rows.to(tl.int64))[:, None] * D + dims[None, :],
                       mask=inside[:, None], other=0.0)
        total += weight
        acc += weight[:, None] * part
    seen = total > 0.0
    out = tl.where(seen[:, None], acc / tl.where(seen, total, 1.0)[:, None], 0.0)
    tl.store(Out + rows.to(tl.int64)[:, None] * D + dims[None, :], out.to(Out.dtype.element_ty),
             mask=inside[:, None])
    if RETURN_LSE:
        tl.store(Lse + rows, tl.where(seen, safe + tl.log(tl.where(seen, total, 1.0)), float("-inf")),
                 mask=inside)


interpreter.prepare(merge_splits_kernel)


def tree_attention_launch(kernel, q, k_cache, v_cache, checked: CacheBatch, scale, return_lse: bool,
                          config: AttentionConfig | None = None):
    """A function launching `kernel`, tree_cache_attention_kernel (and `merge_splits_kernel` where the
    keys are split), into outputs allocated once; it returns out, or (out, lse) with return_lse."""
    batch, heads, width, d = q.shape
    heads_kv, slots = k_cache.shape[1], k_cache.shape[2]
    group = heads // heads_kv
    config = config or attention_config(group * width, d, q.dtype)
    tiles = triton.cdiv(group * width, config.block_m)
    splits = config.splits or kv_splits(tiles * heads_kv * batch, slots, config.block_n, q.device)
    out = poisoned_empty((batch, heads, width, d), dtype=q.dtype, device=q.device)
    lse = poisoned_empty((batch, heads, width), dtype=torch.float32, device=q.device) if return_lse else out
    rows = batch * heads * width
    # The partial results of the key ranges (unused without a split: one element stands in).
    part_out = poisoned_empty((splits, rows, d) if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    part_lse = poisoned_empty((splits, rows) if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    qk_scale = (1.0 / math.sqrt(d) if scale is None else float(scale)) * LOG2_E
    grid = (tiles * splits, heads_kv, batch)
    args = (q, k_cache, v_cache, out, lse, checked.q_start, checked.q_end, checked.kv_start, checked.kv_end,
            checked.prefix_lengths, checked.tree_lengths, checked.query_counts, width, slots,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), qk_scale, splits, part_out, part_lse, rows)
    meta = dict(GROUP=group, D=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32", RETURN_LSE=return_lse,
                SPLIT_KV=splits > 1, num_warps=config.num_warps, num_stages=config.num_stages)
    merge_rows = 16

    def launch():
        kernel[grid](*args, **meta)
        if splits > 1:
            merge_splits_kernel[(triton.cdiv(rows, merge_rows),)](
                part_out, part_lse, out, lse, rows, splits, D=d, BLOCK_R=merge_rows, RETURN_LSE=return_lse)
        return (out, lse) if return_lse else out
    return launch


def prepare_tree_attention(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end, prefix_lengths,
                           tree_lengths, *, query_counts=None, scale=None, return_lse: bool = False,
                           config: AttentionConfig | None = None, impl: str | None = None) -> Callable:
    """Check once; return a function that only launches `impl`'s tree_cache_attention_kernel (for
    timing and for callers that reuse one checked layout). `config` overrides `attention_config`."""
    swiftspec = load("swiftspec", impl)
    require_scale(scale)
    checked = check_attention_inputs(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end, prefix_lengths,
                                     tree_lengths, query_counts)
    require_written(swiftspec.online_softmax_step, swiftspec.tree_cache_attention_kernel)
    if config is not None:
        require_dot_block(block_m=config.block_m, block_n=config.block_n, d=q.shape[-1])
    return tree_attention_launch(swiftspec.tree_cache_attention_kernel, q, k_cache, v_cache, checked, scale,
                                 return_lse, config)
