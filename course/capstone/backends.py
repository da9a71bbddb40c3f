"""The decoder's two backends: the course's kernels, or a dense-mask PyTorch reference.

Both expose the same five operations, so `course.capstone.decoder` runs one loop over either:

* `causal(counts, kv_lengths)`: the `attend` of `TinyLM.step` for the unpadded batch of EMS-SD
  (notebook 17): sample b feeds counts[b] new tokens after kv_lengths[b] cached ones; token i sees
  cache rows [0, kv_lengths[b] + i]. Prefill (counts = prompt lengths) and plain decoding (counts = 1).
* `tree(...)`: the `attend` of SwiftSpec's non-square tree attention (notebook 18): rows [0, P_b)
  are the prefix, rows [P_b, P_b + T_b) tree nodes with DFS times; a query sees its ancestors.
* `verify_greedy` / `verify_sample`: SpecInfer's token-tree verification (notebook 16).
* `compact`: SwiftSpec's in-place re-rooting moves of the whole KV cache (notebook 18).

Kernels: `emssd.unpadded_attention`, `swiftspec.tree_cache_attention`, `swiftspec.compact`,
`tree_verification.greedy_tree_verification` / `tree_speculative_sampling`, each loaded through
`course.core.impl.load` (lessons/ by default, solutions/ with COURSE_IMPL=solutions or impl=).

How the unpadded kernel meets the model's cache. `unpadded_attention` takes one flat cache
(S, H_kv, d) where each sample owns a run of rows; the model's cache is (B, R, C, d) (R = layers x
{k, v} x KV heads), in which a sample's rows of one KV head are C consecutive rows of d numbers,
but the rows of different heads are not interleaved per token. So each (sample, KV head) pair is
made one EMS-SD "sample" with a single KV head: its region starts at row b * R * C + h * C of the
flat (rows of d) view of the layer's keys, and its queries are the GROUP query heads that read KV
head h. No copy of the cache is made (a strided view); q and the output are regrouped (small).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from course.core import impl as course_impl
from course.core import runtime
from pyspec_ref.sampling import greedy_tree_verification
from pyspec_ref.trees import children

BACKENDS = ("kernels", "reference")


def _sdpa(q, k, v, mask):
    """Masked attention of q (B, Hq, W, d) over k, v (B, Hkv, C, d), GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def draw(probs_cpu: torch.Tensor, uniforms: torch.Tensor) -> list[int]:
    """Inverse-CDF draws (the smallest i with cdf[i] > u * total) from one distribution (V,)."""
    cdf = torch.cumsum(probs_cpu.double(), 0)
    picks = torch.searchsorted(cdf, uniforms.double() * cdf[-1], right=True)
    return picks.clamp(max=len(cdf) - 1).tolist()


class ReferenceBackend:
    """Dense boolean masks and SDPA; verification written out in torch float64 the way
    `pyspec_ref.sampling` states it (explicit residuals, inverse-CDF draws)."""

    name = "reference"

    def causal(self, counts: list[int], kv_lengths: list[int]) -> Callable:
        def attend(q, k, v):
            width = q.shape[2]
            device = q.device
            cols = torch.arange(k.shape[2], device=device)
            limit = torch.tensor(kv_lengths, device=device)[:, None] + torch.arange(width, device=device)
            mask = cols[None, None, :] <= limit[:, :, None]  # (B, W, C)
            real = torch.arange(width, device=device)[None, :] < torch.tensor(counts, device=device)[:, None]
            mask = mask & real[:, :, None]
            mask[..., 0] |= ~real  # padding queries see row 0 (discarded; avoids an all -inf row)
            return _sdpa(q, k, v, mask[:, None])
        return attend

    def tree(self, q_start, q_end, kv_start, kv_end, prefix, tree_len, counts) -> Callable:
        def attend(q, k, v):
            width = q.shape[2]
            device = q.device
            rows = torch.arange(k.shape[2], device=device)[None, :]
            p = torch.as_tensor(prefix, device=device)[:, None]
            t = torch.as_tensor(tree_len, device=device)[:, None]
            qs, qe = q_start.to(device), q_end.to(device)
            ks, ke = kv_start.to(device), kv_end.to(device)
            in_tree = (rows >= p) & (rows < p + t)  # (B, C)
            sees = (ks[:, None, :] <= qs[:, :, None]) & (qe[:, :, None] <= ke[:, None, :])
            mask = (rows < p)[:, None, :] | (in_tree[:, None, :] & sees)  # (B, W, C)
            real = torch.arange(width, device=device)[None, :] < torch.as_tensor(
                counts, device=device)[:, None]
            mask = mask & real[:, :, None]
            mask[..., 0] |= ~real
            return _sdpa(q, k, v, mask[:, None])
        return attend

    def verify_greedy(self, parents, tokens, logits):
        best = logits.argmax(dim=-1).tolist()  # the first maximum, as the kernel
        out = [greedy_tree_verification(par, tok, bst)
               for par, tok, bst in zip(parents, tokens, best, strict=True)]
        return [o[0] for o in out], [o[1] for o in out]

    def verify_sample(self, parents, tokens, q, p, accept_u, sample_u):
        q, p = q.double().cpu(), p.double().cpu()
        paths, nexts = [], []
        for b, (par, tok) in enumerate(zip(parents, tokens, strict=True)):
            kids = children(par)
            path, node = [0], 0
            while True:
                p_node = p[b, node]
                for child in kids[node]:
                    x = tok[child]
                    if float(accept_u[b, child]) * float(q[b, node, x]) < float(p_node[x]):
                        path.append(child)
                        node = child
                        break
                    residual = (p_node - q[b, node]).clamp(min=0.0)
                    total = float(residual.sum())
                    if total > 0.0:  # p == q leaves nothing to renormalise: keep p
                        p_node = residual / total
                else:
                    nexts.append(draw(p_node, sample_u[b, node:node + 1])[0])
                    paths.append(path)
                    break
        return paths, nexts

    def compact(self, data, moves: list[list[tuple[int, int]]]) -> None:
        for b, pairs in enumerate(moves):
            if pairs:
                src = torch.tensor([s for s, _ in pairs], device=data.device)
                dst = torch.tensor([d for _, d in pairs], device=data.device)
                data[b, :, dst] = data[b, :, src].clone()  # every read sees the old cache


