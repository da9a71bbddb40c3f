"""Notebook 12's launch settings and the launchers a student does not write.

`tree_attention` in your lessons/triton_attention.py is the plain launcher: it checks its inputs,
takes the config of `config_for`, builds the block lists (`visible_blocks`) and launches your
`tree_attention_kernel`. The benches, grading's timing and the baselines of notebooks 14 and 18
time the kernels without the input checks: `prepare_attention(kernels, ...)` allocates once and
returns a function that only launches, `kernels` being the module whose kernels run (your
lessons/ copy or solutions/, as `course.core.impl.load` gives it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import triton

from course.core.launch import poisoned_empty
from course.core.stubs import require_written
from course.core.validate import require_dot_block, require_tree_times
from course.topics.triton_attention import validate as check
from course.topics.triton_attention.blocks import visible_blocks_kernel
from course.topics.triton_attention.validate import DTYPES, HEAD_DIMS

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the kernels' scores are in log2 units


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


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: float32 exactly ("ieee": no TF32 rounding of q, k, p, v)."""
    return "ieee" if dtype == torch.float32 else "tf32"


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


def _checked_config(config: Config | None, d: int, dtype: torch.dtype) -> Config:
    if config is None:
        return config_for(d, dtype)
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config or None, got {type(config).__name__}")
    require_dot_block(BLOCK_M=config.block_m, BLOCK_N=config.block_n, d=d)
    for name in ("num_warps", "num_stages"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.{name} must be a positive int, got {value!r}")
    if config.num_warps & (config.num_warps - 1):
        raise ValueError(f"config.num_warps must be a power of two, got {config.num_warps}")
    return config


def prepare_attention(kernels: ModuleType, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      start: torch.Tensor, end: torch.Tensor, *, return_lse: bool = False,
                      config: Config | None = None) -> Callable:
    """Check the inputs once and return a function that runs both kernels (the given block lists,
    then `kernels.tree_attention_kernel`) into preallocated outputs: what `tree_attention` does,
    minus the checks, for timing the kernels alone.

    The returned function has `.attention()`, which launches only the attention kernel on the
    block lists of the last call (for timing it without the once-per-tree kernel). `config`
    replaces `config_for(d, q.dtype)`, to compare configs on a GPU."""
    require_written(kernels.online_softmax_step, kernels.tree_attention_kernel)
    batch, heads, n, d = check.attention_inputs(q, k, v, start, end, return_lse)
    config = _checked_config(config, d, q.dtype)
    tm, tn = triton.cdiv(n, config.block_m), triton.cdiv(n, config.block_n)
    kv_count = poisoned_empty((batch, tm), dtype=torch.int32, device=q.device)
    kv_list = torch.zeros((batch, tm, tn), dtype=torch.int32, device=q.device)
    out = poisoned_empty(q.shape, dtype=q.dtype, device=q.device)
    lse = poisoned_empty((batch, heads, n), dtype=torch.float32, device=q.device) if return_lse else out
    qk_scale = LOG2_E / math.sqrt(d)

    def attention():
        kernels.tree_attention_kernel[(tm, batch * heads)](
            q, k, v, start, end, kv_count, kv_list, out, lse, n, heads, tm, tn, qk_scale,
            D=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, DOT_PRECISION=dot_precision(q.dtype),
            RETURN_LSE=return_lse, num_warps=config.num_warps, num_stages=config.num_stages)
        return (out, lse) if return_lse else out

    def both():
        visible_blocks_kernel[(tm, batch)](start, end, kv_count, kv_list, n, tm, tn,
                                           BLOCK_M=config.block_m, BLOCK_N=config.block_n)
        return attention()

    both.attention = attention
    return both
