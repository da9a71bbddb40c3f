"""Notebook 02: attention, the online softmax and flash tiling, in PyTorch.

These are the algorithms every later kernel implements; here they are written
with whole-tile torch operations so that the bookkeeping (running max, running
sum, rescaling, log-sum-exp) is all there is to see. Shapes follow the kernels:
(..., N, d) for queries and (..., M, d) for keys and values.
"""

from __future__ import annotations

import math

import torch

from course.core.stubs import todo  # noqa: F401  (the lesson stubs call it)
from course.core.validate import require_tensor

FLOAT_DTYPES = (torch.float32, torch.float64)


def _require_block(block, name: str) -> int:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"{name} must be a positive int, got {block!r}")
    return block


def online_softmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """Softmax over the last dimension, reading x in column blocks of `block` once.

    Keeps a running max m and a running sum l per row; when a block raises the max,
    the sum so far is rescaled by exp(m_old - m_new) (Milakov & Gimelshein, 2018).
    """
    require_tensor(x, "x", ndim=(1, 2, 3, 4), dtypes=FLOAT_DTYPES, on_kernel_device=False,
                       contiguous=False)
    _require_block(block, "block")
    ### BEGIN SOLUTION
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)
    for first in range(0, x.shape[-1], block):
        tile = x[..., first : first + block]
        m_new = torch.maximum(m, tile.max(dim=-1).values)
        l = l * torch.exp(m - m_new) + torch.exp(tile - m_new.unsqueeze(-1)).sum(dim=-1)
        m = m_new
    return torch.exp(x - m.unsqueeze(-1)) / l.unsqueeze(-1)
    ### END SOLUTION


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None,
                    block_k: int = 32, scale: float | None = None):
    """Masked attention over key tiles, FlashAttention-2 style: returns (out, lse).

    q (..., N, d), k and v (..., M, d), mask (..., N, M) bool (True = visible) or None.
    Each key tile updates, per query row, the running max m, the running sum l and the
    unnormalised output acc; a fully hidden row segment must not poison m with
    exp(-inf - -inf) = NaN. lse = m + log(l) is what the merge of partial results needs.
    """
    _require_attention_inputs(q, k, v, mask)
    _require_block(block_k, "block_k")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    ### BEGIN SOLUTION
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    for first in range(0, k.shape[-2], block_k):
        keys = slice(first, first + block_k)
        s = (q @ k[..., keys, :].transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask[..., keys], float("-inf"))
        m_new = torch.maximum(m, s.max(dim=-1).values)
        # Rows that have seen no key yet keep m = -inf; shift them by 0 instead of -inf.
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - shift.unsqueeze(-1))
        rescale = torch.exp(m - shift)
        l = l * rescale + p.sum(dim=-1)
        acc = acc * rescale.unsqueeze(-1) + p @ v[..., keys, :]
        m = m_new
    return acc / l.unsqueeze(-1), m + torch.log(l)
    ### END SOLUTION


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor):
    """Merge two partial attention results over disjoint key sets by their log-sum-exp.

    out (..., d), lse (...). The Flash-Decoding reduction that DeFT §3.4 reuses:
    lse = log(exp(lse_a) + exp(lse_b)), out = w_a out_a + w_b out_b with
    w = exp(lse_part - lse). A part that saw no key has lse = -inf and weight 0.
    """
    for name, value in (("out_a", out_a), ("out_b", out_b)):
        if not isinstance(value, torch.Tensor) or value.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a float32 or float64 torch.Tensor")
        if value.dim() == 0:
            raise ValueError(f"{name} must have at least 1 dimension (..., d), got a 0-d tensor")
    if out_a.shape != out_b.shape:  # before the LSE shapes, which are read from out_a
        raise ValueError(f"out_a and out_b must have the same shape, got {tuple(out_a.shape)} "
                         f"and {tuple(out_b.shape)}")
    for name, value, out in (("lse_a", lse_a, out_a), ("lse_b", lse_b, out_b)):
        _require_lse(value, name, out_a.shape[:-1])
        # A part that saw no key (lse = -inf) may hold anything, even 0/0 = NaN: it gets weight 0.
        if not torch.isfinite(out[torch.isfinite(value)]).all():
            raise ValueError(f"out_{name[-1]} has NaN or inf in a row whose {name} is finite")
    if out_a.shape != out_b.shape:
        raise ValueError(f"out_a and out_b must have the same shape, got {tuple(out_a.shape)} "
                         f"and {tuple(out_b.shape)}")
    ### BEGIN SOLUTION
    lse = torch.logaddexp(lse_a, lse_b)
    # Where both parts are empty, lse is -inf: keep the weights finite (0) there.
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    weight_a = torch.exp(lse_a - safe).unsqueeze(-1)
    weight_b = torch.exp(lse_b - safe).unsqueeze(-1)
    # Zero an empty part's output first: weight 0 times NaN would still be NaN.
    out_a = torch.where(torch.isinf(lse_a).unsqueeze(-1), 0.0, out_a)
    out_b = torch.where(torch.isinf(lse_b).unsqueeze(-1), 0.0, out_b)
    return weight_a * out_a + weight_b * out_b, lse
    ### END SOLUTION


def _require_lse(lse, name, shape):
    if not isinstance(lse, torch.Tensor) or lse.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float32 or float64 torch.Tensor")
    if lse.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(lse.shape)}")
    if torch.isnan(lse).any() or (lse == float("inf")).any():
        raise ValueError(f"{name} contains NaN or +inf (only -inf, for an empty part, is allowed)")


def _require_attention_inputs(q, k, v, mask):
    for name, value in (("q", q), ("k", k), ("v", v)):
        require_tensor(value, name, ndim=(2, 3, 4), dtypes=FLOAT_DTYPES, on_kernel_device=False,
                       contiguous=False)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have d = {q.shape[-1]} columns like q, got {k.shape[-1]}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must have the same leading shape, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k must have the same batch shape, got {tuple(q.shape[:-2])} "
                         f"and {tuple(k.shape[:-2])}")
    if mask is not None:
        expected = q.shape[:-1] + (k.shape[-2],)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("mask must be a bool torch.Tensor (True = visible) or None")
        if mask.shape != expected:
            raise ValueError(f"mask must have shape {tuple(expected)}, got {tuple(mask.shape)}")
        if not mask.any(dim=-1).all():
            raise ValueError("mask hides every key from some query row; its attention is undefined")
