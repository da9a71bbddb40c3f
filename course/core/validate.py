"""Argument checks shared by the launchers: every message names the argument."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from course.core import runtime


def require_tensor(value, name: str, *, ndim: int | Iterable[int] | None = None,
                   dtypes: Iterable[torch.dtype] | None = None, contiguous: bool = True,
                   on_kernel_device: bool = True) -> torch.Tensor:
    """Check a launcher argument: a torch tensor of the right rank, dtype and device."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.dim() not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions, "
                             f"got shape {tuple(value.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if value.dtype not in dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype {names}, got {str(value.dtype).replace('torch.', '')}")
    if on_kernel_device:
        wanted = runtime.torch_device().type
        if value.device.type != wanted:
            where = "the simulator runs on CPU tensors" if runtime.SIMULATOR else "kernels run on the GPU"
            raise ValueError(f"{name} must be on device '{wanted}' ({where}), got '{value.device}'")
    if contiguous and not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    if value.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(value.shape)}")
    if value.is_floating_point() and not torch.isfinite(value).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return value


def require_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")


def require_topological_trees(parents: torch.Tensor, name: str = "parents") -> None:
    """Each row a tree numbered parent-before-child: parents[b, 0] == -1 and 0 <= parents[b, i] < i.

    This one rule also excludes cycles, several roots and ids out of range.
    """
    n = parents.shape[-1]
    rows = parents.reshape(-1, n).long()
    bad_root = torch.nonzero(rows[:, 0] != -1)
    if len(bad_root):
        b = int(bad_root[0, 0])
        raise ValueError(f"{name}[{b}, 0] = {int(rows[b, 0])}: node 0 must be the root (parent -1)")
    if n == 1:
        return
    ids = torch.arange(1, n, device=rows.device)
    bad = torch.nonzero((rows[:, 1:] < 0) | (rows[:, 1:] >= ids))
    if len(bad):
        b, i = int(bad[0, 0]), int(bad[0, 1]) + 1
        raise ValueError(f"{name}[{b}, {i}] = {int(rows[b, i])}: every node's parent must be a node "
                         f"numbered before it (0 <= parent < {i}); a second root, a cycle or an id out "
                         "of range breaks this")


def require_times(start: torch.Tensor, end: torch.Tensor, names=("start", "end")) -> None:
    """DFS times in range: 0 <= start <= end < N (cheap checks; a kernel must never index past N)."""
    n = start.shape[-1]
    for name, times in zip(names, (start, end), strict=True):
        if int(times.min()) < 0 or int(times.max()) >= n:
            raise ValueError(f"{name} must hold DFS times in [0, {n}), got values in "
                             f"[{int(times.min())}, {int(times.max())}]")
    if bool((start > end).any()):
        raise ValueError(f"{names[0]} must not exceed {names[1]} (a node's interval is [start, end])")


def require_like_q(value: torch.Tensor, name: str, q: torch.Tensor) -> None:
    """`name` (a key or value tensor) has q's dtype and sits on q's device: the kernels read both
    with one element type and cannot reach another device's memory."""
    if value.dtype != q.dtype:
        raise TypeError(f"{name} must have q's dtype {str(q.dtype).replace('torch.', '')}, "
                        f"got {str(value.dtype).replace('torch.', '')}")
    if value.device != q.device:
        raise ValueError(f"{name} must be on q's device {q.device}, got {value.device}")


def require_scale(scale) -> None:
    """The softmax scale: a positive finite number, or None for 1/sqrt(d)."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"scale must be a positive finite number or None (1/sqrt(d)), got {scale!r}")


def require_kv_heads(heads: int, d: int, name: str, heads_kv: int, d_kv: int) -> None:
    """The keys `name` have q's head dimension, and q's heads are a whole number of query heads per
    KV head (grouped-query attention: query head h reads KV head h // (heads // heads_kv))."""
    if d_kv != d:
        raise ValueError(f"{name}'s head dimension is {d_kv}, but q's is {d}")
    if heads % heads_kv:
        raise ValueError(f"q's {heads} heads must be a multiple of {name}'s {heads_kv} KV heads "
                         "(grouped-query attention)")


def require_interpretable_dtype(value: torch.Tensor, name: str) -> None:
    """Refuse bf16 in Triton's interpreter, whose bf16 tl.dot computes wrong results.

    On a GPU bf16 is fine; in the interpreter use fp16 or fp32 (the checks do).
    """
    if runtime.SIMULATOR and value.dtype == torch.bfloat16:
        raise TypeError(f"{name} is bfloat16, but Triton's interpreter computes bf16 tl.dot wrongly; "
                        "use float16 or float32 in the simulator")


def require_dot_block(**blocks: int) -> None:
    """Tile sizes of a tl.dot that a GPU compiles: powers of two, at least 16.

    The interpreter accepts any shape, so a kernel tuned there could fail to compile on a GPU.
    """
    for name, size in blocks.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16 for tl.dot on a GPU, got {size!r}")


def require_qkv(q, k, v, head_dims) -> tuple[int, int, int, int]:
    """Check attention's q, k, v: float32 (B, H, N, d) with d in head_dims; return (B, H, N, d)."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        require_tensor(tensor, name, ndim=4, dtypes=(torch.float32,))
    require_same_shape("q", q, "k", k)
    require_same_shape("q", q, "v", v)
    batch, heads, n, d = q.shape
    if d not in head_dims:
        raise ValueError(f"q's head dimension (last axis) must be one of {tuple(head_dims)} for this "
                         f"kernel, got {d}")
    return batch, heads, n, d


def require_tree_attention_inputs(q, k, v, start, end, head_dims) -> tuple[int, int, int, int]:
    """Check a tree-attention launcher's inputs and return (B, H, N, d).

    q, k, v: float32 (B, H, N, d) with d in head_dims; start, end: int32 (B, N) DFS times.
    """
    batch, heads, n, d = require_qkv(q, k, v, head_dims)
    require_times_of(q, start, end)
    return batch, heads, n, d


def require_times_of(q, start, end) -> None:
    """Check (B, N) int32 DFS times that belong to a (B, H, N, d) q."""
    batch, _, n, _ = q.shape
    # The shapes first: times of another N are out of range for that reason, and the range
    # check would name the symptom instead.
    require_tensor(start, "start", ndim=2, dtypes=(torch.int32,))
    require_tensor(end, "end", ndim=2, dtypes=(torch.int32,))
    require_same_shape("start", start, "end", end)
    if tuple(start.shape) != (batch, n):
        raise ValueError(f"start and end must have shape (B, N) = {(batch, n)} to match q, "
                         f"got {tuple(start.shape)}")
    require_tree_times(start, end)


def require_tree_times(start, end) -> tuple[int, int]:
    """Check (B, N) int32 DFS times on one device; return (B, N)."""
    require_tensor(start, "start", ndim=2, dtypes=(torch.int32,))
    require_tensor(end, "end", ndim=2, dtypes=(torch.int32,))
    require_same_shape("start", start, "end", end)
    if start.device != end.device:
        raise ValueError(f"start and end must be on one device, got {start.device} and {end.device}")
    require_times(start, end)
    return tuple(start.shape)
