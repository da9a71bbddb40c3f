"""Torch oracles of `pyspec_ref.kvcache`, in float64: EMS-SD's unpadded batch (notebook 17) and
SwiftSpec's [prefix | tree] cache (notebook 18). tests/test_oracle.py checks each against the
specification."""

from __future__ import annotations

import torch

from course.oracle import attention_with_lse


def unpadded_mask(counts, kv_starts, kv_lengths, slots: int) -> torch.Tensor:
    """(T, S) bool: token i of sample b sees rows s_b .. s_b + n_b + i (EMS-SD's causal mask)."""
    rows = torch.arange(slots)
    mask = torch.zeros((sum(counts), slots), dtype=torch.bool)
    t = 0
    for c, s, n in zip(counts, kv_starts, kv_lengths, strict=True):
        for i in range(c):
            mask[t] = (rows >= s) & (rows <= s + n + i)
            t += 1
    return mask


def unpadded_attention(q, k_cache, v_cache, counts, kv_starts, kv_lengths, scale=None):
    """float64 (out (T, H, d), lse (T, H)): token i of sample b sees rows s_b .. s_b + n_b + i."""
    heads = q.shape[1]
    slots, heads_kv, _ = k_cache.shape
    mask = unpadded_mask(counts, kv_starts, kv_lengths, slots)
    group = heads // heads_kv
    k = k_cache.cpu().repeat_interleave(group, dim=1).transpose(0, 1)  # (H, S, d)
    v = v_cache.cpu().repeat_interleave(group, dim=1).transpose(0, 1)
    out, lse = attention_with_lse(q.cpu().transpose(0, 1), k, v, mask[None], scale)
    return out.transpose(0, 1), lse.transpose(0, 1)


def nonsquare_mask(q_start, q_end, kv_start, kv_end, prefix_lengths, tree_lengths, query_counts, slots: int,
                   ancestor=None) -> torch.Tensor:
    """(B, W, C) bool: query i of sample b sees rows j < P_b, and rows P_b <= j < P_b + T_b whose node is
    an ancestor-or-self of its own; padding queries (i >= query_counts[b]) see nothing. ancestor(ks, ke,
    qs, qe), on the rows' and the queries' DFS intervals, may replace the interval test."""
    qs, qe, ks, ke, p, t = (torch.as_tensor(x).cpu().long() for x in (q_start, q_end, kv_start, kv_end,
                                                                      prefix_lengths, tree_lengths))
    batch, width = qs.shape
    counts = (torch.full((batch,), width) if query_counts is None else torch.as_tensor(query_counts).cpu())
    rows = torch.arange(slots)[None, None, :]
    tree = (rows >= p[:, None, None]) & (rows < (p + t)[:, None, None])
    sk, ek, sq, eq = ks[:, None, :], ke[:, None, :], qs[:, :, None], qe[:, :, None]
    ancestor = (sk <= sq) & (eq <= ek) if ancestor is None else ancestor(sk, ek, sq, eq)
    mask = (rows < p[:, None, None]) | (tree & ancestor)
    return mask & (torch.arange(width)[None, :] < counts.long()[:, None])[:, :, None]


def nonsquare_tree_attention(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end, prefix_lengths,
                             tree_lengths, query_counts=None, scale=None):
    """float64 (out (B, Hq, W, d), lse (B, Hq, W)) of SwiftSpec's non-square tree attention.

    Query i of sample b sees rows j < P_b and rows P_b <= j < P_b + T_b with kv_start[b, j] <=
    q_start[b, i] and q_end[b, i] <= kv_end[b, j]; padding queries (i >= query_counts[b]) and
    queries that see nothing get out 0 and lse -inf."""
    heads = q.shape[1]
    mask = nonsquare_mask(q_start, q_end, kv_start, kv_end, prefix_lengths, tree_lengths, query_counts,
                          k_cache.shape[2])
    group = heads // k_cache.shape[1]
    k = k_cache.detach().cpu().double().repeat_interleave(group, dim=1)
    v = v_cache.detach().cpu().double().repeat_interleave(group, dim=1)
    out, lse = attention_with_lse(q.detach().cpu().double(), k, v, mask[:, None], scale)
    seen = mask.any(dim=2)[:, None, :, None]
    return torch.where(seen, out, 0.0), lse


def compaction(cache: torch.Tensor, sources: list[list[int]]) -> torch.Tensor:
    """cache (B, R, C, d) with sample b's slot j replaced by its old slot sources[b][j]."""
    out = cache.clone()
    for b, src in enumerate(sources):
        out[b] = cache[b][:, torch.tensor(src, device=cache.device)]
    return out
