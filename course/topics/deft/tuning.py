"""DeFT's launch settings and block choice (notebooks 13 and 14), fitted to the H100.

`tile_shape` gives the tile sizes of phase 2's first kernel; `HEADS_PER_MERGE` and `MERGE_WARPS`
the merge's launch. `suggest_block_tokens` picks DeFT-Flatten's block length for a tree with a
cost model, `modelled_launch_time`, whose constants were fitted to a sweep of block lengths on
the H100. `course.topics.deft.launch` launches the kernels of `solutions/deft.py` (or the student's
lessons/deft.py) with these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

import pyspec_ref.deft as spec
from course.core import runtime
from course.core.validate import require_dot_block

from .validate import kv_tree

WORD_BITS = 64  # queries per bitmask word (int64): a tile's members never straddle one
MAX_GROUP = 64  # query heads per KV head that one tile can hold
SUGGESTED_MULTIPLE = 64  # suggest_block_tokens's blocks are whole K/V tiles of a GPU
# modelled_launch_time's constants, fitted to a sweep of block lengths on the H100. In the committed
# sweep (results/h100/deft.json, deft_flatten_sweep rows, which record the model beside the clock)
# the blocks they choose for the 12 benchmark trees run at 1.03x the best block's time on average,
# 1.11x at worst (the reasoning tree).
PROGRAM_OVERHEAD_TOKENS = 256  # a program's fixed work, in streamed tokens
MASKED_COST = 2.0  # a token of a masked program (loads its word, tests bits) against one of a dense one
LONE_PROGRAM_RATE = 0.8  # the share of an SM's speed that one program alone on it gets
# The merge's launch (reduce_partials_kernel): query heads per program and warps. After the
# partials, on five speculative trees, within 2 us (3 %) of the best of 1-32 heads x 2-8 warps
# x 1-3 stages (results/h100/logs/deft_diag_merge.log).
HEADS_PER_MERGE = 8
MERGE_WARPS = 8


# --------------------------------------------------------------------------- tile sizes


def _pow2_floor(x: int) -> int:
    return 1 << (x.bit_length() - 1)


@dataclass(frozen=True)
class TileShape:
    """Tile sizes of one phase-2 launch (fixed per head dim and GQA group: deterministic)."""

    block_m: int  # rows of a tile: (query, query head) pairs
    block_n: int  # tokens per K/V tile
    queries_per_tile: int  # block_m // group rounded down to a power of two <= 64
    num_warps: int
    num_stages: int  # K/V tiles in flight for 16-bit inputs (float32: at most 2)


def tile_shape(d: int, group: int, block_tokens: int | None = None, *, dtype: torch.dtype = torch.float16,
               block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
               num_stages: int | None = None) -> TileShape:
    """The tile sizes for head dim d, `group` query heads per KV head and inputs of `dtype`.

    Rows: 64 on a GPU (32 in the interpreter, where every op costs a NumPy call), at least
    the GQA group. A tile's members never straddle a 64-query bitmask word. K/V tiles of
    64 tokens (32 in the interpreter), at most a Flatten block. 16-bit inputs: 4 warps (one
    warpgroup: wgmma's 64 rows) and 3 stages, so that two programs fit on an SM (registers and
    shared memory, read with Nsight Compute on an H100); with 8 warps only one fits
    (`python -m course bench deft`'s deft_flatten_tiles rows time the alternatives).
    float32 (FMAs, no tensor cores): 8 warps at d = 128, and at most 2 stages. The keyword
    arguments override the defaults, for benchmarks that time alternatives.
    """
    if group > MAX_GROUP:
        raise ValueError(f"H_q / H_kv = {group} query heads per KV head is more than a tile holds "
                         f"(at most {MAX_GROUP})")
    block_m = block_m or max(runtime.pick(sim=32, gpu=64), triton.next_power_of_2(group))
    block_n = block_n or runtime.pick(sim=32, gpu=64)
    if block_tokens is not None:
        block_n = min(block_n, block_tokens)
    require_dot_block(block_m=block_m, block_n=block_n, d=d)
    if block_m < group:
        raise ValueError(f"block_m = {block_m} rows cannot hold the {group} query heads of one KV head")
    wide = dtype == torch.float32
    return TileShape(block_m, block_n, min(WORD_BITS, _pow2_floor(block_m // group)),
                     num_warps=num_warps or (8 if wide and d > 64 else 4),
                     num_stages=min(2, num_stages or 2) if wide else num_stages or 3)


# --------------------------------------------------------------------------- DeFT-Flatten's block length


def seen_masks(parents: list[int], query_nodes: list[int]) -> list[int]:
    """masks[v]: bit i set iff query i's root path holds node v."""
    masks = [0] * len(parents)
    for i, v in enumerate(query_nodes):
        while v != -1:
            masks[v] |= 1 << i
            v = parents[v]
    return masks


def block_loads(offsets: list[int], sizes: list[int], masks: list[int],
                block_tokens: int) -> list[tuple[int, int, bool]]:
    """(tokens, queries, masked) of each block some query sees. A block is masked when some of
    its queries miss some of its nodes: its programs then test bits, the others do not.
    offsets[v]: node v's first flattened token; masks: `seen_masks`."""
    blocks = -(-sum(sizes) // block_tokens)
    union, common = [0] * blocks, [-1] * blocks  # per block: queries seeing any / every node of it
    for v, (offset, size) in enumerate(zip(offsets, sizes, strict=True)):
        for block in range(offset // block_tokens, (offset + size - 1) // block_tokens + 1):
            union[block] |= masks[v]
            common[block] &= masks[v]
    total = sum(sizes)
    return [(min(block_tokens, total - b * block_tokens), union[b].bit_count(), union[b] != common[b])
            for b in range(blocks) if union[b]]


def block_candidates(total_tokens: int) -> list[int]:
    """The block lengths `suggest_block_tokens` weighs: whole 64-token K/V tiles, the tree cut into
    n equal blocks (n = 1..64) and the powers of two."""
    def whole_tiles(tokens: int) -> int:
        return -(-tokens // SUGGESTED_MULTIPLE) * SUGGESTED_MULTIPLE

    cuts = {whole_tiles(-(-total_tokens // n)) for n in range(1, 65)}
    longest = whole_tiles(total_tokens)
    powers = {SUGGESTED_MULTIPLE << k for k in range(32) if SUGGESTED_MULTIPLE << k <= longest}
    return sorted(cuts | powers)


def _modelled_time(offsets, sizes, masks, queries_per_tile: int, heads_kv: int, block_tokens: int,
                   sms: int) -> float:
    costs = [(tokens * (MASKED_COST if masked else 1.0) + PROGRAM_OVERHEAD_TOKENS,
              -(-queries // queries_per_tile))
             for tokens, queries, masked in block_loads(offsets, sizes, masks, block_tokens)]
    total = heads_kv * sum(cost * tiles for cost, tiles in costs)
    return max(total / sms, max(cost for cost, _ in costs) / LONE_PROGRAM_RATE)


def modelled_launch_time(parents, lengths, query_nodes, heads_q: int, heads_kv: int, d: int,
                         block_tokens: int, sms: int) -> float:
    """Phase 2's time for DeFT-Flatten blocks of `block_tokens`, in a model, in units of streamed tokens.

    A program streams its block's tokens (x MASKED_COST if it tests bits) after a fixed
    PROGRAM_OVERHEAD_TOKENS (its queries, its partials' stores). An SM runs two programs at
    once at full speed; a program alone on an SM gets LONE_PROGRAM_RATE of it. The time is
    the larger of the total work spread over the SMs and the longest program alone.
    """
    p, sizes, nodes = kv_tree(parents, lengths, query_nodes)
    per_tile = tile_shape(d, heads_q // heads_kv).queries_per_tile  # the same for every dtype
    return _modelled_time(spec.token_offsets(p, sizes), sizes, seen_masks(p, nodes), per_tile, heads_kv,
                          block_tokens, sms)


def _positive_int(value, name: str, what: str = "a positive int") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def suggest_block_tokens(parents, lengths, query_nodes, heads_q: int, heads_kv: int, d: int, *,
                         sms: int | None = None) -> int:
    """DeFT-Flatten's block length for a tree: the one `modelled_launch_time` finishes soonest.

    §3.3 leaves the block length open, and it trades costs. Every (block, query) pair writes
    and reads back a float32 partial per query head (`pyspec_ref.deft.io_bytes`, "partials"),
    and every program pays a fixed overhead: longer blocks, fewer of both. But the longest
    program sets a floor under the time, and a block that holds the tree's tips tests bits
    (masked), so a long block there is slower still. Candidates: `block_candidates`; ties go to
    the longer block. sms: the GPU's SMs (default: this GPU's; 4 in the interpreter).
    """
    p, sizes, nodes = kv_tree(parents, lengths, query_nodes)
    _positive_int(heads_kv, "heads_kv")
    if isinstance(heads_q, bool) or not isinstance(heads_q, int) or heads_q < 1 or heads_q % heads_kv:
        raise ValueError(f"heads_q must be a positive multiple of heads_kv = {heads_kv}, got {heads_q!r}")
    if sms is None:
        sms = 4 if runtime.SIMULATOR else torch.cuda.get_device_properties(
            torch.cuda.current_device()).multi_processor_count
    _positive_int(sms, "sms")
    offsets, masks = spec.token_offsets(p, sizes), seen_masks(p, nodes)
    per_tile = tile_shape(d, heads_q // heads_kv).queries_per_tile
    timed = [(_modelled_time(offsets, sizes, masks, per_tile, heads_kv, block, sms), -block)
             for block in block_candidates(sum(sizes))]
    return -min(timed)[1]
