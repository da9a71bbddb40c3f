"""Checks for EMS-SD's unpadded attention kernel (notebook 17).

A module exposes `unpadded_attention(q, k_cache, v_cache, counts, kv_starts, kv_lengths, *,
return_lse=False)` for q (T, H, d) and a cache (S, H_kv, d) (see `solutions.emssd`). Every case
is compared in full with a float64 torch oracle (`oracle_unpadded`: a dense (T, S) mask built
straight from the EMS-SD rule), on one head with `pyspec_ref.kvcache.unpadded_attention` itself,
and runs twice: the two runs must agree bit for bit. Tolerances as for notebook 12's kernel
(`course.topics.triton_attention.check.TOLERANCES`): standard-normal inputs, float32 accumulation.

The batches are tiny (the interpreter runs every op in NumPy) but cover: one sample; a sample
with 0 new tokens (it owns no flat token); a sample with an empty cache (KV length 0); samples of
very different lengths (several KV blocks against one); regions scattered in the cache out of
sample order, with gaps; tiles of 16 tokens that straddle samples; grouped-query attention; and
counts that do not add up to q's rows, which must be refused with a ValueError naming counts.
"""

from __future__ import annotations

import random

import torch

import pyspec_ref.kvcache as spec
from course import oracle
from course.checks import CaseResult, rerun_problem
from course.checks.diagnose import compare_floats
from course.core import inputs, runtime
from course.topics.triton_attention.check import LSE_TOLERANCE, TOLERANCES, dtype_name

LABELS = ("token", "head", "column")
LSE_LABELS = ("token", "head")


def oracle_unpadded(q, k_cache, v_cache, counts, kv_starts, kv_lengths, scale=None):
    """float64 (out (T, H, d), lse (T, H)): token i of sample b sees rows s_b .. s_b + n_b + i."""
    total, heads, _ = q.shape
    slots, heads_kv, _ = k_cache.shape
    rows = torch.arange(slots)
    mask = torch.zeros((total, slots), dtype=torch.bool)
    t = 0
    for c, s, n in zip(counts, kv_starts, kv_lengths, strict=True):
        for i in range(c):
            mask[t] = (rows >= s) & (rows <= s + n + i)
            t += 1
    group = heads // heads_kv
    k = k_cache.cpu().repeat_interleave(group, dim=1).transpose(0, 1)  # (H, S, d)
    v = v_cache.cpu().repeat_interleave(group, dim=1).transpose(0, 1)
    out, lse = oracle.attention_with_lse(q.cpu().transpose(0, 1), k, v, mask[None], scale)
    return out.transpose(0, 1), lse.transpose(0, 1)


def scattered_layout(counts: list[int], kv_lengths: list[int], seed: int, gap: int = 3):
    """kv_starts placing the samples' regions in a shuffled order with gaps; returns (starts, S)."""
    order = list(range(len(counts)))
    random.Random(seed).shuffle(order)
    starts = [0] * len(counts)
    row = gap
    for b in order:
        starts[b] = row
        row += kv_lengths[b] + counts[b] + gap
    return starts, row


def cases(seed: int) -> list[tuple[str, list[int], list[int], int, int, int, torch.dtype]]:
    """(name, counts, kv_lengths, heads, heads_kv, d, dtype) of every case."""
    rng = random.Random(seed)
    many = runtime.pick(sim=8, gpu=64)
    mixed_counts = [rng.randint(0, 9) for _ in range(many)]
    mixed_counts[0] = max(mixed_counts[0], 1)
    mixed_lengths = [rng.randint(0, runtime.pick(sim=40, gpu=2000)) for _ in range(many)]
    out = [
        ("one sample", [5], [20], 2, 2, 32, torch.float32),
        ("a sample with 0 new tokens", [4, 0, 3], [10, 5, 9], 2, 2, 32, torch.float32),
        ("a sample with KV length 0", [3, 2, 6], [7, 0, 12], 2, 2, 32, torch.float32),
        ("very different lengths", [1, 9, 2], [70, 0, 3], 2, 2, 32, torch.float32),
        ("tiles that straddle samples", [7, 12, 5, 0, 9], [3, 11, 20, 4, 6], 2, 2, 16, torch.float32),
        ("grouped-query attention (4 heads, 2 KV heads)", [3, 6, 2], [9, 4, 17], 4, 2, 32, torch.float16),
        (f"random batch of {many} samples", mixed_counts, mixed_lengths, 2, 2, 64, torch.float16),
        ("float16, last sample empty", [6, 3, 0], [12, 30, 8], 2, 1, 64, torch.float16),
    ]
    if runtime.on_gpu():
        out.append(("bfloat16 batch", [4, 1, 8], [100, 7, 300], 4, 2, 128, torch.bfloat16))
    return out


