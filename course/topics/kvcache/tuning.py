"""The kvcache kernels' launch settings (notebooks 17 and 18): tile sizes and the Flash-Decoding split.

`course.topics.kvcache.launch` launches EMS-SD's `unpadded_attention_kernel` with
`unpadded_config`'s tiles, and SwiftSpec's `tree_cache_attention_kernel` with `attention_config`'s,
its keys cut into `kv_splits` ranges; callers that time alternatives pass their own
`AttentionConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course.core import runtime
from course.core.validate import require_dot_block

from .validate import HEAD_DIMS


@dataclass(frozen=True)
class UnpaddedConfig:
    """EMS-SD's tiles of one launch."""

    block_m: int  # flat query tokens per program
    block_n: int  # KV rows per step of the loop
    num_warps: int


def unpadded_config(d: int, dtype: torch.dtype = torch.float16) -> UnpaddedConfig:
    """EMS-SD's tiles for head dim d: 16 query rows (a sample feeds a few tokens; 16 is tl.dot's
    minimum), KV blocks of 64 rows on a GPU (16 in the interpreter, where every op is a NumPy call)."""
    if d not in HEAD_DIMS:
        raise ValueError(f"d must be one of {HEAD_DIMS}, got {d!r}")
    block_m = 16
    block_n = runtime.pick(sim=16, gpu=64 if d <= 64 else 32)
    require_dot_block(block_m=block_m, block_n=block_n, d=d)
    return UnpaddedConfig(block_m, block_n, num_warps=4)


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int  # packed (query head, query) rows per program
    block_n: int  # cache rows per step of the loop
    num_warps: int
    num_stages: int
    splits: int | None = None  # key ranges per (row block, KV head, sample); None: `kv_splits`


# Flash-Decoding (Dao et al., 2023): when W is small, (row blocks x KV heads x samples) programs
# are too few to fill the GPU (4 samples x 8 KV heads = 32 programs on 132 SMs), and each streams
# the whole prefix alone. Cutting the keys into ranges multiplies the programs; the partial results
# are merged by their LSE. Ranges of at least MIN_SPLIT_BLOCKS blocks keep the merge's extra bytes
# (one fp32 row of d per range) small next to the K and V each range reads.
MIN_SPLIT_BLOCKS = 4
MAX_SPLITS = 64


def kv_splits(programs: int, slots: int, block_n: int, device) -> int:
    """Key ranges per program so that about two programs run per SM (1: no split)."""
    # The interpreter runs programs one after another: count it as 2 SMs, so only tiny grids split.
    sms = 2 if runtime.SIMULATOR else torch.cuda.get_device_properties(device).multi_processor_count
    wanted = -(-2 * sms // max(programs, 1))
    return max(1, min(wanted, slots // (MIN_SPLIT_BLOCKS * block_n), MAX_SPLITS))


def attention_config(rows: int, d: int, dtype: torch.dtype) -> AttentionConfig:
    """Tiles for `rows` = GROUP * W packed query rows per (sample, KV head) and head dim d."""
    if d not in HEAD_DIMS:
        raise ValueError(f"d must be one of {HEAD_DIMS}, got {d!r}")
    block_m = runtime.pick(sim=16, gpu=16 if rows <= 16 else 32 if rows <= 32 else 64)
    block_n = runtime.pick(sim=16, gpu=32 if (dtype == torch.float32 and d >= 64) else 64)
    require_dot_block(block_m=block_m, block_n=block_n, d=d)
    return AttentionConfig(block_m, block_n, num_warps=4, num_stages=2)
