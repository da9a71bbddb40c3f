"""Argument checks of notebook 12's Triton tree attention; every message names the argument."""

from __future__ import annotations

import torch

from course.core.validate import (
    require_interpretable_dtype,
    require_same_shape,
    require_tensor,
    require_times_of,
)

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension, which holds B * H


def attention_inputs(q, k, v, start, end, return_lse) -> tuple[int, int, int, int]:
    """Check `prepare_attention`'s arguments, each error naming it; return (B, H, N, d)."""
    require_tensor(q, "q", ndim=4, dtypes=DTYPES)
    require_interpretable_dtype(q, "q")
    for name, tensor in (("k", k), ("v", v)):
        require_tensor(tensor, name, ndim=4, dtypes=(q.dtype,))  # one dtype for all three
        require_same_shape("q", q, name, tensor)
    batch, heads, n, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"q's head dimension (last axis) must be one of {HEAD_DIMS}, got {d}")
    require_times_of(q, start, end)
    for name, tensor in (("k", k), ("v", v), ("start", start)):
        if tensor.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {tensor.device}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if batch * heads > MAX_GRID_Y:
        raise ValueError(f"q has B * H = {batch * heads} (batch entry, head) pairs; the launch grid allows "
                         f"at most {MAX_GRID_Y}: split the batch")
    return batch, heads, n, d