def _case_tensors(counts, kv_lengths, heads, heads_kv, d, dtype, seed):
    device = runtime.torch_device()
    starts, slots = scattered_layout(counts, kv_lengths, seed)
    q = inputs.random_tensor((sum(counts), heads, d), seed, dtype, device)
    k = inputs.random_tensor((slots, heads_kv, d), seed + 1, dtype, device)
    v = inputs.random_tensor((slots, heads_kv, d), seed + 2, dtype, device)
    return q, k, v, starts


def _spec_problem(out, lse, q, k, v, counts, starts, kv_lengths, head, tolerance) -> str:
    """Compare one head with pyspec_ref.kvcache.unpadded_attention (the specification itself)."""
    group = q.shape[1] // k.shape[1]
    want, want_lse = spec.unpadded_attention(
        q[:, head].double().tolist(), k[:, head // group].double().tolist(),
        v[:, head // group].double().tolist(), counts, starts, kv_lengths)
    return (compare_floats(out[:, head].cpu(), torch.tensor(want), f"out (head {head}, vs pyspec_ref)",
                           ("token", "column"), *tolerance)
            or compare_floats(lse[:, head].cpu(), torch.tensor(want_lse), f"lse (head {head}, vs pyspec_ref)",
                              ("token",), *LSE_TOLERANCE))


def check_unpadded_attention(module, seed: int):
    """module.unpadded_attention must equal EMS-SD's per-sample causal attention, with its LSE."""
    for index, (name, counts, kv_lengths, heads, heads_kv, d, dtype) in enumerate(cases(seed)):
        label = f"{name}, counts={counts if len(counts) <= 8 else '...'}, d={d}, {dtype_name(dtype)}"

        def run(label=label, counts=counts, kv_lengths=kv_lengths, heads=heads, heads_kv=heads_kv, d=d,
                dtype=dtype, index=index):
            q, k, v, starts = _case_tensors(counts, kv_lengths, heads, heads_kv, d, dtype,
                                            seed + 11 * index)
            out, lse = module.unpadded_attention(q, k, v, counts, starts, kv_lengths, return_lse=True)
            if not isinstance(out, torch.Tensor) or out.dtype != dtype or lse.dtype != torch.float32:
                got = f"{getattr(out, 'dtype', type(out))} and {getattr(lse, 'dtype', type(lse))}"
                return CaseResult(label, False, f"expected out in {dtype_name(dtype)} and lse in float32, "
                                                f"got {got}")
            again = module.unpadded_attention(q, k, v, counts, starts, kv_lengths, return_lse=True)
            want, want_lse = oracle_unpadded(q, k, v, counts, starts, kv_lengths)
            tolerance = TOLERANCES[dtype]
            problem = (compare_floats(out, want, "out", LABELS, *tolerance)
                       or compare_floats(lse, want_lse, "lse", LSE_LABELS, *LSE_TOLERANCE)
                       or _spec_problem(out, lse, q, k, v, counts, starts, kv_lengths, index % heads,
                                        tolerance)
                       or rerun_problem((out, lse), again))
            return CaseResult(label, False, problem) if problem else None
        yield label, run

    def refuses_bad_counts():
        name = "counts that don't add up to q's rows -> ValueError naming counts"
        q, k, v, starts = _case_tensors([3, 2], [4, 5], 2, 2, 16, torch.float32, seed)
        try:
            module.unpadded_attention(q, k, v, [3, 3], starts, [4, 5])
        except ValueError as error:
            if "counts" in str(error):
                return None
            return CaseResult(name, False, f"the ValueError does not name counts: {error}")
        return CaseResult(name, False, "counts [3, 3] for 5 rows of q were accepted")
    yield "counts that don't add up", refuses_bad_counts
