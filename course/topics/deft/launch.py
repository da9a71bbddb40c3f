"""Launching DeFT's phase 2 (notebooks 13 and 14): grids, buffers, tile shapes, TMA, timing.

The kernels are the student's (`lessons/deft.py`, or `solutions/deft.py` with
COURSE_IMPL=solutions); this module launches them. `partials_launch` and `reduce_launch` build a
function that launches one kernel into buffers allocated once, so a repeated call costs the
launch alone. `prepare_attention` loads the chosen implementation's kernels
(`course.core.impl.load`), checks the inputs once and returns a function that runs only the two
kernels: what the benches time.

On a Hopper GPU the whole tiles of contiguous 16-bit KV come through TMA tensor descriptors
(`kv_descriptors`): the copy engine computes the addresses and writes shared memory, so the
warps spend no registers or instructions on them. A paged cache (`slots`) gathers its rows one by
one through pointers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton

from course.core import runtime
from course.core.impl import load
from course.core.launch import poisoned_empty
from course.core.stubs import require_written
from course.topics.deft.groups import FlattenBlocks, KVGroups, check_inputs, work_list
from course.topics.deft.tuning import HEADS_PER_MERGE, MERGE_WARPS, TileShape, tile_shape


def kv_descriptors(k, v, block_n: int, paged: bool):
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


def partials_launch(kernel, q, k, v, prepared: KVGroups, slots, tiles: TileShape | None = None):
    """Allocate the partial buffers and return (a function launching `kernel`, phase 2's first
    kernel, deft_node_kernel or deft_flatten_kernel as `prepared` needs, out_part, lse_part)."""
    n_queries, heads_q, d = q.shape
    heads_kv = k.shape[1]
    group = heads_q // heads_kv
    flatten = isinstance(prepared, FlattenBlocks)
    shape = tiles or tile_shape(d, group, prepared.block_tokens if flatten else None, dtype=q.dtype)
    work_group, work_tile, work_dense = work_list(prepared, shape.queries_per_tile)
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
    qk_scale = math.log2(math.e) / math.sqrt(d)  # the kernels' softmax runs in base 2
    grid = (int(work_group.shape[0]), heads_kv)
    index = slots if paged else prepared.group_start  # an unused pointer when the KV is contiguous
    k_desc, v_desc, tma = kv_descriptors(k, v, shape.block_n, paged)
    common["TMA"] = tma
    head = (q, k, v, index, k_desc, v_desc, out_part, lse_part, prepared.group_start, prepared.group_end,
            prepared.group_ptr, prepared.member_query, work_group, work_tile)
    if flatten:
        def launch():
            kernel[grid](*head, work_dense, prepared.token_words, prepared.num_words, *strides, qk_scale,
                         **common)
    else:
        def launch():
            kernel[grid](*head, *strides, qk_scale, **common)
    return launch, out_part, lse_part


def reduce_launch(kernel, out_part, lse_part, query_ptr, query_parts, out_dtype):
    """Allocate out and lse and return (a function launching `kernel`, reduce_partials_kernel, out, lse)."""
    n_queries = query_ptr.shape[0] - 1
    _, heads_q, d = out_part.shape
    out = poisoned_empty((n_queries, heads_q, d), dtype=out_dtype, device=out_part.device)
    lse = poisoned_empty((n_queries, heads_q), dtype=torch.float32, device=out_part.device)
    block_h = min(HEADS_PER_MERGE, triton.next_power_of_2(heads_q))
    grid = (n_queries, triton.cdiv(heads_q, block_h))

    def launch():
        kernel[grid](out_part, lse_part, query_ptr, query_parts, out, lse, HEADS_Q=heads_q, D=d,
                     BLOCK_H=block_h, num_warps=MERGE_WARPS)
    return launch, out, lse


def attention_launch(partials_kernel, reduce_kernel, q, k, v, prepared: KVGroups, slots,
                     tiles: TileShape | None = None) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A function that runs phase 2's two kernels and returns (out, lse), buffers it reuses."""
    partials, out_part, lse_part = partials_launch(partials_kernel, q, k, v, prepared, slots, tiles)
    reduce, out, lse = reduce_launch(reduce_kernel, out_part, lse_part, prepared.query_ptr,
                                     prepared.query_parts, q.dtype)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        partials()
        reduce()
        return out, lse
    return run


def prepare_attention(q, k, v, prepared: KVGroups, *, slots=None, tiles: TileShape | None = None,
                      impl: str | None = None) -> Callable[[], torch.Tensor]:
    """Check the inputs once and return a function that runs only the two kernels of `impl`
    (default: COURSE_IMPL's, `course.core.impl.load`).

    The attention functions check their inputs on every call (finite values, slot ranges:
    a pass over q, k and v and a wait for the GPU); a benchmark that wants the kernels' own
    time calls this once and times the function it returns. Each call returns the output
    (Q, H_q, d), written into the same buffer every time. `tiles` (from
    `course.topics.deft.tuning.tile_shape`) overrides the first kernel's launch settings, for
    benchmarks that time alternatives.
    """
    deft = load("deft", impl)
    check_inputs(q, k, v, prepared, slots)
    kernel = deft.deft_flatten_kernel if isinstance(prepared, FlattenBlocks) else deft.deft_node_kernel
    require_written(kernel, deft.tile_rows, deft.store_partials, deft.online_softmax_step,
                    deft.reduce_partials_kernel)
    run = attention_launch(kernel, deft.reduce_partials_kernel, q, k, v, prepared, slots, tiles)
    return lambda: run()[0]
