"""Argument checks of DeFT's launchers (notebooks 13 and 14); every message names the argument.

Phase 1 (`course.topics.deft.groups`) calls these before it builds its groups, and the launchers
(`solutions/deft.py`, `course.topics.deft.launch`) before phase 2 launches its kernels, so a
wrong tree, shape or cache row fails on the host with a clear message instead of reading out of
bounds on the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import pyspec_ref.deft as spec
from course.core.validate import require_interpretable_dtype, require_kv_heads, require_like_q, require_tensor

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_MULTIPLE = 16  # a Flatten block's length is a multiple of this (the smallest tl.dot tile)
GPU_TILE_TOKENS = 64  # the longest K/V tile a GPU takes from one block (`tuning.tile_shape`)


def _int_sequence(value, name: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.is_floating_point() or value.dtype == torch.bool:
            raise TypeError(f"{name} must be a 1-D integer tensor or a list of ints, got a "
                            f"{value.dim()}-D {str(value.dtype).replace('torch.', '')} tensor")
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of ints, got {type(value).__name__}")
    items = list(value)
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{name}[{i}] must be an int, got {x!r} of type {type(x).__name__}")
    if not items:
        raise ValueError(f"{name} must not be empty")
    return items


def kv_tree(parents, lengths, query_nodes) -> tuple[list[int], list[int], list[int]]:
    """Check a KV tree (see `pyspec_ref.deft`) and return (parents, lengths, query_nodes) as lists.

    parents: numbered parent-before-child, parents[0] == -1 and 0 <= parents[i] < i;
    lengths: one int >= 1 per node; query_nodes: the node each query continues.
    """
    p = _int_sequence(parents, "parents")
    if p[0] != -1:
        raise ValueError(f"parents[0] = {p[0]}: node 0 must be the root (parent -1)")
    for i in range(1, len(p)):
        if not 0 <= p[i] < i:
            raise ValueError(f"parents[{i}] = {p[i]}: every node's parent must be a node numbered before it "
                             f"(0 <= parent < {i}); a second root, a cycle or an id out of range breaks this")
    sizes = _int_sequence(lengths, "lengths")
    spec.validate_kv_tree(p, sizes)  # one length >= 1 per node, with the specification's messages
    nodes = _int_sequence(query_nodes, "query_nodes")
    for i, x in enumerate(nodes):
        if not 0 <= x < len(p):
            raise ValueError(f"query_nodes[{i}] = {x} is out of range: there are {len(p)} nodes "
                             f"(0..{len(p) - 1})")
    return p, sizes, nodes


def torch_device(device) -> torch.device:
    """`device` as a torch.device (phase 1 builds its tensors there)."""
    try:
        return torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise ValueError(f"device must be a torch device or a name such as 'cuda', got {device!r}") from error


def block_tokens(value) -> int:
    """DeFT-Flatten's block length: a positive multiple of BLOCK_MULTIPLE tokens."""
    if isinstance(value, bool) or not isinstance(value, int) or value < BLOCK_MULTIPLE \
            or value % BLOCK_MULTIPLE:
        raise ValueError(f"block_tokens must be a positive multiple of {BLOCK_MULTIPLE} tokens, "
                         f"got {value!r}")
    # A K/V tile is min(GPU_TILE_TOKENS, block_tokens) tokens on a GPU (32 in the interpreter,
    # `tuning.tile_shape`), and tl.dot compiles only powers of two: refuse here, in the interpreter
    # too, what only a GPU would refuse at launch.
    if value < GPU_TILE_TOKENS and value & (value - 1):
        raise ValueError(f"block_tokens must be {BLOCK_MULTIPLE}, {2 * BLOCK_MULTIPLE} or a multiple of "
                         f"{BLOCK_MULTIPLE} >= {GPU_TILE_TOKENS} (a GPU's K/V tile, min({GPU_TILE_TOKENS}, "
                         f"block_tokens), must be a power of two for tl.dot), got {value!r}")
    return value


