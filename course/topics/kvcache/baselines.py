"""What the kvcache kernels are measured against (notebooks 17 and 18, `course.topics.kvcache.bench`).

* EMS-SD's vanilla batch (§3, Appendix B): pad the inputs to W = max(counts) and the cache to a
  common width, then one masked SDPA call over the rectangle (`padded_attention`, and its pieces
  `pad_batch`, `padded_forward`, `unpad` for timing the call alone).
* SwiftSpec's compaction without the in-place kernel (`naive_compact`): gather every moved row into
  a temporary (index_select), then copy it back (index_put): correct for any overlap, but it writes
  and reads a second copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from course.core.validate import require_scale
from course.topics.kvcache.validate import Moves, check_batch, check_moves

# --------------------------------------------------------------------------- EMS-SD: the padded batch


@dataclass(frozen=True)
class PaddedBatch:
    """EMS-SD's vanilla batch: a rectangle (B, H, ...) with padding (§3, Appendix B).

    q: (B, H, W, d) with W = max(counts); k, v: (B, H, L + W, d) with L = max(kv_lengths): sample
    b's cached keys at 0..kv_lengths[b] - 1, padding up to L, its W new slots at L..L + W - 1.
    mask: (B, 1, W, L + W) bool: query i sees the sample's cache and new slots L..L + i (padding
    queries i >= counts[b] are computed too, and thrown away: that is the waste).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor
    counts: list[int]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.k, self.v, self.mask))


def pad_batch(q, k_cache, v_cache, counts, kv_starts, kv_lengths) -> PaddedBatch:
    """Lay an unpadded batch out the vanilla way (`PaddedBatch`); GQA heads are repeated."""
    batch = check_batch(q, k_cache, v_cache, counts, kv_starts, kv_lengths)
    total, heads, d = q.shape
    group = heads // k_cache.shape[1]
    size, width = batch.size, max(batch.counts)
    cached = max(batch.kv_lengths)
    device = q.device
    qp = torch.zeros((size, width, heads, d), dtype=q.dtype, device=device)
    kp = torch.zeros((size, cached + width, heads, d), dtype=q.dtype, device=device)
    vp = torch.zeros_like(kp)
    offsets = batch.offsets.tolist()
    for b in range(size):
        c, s, n = batch.counts[b], batch.kv_starts[b], batch.kv_lengths[b]
        qp[b, :c] = q[offsets[b]:offsets[b + 1]]
        for dst, src in ((kp, k_cache), (vp, v_cache)):
            dst[b, :n] = src[s:s + n].repeat_interleave(group, dim=1)
            dst[b, cached:cached + c] = src[s + n:s + n + c].repeat_interleave(group, dim=1)
    i = torch.arange(width, device=device)[:, None]
    j = torch.arange(cached + width, device=device)[None, :]
    lengths = torch.tensor(batch.kv_lengths, device=device)[:, None, None]
    mask = (j[None] < lengths) | ((j[None] >= cached) & (j[None] <= cached + i[None]))
    return PaddedBatch(qp.transpose(1, 2).contiguous(), kp.transpose(1, 2).contiguous(),
                       vp.transpose(1, 2).contiguous(), mask[:, None], list(batch.counts))


def padded_forward(padded: PaddedBatch, scale=None) -> torch.Tensor:
    """The vanilla step itself: one masked SDPA over the rectangle, (B, H, W, d)."""
    return F.scaled_dot_product_attention(padded.q, padded.k, padded.v, attn_mask=padded.mask, scale=scale)


def unpad(out_padded: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """(B, H, W, d) -> (T, H, d): keep each sample's first counts[b] rows, concatenated."""
    return torch.cat([out_padded[b, :, :c].transpose(0, 1) for b, c in enumerate(counts)], dim=0)


def padded_attention(q, k_cache, v_cache, counts, kv_starts, kv_lengths, *, scale=None) -> torch.Tensor:
    """The vanilla baseline end to end: pad, one masked SDPA, unpad. Returns (T, H, d) like
    `unpadded_attention` (the padding rows are computed and dropped)."""
    require_scale(scale)
    padded = pad_batch(q, k_cache, v_cache, counts, kv_starts, kv_lengths)
    return unpad(padded_forward(padded, scale), padded.counts)


# --------------------------------------------------------------------------- SwiftSpec: gather and copy


def _naive_launch(cache: torch.Tensor, moves: Moves) -> Callable[[], torch.Tensor]:
    width = moves.src.shape[1]
    live = torch.arange(width, device=cache.device)[None, :] < moves.counts[:, None]
    sample = torch.nonzero(live)[:, 0]
    src = moves.src[live].long()
    dst = moves.dst[live].long()

    def launch() -> torch.Tensor:
        if moves.total:
            moved = cache[sample, :, src]  # (moves, R, d): gathered into a temporary
            cache[sample, :, dst] = moved  # and copied back
        return cache
    return launch


def naive_compact(cache: torch.Tensor, src, dst, counts) -> torch.Tensor:
    """The gather-and-copy baseline of `compact`: gather every moved row into a temporary (one
    indexed read), then write it to the destinations. Same arguments, checks and result."""
    return _naive_launch(cache, check_moves(cache, src, dst, counts))()


def prepare_naive_compact(cache: torch.Tensor, src, dst, counts) -> Callable[[], torch.Tensor]:
    """Check once; return a function that only runs the gather-and-copy (for timing)."""
    return _naive_launch(cache, check_moves(cache, src, dst, counts))
