"""The decoder's two backends: the course's kernels, or a dense-mask PyTorch reference.

Both give the decoder the same operations, so `course.capstone.decoder` runs one loop over either:

* `causal(counts, kv_lengths)`: the prefill's `attend` (see `TinyLM.step`), EMS-SD's unpadded batch
  (notebook 17): sample b feeds counts[b] prompt tokens after kv_lengths[b] cached ones; token i sees
  cache rows [0, kv_lengths[b] + i]. Run once per generation, eagerly: its input checks may wait for
  the GPU.
* `tree_attention(model, cache, workspace, index)`: the `attend` of SwiftSpec's non-square tree
  attention (notebook 18) for one step shape: rows [0, P_b) are the prefix, rows [P_b, P_b + T_b)
  tree nodes with nested intervals; a query sees the prefix and its ancestors.
* `greedy_verifier(...)` / `sampling_verifier(...)`: SpecInfer's token-tree verification
  (notebook 16).
* `compactor(cache, src, dst, counts)`: SwiftSpec's in-place moves of the whole KV cache (notebook 18).

The last four are built once, from buffers whose ADDRESSES never change (`TreeIndex`, the
workspace's q view, the verification and move buffers): their input checks run then, and what they
return launches only kernels that read the buffers' current contents, without waiting for the host.
That is what a CUDA graph needs, and the decoder's loop never checks a value again.

Kernels: `emssd.unpadded_attention`, SwiftSpec's through `course.topics.kvcache.launch`
(`prepare_tree_attention`, `prepare_compact_buffers`), `course.topics.verification.launch.prepare_greedy` /
`prepare_sampling` on `tree_verification`, each loaded through `course.core.impl.load` (lessons/ by
default, solutions/ with COURSE_IMPL=solutions or impl=).

How the unpadded kernel meets the model's cache (prefill). `unpadded_attention` takes one flat cache
(S, H_kv, d) where each sample owns a run of rows; the model's cache is (B, R, C, d) (R = layers x
{k, v} x KV heads), in which a sample's rows of one KV head are C consecutive rows of d numbers,
but the rows of different heads are not interleaved per token. So each (sample, KV head) pair is
made one EMS-SD "sample" with a single KV head: its region starts at row b * R * C + h * C of the
flat (rows of d) view of the layer's keys, and its queries are the GROUP query heads that read KV
head h. No copy of the cache is made (a strided view); q and the output are regrouped (small).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from course.core import impl as course_impl
from course.core import runtime
from course.topics.kvcache import launch as kvcache_launch
from course.topics.kvcache.tuning import AttentionConfig

BACKENDS = ("kernels", "reference")
# The tree attention's tiles on a GPU: 16 packed (query head, query) rows a program, 64 cache rows a
# step. The launcher's rule puts all of a KV head's rows in one program of up to 64 (notebook 18's
# long caches are streams of bytes, best read once per KV head); a capstone call reads a few hundred
# cache rows of one sample, so its time is the chain of dependent block steps inside a program, and
# four shorter programs finish sooner than one long one. On an H200, graphed, one call: the draft's
# at w = 16 (80 prefix and 100 tree rows) from 14.9 to 11.8 us, the medium target's at w = 48 (80
# and 48) from 11.6 to 9.4 us a layer (results/h200/README.md). The interpreter keeps its own tiles.
TREE_TILES = runtime.pick(sim=None, gpu=AttentionConfig(block_m=16, block_n=64, num_warps=4, num_stages=2))


@dataclass(frozen=True)
class TreeIndex:
    """The int32 index buffers of one tree-attention step shape (`swiftspec.tree_cache_attention`'s
    arguments): each query's interval (B, W), each cache row's interval (B, C), the prefix and tree
    lengths and the real queries per sample (B,)."""

    q_start: torch.Tensor
    q_end: torch.Tensor
    kv_start: torch.Tensor
    kv_end: torch.Tensor
    prefix: torch.Tensor
    tree_len: torch.Tensor
    counts: torch.Tensor


def _sdpa(q, k, v, mask):
    """Masked attention of q (B, Hq, W, d) over k, v (B, Hkv, C, d), GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _seen_somewhere(mask: torch.Tensor) -> torch.Tensor:
    """A query that sees no row (a padding query) sees row 0 instead: its output is discarded, and
    SDPA would give NaN for an empty row."""
    mask[..., 0] |= ~mask.any(dim=-1)
    return mask


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draws by inverse CDF from distributions (..., V): the smallest i with cdf[i] > u * total, for
    uniforms (..., n); int64 (..., n). In float64, as `pyspec_ref.sampling` draws."""
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    picks = torch.searchsorted(cdf, uniforms.to(torch.float64) * cdf[..., -1:], right=True)
    return picks.clamp_(max=probs.shape[-1] - 1)


class ReferenceBackend:
    """Dense boolean masks and SDPA; verification written out in torch float64 the way
    `pyspec_ref.sampling` states it (explicit residuals, inverse-CDF draws). Every operation runs on
    the device without waiting for the host, like the kernels."""

    name = "reference"

    def causal(self, counts: list[int], kv_lengths: list[int]) -> Callable:
        def attend(layer, q, k, v):
            width = q.shape[2]
            device = q.device
            cols = torch.arange(k.shape[2], device=device)
            limit = torch.tensor(kv_lengths, device=device)[:, None] + torch.arange(width, device=device)
            mask = cols[None, None, :] <= limit[:, :, None]  # (B, W, C)
            real = torch.arange(width, device=device)[None, :] < torch.tensor(counts, device=device)[:, None]
            return _sdpa(q, k, v, _seen_somewhere(mask & real[:, :, None])[:, None])
        return attend

    def tree_attention(self, model, cache, workspace, index: TreeIndex) -> Callable:
        masks = {}

        def attend(layer, q, k, v):
            if layer == 0:  # one mask per step, shared by the layers
                rows = torch.arange(k.shape[2], device=q.device)[None, :]
                prefix = index.prefix.long()[:, None]
                tree = (rows >= prefix) & (rows < prefix + index.tree_len.long()[:, None])  # (B, C)
                sees = ((index.kv_start[:, None, :] <= index.q_start[:, :, None])
                        & (index.q_end[:, :, None] <= index.kv_end[:, None, :]))
                mask = (rows < prefix)[:, None, :] | (tree[:, None, :] & sees)  # (B, W, C)
                real = torch.arange(q.shape[2], device=q.device)[None, :] < index.counts[:, None]
                masks["now"] = _seen_somewhere(mask & real[:, :, None])[:, None]
            return _sdpa(q, k, v, masks["now"])
        return attend

    def greedy_verifier(self, parents, tokens, best) -> Callable:
        """The walk of `pyspec_ref.sampling.greedy_tree_verification` over (B, N) trees: from the
        root, follow the first child (in id order) whose token is the target's argmax at the current
        node. Returns a function giving (path (B, N) int32 padded with -1, next token (B,) int32)."""
        batch, n = parents.shape
        ids = torch.arange(n, device=parents.device)
        path = torch.empty((batch, n), dtype=torch.int32, device=parents.device)
        nxt = torch.empty(batch, dtype=torch.int32, device=parents.device)

        def run():
            node = torch.zeros(batch, dtype=torch.int64, device=parents.device)
            going = torch.ones(batch, dtype=torch.bool, device=parents.device)
            path.fill_(-1)
            path[:, 0].fill_(0)
            for depth in range(1, n):
                wanted = best.gather(1, node[:, None])
                match = (parents == node[:, None]) & (tokens == wanted) & going[:, None]
                child = torch.where(match, ids, n).amin(dim=1)
                going = child < n
                path[:, depth].copy_(torch.where(going, child, -1))
                node = torch.where(going, child, node)
            nxt.copy_(best.gather(1, node[:, None])[:, 0])
            return path, nxt
        return run

    def sampling_verifier(self, parents, tokens, q, p, accept_u, sample_u,
                          replacement: bool = False) -> Callable:
        """SpecInfer's multi-step speculative sampling (§4.3), as `pyspec_ref.sampling` states it: at
        node u try the children in id order; child s (token x) is accepted when r_s q'(x) < p'(x),
        else p' becomes max_norm(p' - q'); when no child is accepted the next token is drawn from
        p' with u's sample uniform. p' starts as p_u and q' as q_u at every node reached; without
        replacement (Sequoia §3.2) a rejected token then leaves q' (q' renormalised without it), since
        the next sibling was drawn without it."""
        batch, n, _ = p.shape
        device = p.device
        ids = torch.arange(n, device=device)
        samples = torch.arange(batch, device=device)
        path = torch.empty((batch, n), dtype=torch.int32, device=device)
        nxt = torch.empty(batch, dtype=torch.int32, device=device)

        def run():
            p64, q64 = p.double(), q.double()
            node = torch.zeros(batch, dtype=torch.int64, device=device)
            tried = torch.zeros(batch, dtype=torch.int64, device=device)  # children up to this id tried
            depth = torch.zeros(batch, dtype=torch.int64, device=device)
            walking = torch.ones(batch, dtype=torch.bool, device=device)
            current = p64[:, 0].clone()
            proposal = q64[:, 0].clone()
            path.fill_(-1)
            path[:, 0].fill_(0)
            for _ in range(n - 1):  # every non-root node is tried at most once
                candidates = (parents == node[:, None]) & (ids > tried[:, None]) & walking[:, None]
                child = torch.where(candidates, ids, n).amin(dim=1)
                has = child < n
                child = child.clamp(max=n - 1)
                x = tokens.gather(1, child[:, None]).long()
                r = accept_u.gather(1, child[:, None]).double()
                accept = has & (r * proposal.gather(1, x) < current.gather(1, x))[:, 0]
                reject = has & ~accept
                depth += accept
                path[samples, depth] = torch.where(accept, child, path[samples, depth].long()).to(torch.int32)
                residual = (current - proposal).clamp(min=0.0)
                total = residual.sum(dim=1, keepdim=True)
                renormalise = (reject & (total[:, 0] > 0))[:, None]  # p == q leaves nothing: keep p'
                current = torch.where(accept[:, None], p64[samples, child],
                                      torch.where(renormalise, residual / total, current))
                if not replacement:
                    left = proposal.scatter(1, x, 0.0)
                    mass = left.sum(dim=1, keepdim=True)
                    left = torch.where(mass > 0, left / mass.clamp(min=1e-300), left)
                    proposal = torch.where(reject[:, None], left, proposal)
                proposal = torch.where(accept[:, None], q64[samples, child], proposal)
                node = torch.where(accept, child, node)
                tried = torch.where(has, child, tried)
                walking &= has
            u = sample_u.gather(1, node[:, None])
            nxt.copy_(inverse_cdf(current, u)[:, 0])
            return path, nxt
        return run

    def compactor(self, cache, src, dst, counts) -> Callable:
        """SwiftSpec's moves of `swiftspec.compact` as a gather then a scatter: every read sees the
        old cache. Moves past counts[b] go to the scratch row."""
        data = cache.data
        batch, channels, _, d = data.shape
        slots = torch.arange(src.shape[1], device=data.device)[None, :]

        def run():
            live = slots < counts[:, None]
            s = torch.where(live, src, cache.scratch_row).long()[:, None, :, None].expand(
                batch, channels, -1, d)
            t = torch.where(live, dst, cache.scratch_row).long()[:, None, :, None].expand(
                batch, channels, -1, d)
            data.scatter_(2, t, data.gather(2, s))
        return run


class KernelBackend:
    """The course's kernels (see the module docstring)."""

    name = "kernels"

    def __init__(self, impl: str | None = None):
        self.emssd = course_impl.load("emssd", impl)
        self.impl = impl or course_impl.impl_name()  # SwiftSpec's kernels run through kvcache_launch
        self.verification = course_impl.load("tree_verification", impl)

    def causal(self, counts: list[int], kv_lengths: list[int]) -> Callable:
        checked = None  # the kernel's input checks, done by the first layer, reused by the others

        def attend(layer, q, k, v):
            nonlocal checked
            batch, heads, width, d = q.shape
            heads_kv, slots = k.shape[1], k.shape[2]
            group = heads // heads_kv
            for name, t in (("k", k), ("v", v)):
                sb, sh, sc, sd = t.stride()
                if sd != 1 or sc != d or sh != slots * d or sb % d:
                    raise ValueError(f"the {name} cache view must have strides (R*C*d, C*d, d, 1) (a layer "
                                     f"of KVCache.data), got {t.stride()}")
            per_sample = k.stride(0) // d  # rows of d numbers between samples: R * C
            rows = (batch - 1) * per_sample + heads_kv * slots
            k_flat = torch.as_strided(k, (rows, 1, d), (d, d, 1))
            v_flat = torch.as_strided(v, (rows, 1, d), (d, d, 1))
            pair_counts = [c for c in counts for _ in range(heads_kv)]
            starts = [b * per_sample + h * slots for b in range(batch) for h in range(heads_kv)]
            lengths = [n for n in kv_lengths for _ in range(heads_kv)]
            grouped = q.reshape(batch, heads_kv, group, width, d).permute(0, 1, 3, 2, 4)  # (B, Hkv, W, G, d)
            counts_t = torch.tensor(counts, device=q.device)
            real = torch.arange(width, device=q.device)[None, :] < counts_t[:, None]
            real = real[:, None, :].expand(batch, heads_kv, width)
            queries = grouped[real].contiguous()
            if checked is None:
                checked = self.emssd.check_batch(queries, k_flat, v_flat, pair_counts, starts, lengths)
            flat = self.emssd.unpadded_attention(queries, k_flat, v_flat, pair_counts, starts, lengths,
                                                 checked=checked)
            out = torch.zeros_like(grouped)
            out[real] = flat
            return out.permute(0, 1, 3, 2, 4).reshape(batch, heads, width, d)
        return attend

    def tree_attention(self, model, cache, workspace, index: TreeIndex) -> Callable:
        """One checked launch per layer, bound to the workspace's q view, the layer's cache views and
        `index` (whose contents must describe a valid tree now: the checks read them once)."""
        q = workspace.q()
        launches = [kvcache_launch.prepare_tree_attention(q, cache.k(layer), cache.v(layer), index.q_start,
                                                          index.q_end, index.kv_start, index.kv_end,
                                                          index.prefix, index.tree_len,
                                                          query_counts=index.counts, config=TREE_TILES,
                                                          impl=self.impl)
                    for layer in range(model.config.n_layers)]

        def attend(layer, q_now, k, v):
            if q_now.data_ptr() != q.data_ptr() or q_now.stride() != q.stride():
                raise ValueError("tree attention was prepared for the workspace's q view; the step passed "
                                 "another tensor (give TinyLM.step the same workspace)")
            return launches[layer]()
        return attend

    def greedy_verifier(self, parents, tokens, best) -> Callable:
        from course.topics.verification.launch import prepare_greedy

        return prepare_greedy(self.verification, parents, tokens, best)

    def sampling_verifier(self, parents, tokens, q, p, accept_u, sample_u,
                          replacement: bool = False) -> Callable:
        from course.topics.verification.launch import prepare_sampling

        return prepare_sampling(self.verification, parents, tokens, q, p, accept_u, sample_u,
                                replacement=replacement)

    def compactor(self, cache, src, dst, counts) -> Callable:
        return kvcache_launch.prepare_compact_buffers(cache.data, src, dst, counts, impl=self.impl)


def make_backend(name: str, impl: str | None = None):
    """"kernels" (the course's kernels, from lessons/ or solutions/) or "reference" (torch)."""
    if name == "kernels":
        return KernelBackend(impl)
    if name == "reference":
        return ReferenceBackend()
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