def _check_slots(slots, prepared, q, rows: int) -> None:
    """A paged cache's slots: (T,) int32 rows of the cache, on q's device."""
    require_tensor(slots, "slots", ndim=1, dtypes=(torch.int32,))
    if slots.shape[0] != prepared.num_tokens:
        raise ValueError(f"slots has {slots.shape[0]} entries, expected T = {prepared.num_tokens} "
                         "(one cache row per token of the tree)")
    if slots.device != q.device:
        raise ValueError(f"slots must be on q's device {q.device}, got {slots.device}")
    low, high = int(slots.min()), int(slots.max())
    if low < 0 or high >= rows:
        raise ValueError(f"slots must be rows of the cache, in [0, {rows}), got values in "
                         f"[{low}, {high}]")


def attention_inputs(q, k, v, prepared, slots, kind: type, prepare: str) -> tuple[int, int, int, int]:
    """Check phase 2's inputs against the prepared tree; return (Q, H_q, H_kv, d).

    kind: the class `prepared` must be an instance of, made by the function named `prepare`.
    """
    if not isinstance(prepared, kind):
        raise TypeError(f"prepared must be the result of {prepare}(...), got {type(prepared).__name__}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        require_tensor(tensor, name, ndim=3, dtypes=DTYPES)
        require_interpretable_dtype(tensor, name)
    for name, tensor in (("k", k), ("v", v)):
        require_like_q(tensor, name, q)
    n_queries, heads_q, d = q.shape
    if n_queries != prepared.num_queries:
        raise ValueError(f"q has {n_queries} queries (rows), but prepared was built for "
                         f"{prepared.num_queries} query nodes")
    if d not in HEAD_DIMS:
        raise ValueError(f"q's head dimension (last axis) must be one of {HEAD_DIMS}, got {d}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    rows, heads_kv, d_kv = k.shape
    require_kv_heads(heads_q, d, "k", heads_kv, d_kv)
    if prepared.device != q.device:
        raise ValueError(f"prepared lives on {prepared.device}, but q on {q.device}: "
                         f"build it with {prepare}(..., device=q.device)")
    if slots is None:
        if rows != prepared.num_tokens:
            raise ValueError(f"k has {rows} rows, but the tree holds T = {prepared.num_tokens} tokens "
                             "(contiguous KV is (T, H_kv, d); for a paged cache pass slots=)")
    else:
        _check_slots(slots, prepared, q, rows)
    return n_queries, heads_q, heads_kv, d


def partials(out_part, lse_part, query_ptr, query_parts, out_dtype) -> None:
    """Check `reduce_partials`' arguments: float32 partials (P, H_q, d) and (P, H_q), and each
    query's list of partials as CSR int32 tensors that cover every query at least once."""
    require_tensor(out_part, "out_part", ndim=3, dtypes=(torch.float32,))
    require_tensor(lse_part, "lse_part", ndim=2, dtypes=(torch.float32,))
    require_tensor(query_ptr, "query_ptr", ndim=1, dtypes=(torch.int32,))
    require_tensor(query_parts, "query_parts", ndim=1, dtypes=(torch.int32,))
    n_parts, heads_q, d = out_part.shape
    if tuple(lse_part.shape) != (n_parts, heads_q):
        raise ValueError(f"lse_part must have shape (P, H_q) = {(n_parts, heads_q)} to match out_part, "
                         f"got {tuple(lse_part.shape)}")
    if d not in HEAD_DIMS:
        raise ValueError(f"out_part's head dimension (last axis) must be one of {HEAD_DIMS}, got {d}")
    if out_dtype not in DTYPES:
        raise TypeError(f"out_dtype must be one of float16, bfloat16, float32, got {out_dtype}")
    if query_ptr.shape[0] < 2:
        raise ValueError("query_ptr must hold Q + 1 >= 2 offsets")
    steps = query_ptr[1:] - query_ptr[:-1]
    if int(query_ptr[0]) != 0 or int(query_ptr[-1]) != query_parts.shape[0]:
        raise ValueError(f"query_ptr must run from 0 to len(query_parts) = {query_parts.shape[0]}, got "
                         f"{int(query_ptr[0])} .. {int(query_ptr[-1])}")
    if bool((steps < 1).any()):
        i = int(torch.nonzero(steps < 1)[0, 0])
        raise ValueError(f"query_ptr must increase: query {i} has {int(steps[i])} partials "
                         "(at least 1 needed)")
    if int(query_parts.min()) < 0 or int(query_parts.max()) >= n_parts:
        raise ValueError(f"query_parts must be rows of out_part, in [0, {n_parts}), got values in "
                         f"[{int(query_parts.min())}, {int(query_parts.max())}]")
