"""Vectorised torch oracles for large outputs on a GPU: every torch reference of the course.

`pyspec_ref` is the specification but runs in pure Python, so on a GPU the checks
compare a sample of rows with it, and the whole output with these oracles; the benches
measure their errors against them. This module holds the oracles of `pyspec_ref.trees`,
`pyspec_ref.attention` and `pyspec_ref.deft` (tree masks, attention, DeFT's KV tree);
`course.oracle.kvcache` and `course.oracle.sampling` those of the modules of the same
names. tests/test_oracle.py cross-checks every oracle against `pyspec_ref` on small inputs.
"""

from __future__ import annotations

import math

import torch


def dense_tree_mask(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """(..., N, N) bool mask: query i sees key j iff j is an ancestor-or-self of i (FlashSpecInfer §5.1)."""
    key_start, key_end = start.unsqueeze(-2), end.unsqueeze(-2)
    query_start, query_end = start.unsqueeze(-1), end.unsqueeze(-1)
    return (key_start <= query_start) & (query_end <= key_end)


def tile_mask(start: torch.Tensor, end: torch.Tensor, tile: int) -> torch.Tensor:
    """(B, T, T) bool, T = ceil(N / tile): some query of the query tile sees some key of the key
    tile (the dense mask, padded with False to whole tiles, OR-ed over each tile)."""
    mask = dense_tree_mask(start, end)
    batch, n = start.shape
    tiles = (n + tile - 1) // tile
    padded = torch.zeros((batch, tiles * tile, tiles * tile), dtype=torch.bool, device=mask.device)
    padded[:, :n, :n] = mask
    return padded.view(batch, tiles, tile, tiles, tile).any(dim=4).any(dim=2)


def attention_with_lse(q, k, v, mask=None, scale=None):
    """Masked softmax attention in float64: (out, lse) over (..., N, d) inputs."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v.double()
    return out, lse


def tree_attention(q, k, v, start, end, scale=None):
    """Tree attention for (B, H, N, d) inputs and (B, N) DFS times, in float64: (out, lse)."""
    mask = dense_tree_mask(start.long(), end.long()).unsqueeze(1)  # broadcast over heads
    return attention_with_lse(q, k, v, mask, scale)


def tree_kv_mask(parents, lengths, query_nodes, device=None) -> torch.Tensor:
    """(Q, T) bool: query i sees flattened token t (DeFT's KV tree; `pyspec_ref.deft.visible_tokens`).

    Tokens are laid out node by node in DFS preorder, children in increasing id; query i
    sees the tokens of every node on the root path of query_nodes[i], that node included.
    """
    parents, lengths, query_nodes = list(parents), list(lengths), list(query_nodes)
    children = [[] for _ in parents]
    for node in range(1, len(parents)):
        children[parents[node]].append(node)
    offsets, position, stack = [0] * len(parents), 0, [0]
    while stack:  # DFS preorder, children in increasing id
        node = stack.pop()
        offsets[node] = position
        position += lengths[node]
        stack.extend(reversed(children[node]))
    mask = torch.zeros((len(query_nodes), position), dtype=torch.bool, device=device)
    for i, node in enumerate(query_nodes):
        while node != -1:
            mask[i, offsets[node] : offsets[node] + lengths[node]] = True
            node = parents[node]
    return mask


def tree_kv_attention(q, k, v, parents, lengths, query_nodes, scale=None):
    """Attention over a KV tree (DeFT; `pyspec_ref.deft.tree_kv_attention`), in float64: (out, lse).

    q (Q, H_q, d); k, v (T, H_kv, d) in the flattened DFS layout (`tree_kv_mask`); query
    head h reads KV head h // (H_q / H_kv). Returns out (Q, H_q, d) and lse (Q, H_q).
    """
    mask = tree_kv_mask(parents, lengths, query_nodes, q.device)
    group = q.shape[1] // k.shape[1]
    keys = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # (H_q, T, d)
    values = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    out, lse = attention_with_lse(q.double().transpose(0, 1), keys, values, mask, scale)
    return out.transpose(0, 1), lse.transpose(0, 1)