class KernelBackend:
    """The course's kernels (see the module docstring)."""

    name = "kernels"

    def __init__(self, impl: str | None = None):
        self.emssd = course_impl.load("emssd", impl)
        self.swiftspec = course_impl.load("swiftspec", impl)
        self.verification = course_impl.load("tree_verification", impl)

    def causal(self, counts: list[int], kv_lengths: list[int]) -> Callable:
        checked = None  # the kernel's input checks, done by the first layer, reused by the others

        def attend(q, k, v):
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
            grouped = q.view(batch, heads_kv, group, width, d).permute(0, 1, 3, 2, 4)  # (B, Hkv, W, G, d)
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

    def tree(self, q_start, q_end, kv_start, kv_end, prefix, tree_len, counts) -> Callable:
        device = None
        cached: dict = {}

        def attend(q, k, v):
            nonlocal device
            if device is None:  # the index tensors move to the device once per step, not per layer
                device = q.device
                cached.update(q_start=q_start.to(device), q_end=q_end.to(device),
                              kv_start=kv_start.to(device), kv_end=kv_end.to(device),
                              prefix=torch.as_tensor(prefix, dtype=torch.int32).to(device),
                              tree_len=torch.as_tensor(tree_len, dtype=torch.int32).to(device),
                              counts=torch.as_tensor(counts, dtype=torch.int32).to(device))
            c = cached
            if "checked" not in c:  # the kernel's input checks: once per step, not once per layer
                c["checked"] = self.swiftspec.check_attention_inputs(
                    q, k, v, c["q_start"], c["q_end"], c["kv_start"], c["kv_end"], c["prefix"],
                    c["tree_len"], c["counts"])
            return self.swiftspec.tree_cache_attention(q, k, v, c["q_start"], c["q_end"], c["kv_start"],
                                                       c["kv_end"], c["prefix"], c["tree_len"],
                                                       query_counts=c["counts"], checked=c["checked"])
        return attend

    @staticmethod
    def _tensors(parents, tokens, device):
        return (torch.tensor(parents, dtype=torch.int32, device=device),
                torch.tensor(tokens, dtype=torch.int32, device=device))

    @staticmethod
    def _paths(path, next_token):
        rows = path.tolist()
        return [[v for v in row if v >= 0] for row in rows], next_token.tolist()

    def verify_greedy(self, parents, tokens, logits):
        par, tok = self._tensors(parents, tokens, logits.device)
        # On a GPU the kernel takes the target's argmax itself (argmax_kernel); in the interpreter,
        # where one program per (tree, node) row costs a NumPy loop over the vocabulary, torch's
        # argmax (the same first-maximum rule) is passed in and only the walk runs as a kernel.
        target = (logits.float().contiguous() if runtime.on_gpu()
                  else logits.argmax(dim=-1).to(torch.int32))
        path, nxt = self.verification.greedy_tree_verification(par, tok, target)
        return self._paths(path, nxt)

    def verify_sample(self, parents, tokens, q, p, accept_u, sample_u):
        par, tok = self._tensors(parents, tokens, p.device)
        path, nxt = self.verification.tree_speculative_sampling(
            par, tok, q.float().contiguous(), p.float().contiguous(), accept_u.to(p.device),
            sample_u.to(p.device))
        return self._paths(path, nxt)

    def compact(self, data, moves: list[list[tuple[int, int]]]) -> None:
        if not any(moves):
            return
        self.swiftspec.compact(data, *self.swiftspec.plan_tensors(moves, data.device))


def make_backend(name: str, impl: str | None = None):
    """"kernels" (the course's kernels, from lessons/ or solutions/) or "reference" (torch)."""
    if name == "kernels":
        return KernelBackend(impl)
    if name == "reference":
        return ReferenceBackend()
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
