"""EMS-SD (notebook 17): the unpadded attention launcher, its padded baseline, its check, its bench."""

import functools
import importlib
import random
import types

import pytest
import torch

import pyspec_ref.kvcache as spec
from course import oracle
from course.checks import run_cases
from course.core import runtime
from course.core.stubs import ExerciseNotImplemented
from course.oracle import kvcache as kv_oracle
from course.topics.kvcache import baselines, launch
from course.topics.kvcache import bench as kv_bench
from course.topics.kvcache import check as checks
from solutions import emssd


def _batch(counts, lengths, heads=2, heads_kv=2, d=16, dtype=torch.float32, seed=0):
    starts, slots = checks.scattered_layout(counts, lengths, seed)
    g = torch.Generator().manual_seed(seed)
    device = runtime.torch_device()  # the kernels refuse tensors on another device
    q = torch.randn((sum(counts), heads, d), generator=g).to(device, dtype)
    k = torch.randn((slots, heads_kv, d), generator=g).to(device, dtype)
    v = torch.randn((slots, heads_kv, d), generator=g).to(device, dtype)
    return q, k, v, starts


def test_kernel_and_padded_baseline_match_the_oracle():
    counts, lengths = [4, 0, 9, 1], [5, 3, 0, 21]
    q, k, v, starts = _batch(counts, lengths, heads=4, heads_kv=2)
    want, want_lse = kv_oracle.unpadded_attention(q, k, v, counts, starts, lengths)
    out, lse = emssd.unpadded_attention(q, k, v, counts, starts, lengths, return_lse=True)
    torch.testing.assert_close(out.double().cpu(), want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse.double().cpu(), want_lse, atol=1e-4, rtol=1e-5)
    padded = baselines.padded_attention(q, k, v, counts, starts, lengths)
    torch.testing.assert_close(padded.double().cpu(), want, atol=2e-5, rtol=1e-4)
    again = emssd.unpadded_attention(q, k, v, torch.tensor(counts, device=q.device),
                                     torch.tensor(starts, dtype=torch.int32, device=q.device), lengths)
    assert torch.equal(again, out)  # tensors or lists, twice: the same bits


def test_binary_search_steps_and_restoration_match_the_spec():
    assert [launch.search_steps(b) for b in (1, 2, 3, 4, 5, 64, 65)] == [0, 1, 2, 2, 3, 6, 7]
    counts = [0, 3, 0, 0, 2, 1, 0]
    assert spec.restore_indices(counts) == [spec.restore_index_scan(counts, t) for t in range(sum(counts))]


@pytest.mark.parametrize("change, message", [
    (dict(counts=[3, 3]), "counts add up to 6"),
    (dict(kv_starts=[0]), "kv_starts has 1 entries"),
    (dict(kv_lengths=[4, -1]), r"kv_lengths\[1\] = -1"),
    (dict(kv_starts=[0, 2]), "overlap"),
    (dict(kv_starts=[0, 100]), "runs past the end of the cache"),
    (dict(counts=[2.0, 3]), r"counts\[0\] must be an int"),
])
def test_bad_bookkeeping_is_refused_by_name(change, message):
    q, k, v, starts = _batch([2, 3], [4, 5])
    args = dict(counts=[2, 3], kv_starts=starts, kv_lengths=[4, 5]) | change
    with pytest.raises((ValueError, TypeError), match=message):
        emssd.unpadded_attention(q, k, v, args["counts"], args["kv_starts"], args["kv_lengths"])


def test_bad_tensors_are_refused_by_name():
    q, k, v, starts = _batch([2, 3], [4, 5])
    if runtime.SIMULATOR:  # the interpreter's bf16 tl.dot is wrong, so it is refused there (fine on a GPU)
        with pytest.raises(TypeError, match="bfloat16"):
            emssd.unpadded_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), [2, 3], starts, [4, 5])
    with pytest.raises(TypeError, match="k_cache must have q's dtype"):
        emssd.unpadded_attention(q, k.half(), v, [2, 3], starts, [4, 5])
    bad = q.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="q contains NaN"):
        emssd.unpadded_attention(bad, k, v, [2, 3], starts, [4, 5])
    with pytest.raises(ValueError, match="head dimension"):
        emssd.unpadded_attention(q[..., :12].contiguous(), k[..., :12].contiguous(), v[..., :12].contiguous(),
                                 [2, 3], starts, [4, 5])
    with pytest.raises(ValueError, match="scale"):
        emssd.unpadded_attention(q, k, v, [2, 3], starts, [4, 5], scale=-1.0)


def test_a_stub_in_notebook_12s_softmax_step_stops_the_kernel(monkeypatch):
    """The kernel calls triton_attention.online_softmax_step: its lesson stub is named."""
    monkeypatch.setattr(emssd, "online_softmax_step",
                        importlib.import_module("lessons.triton_attention").online_softmax_step)
    q, k, v, starts = _batch([2, 3], [4, 5])
    prepared = functools.partial(launch.prepare_unpadded_attention, impl="solutions")
    for call in (emssd.unpadded_attention, prepared):
        with pytest.raises(ExerciseNotImplemented, match="exercise triton_attention.online_softmax_step"):
            call(q, k, v, [2, 3], starts, [4, 5])


def _not_causal(q, k_cache, v_cache, counts, kv_starts, kv_lengths, *, return_lse=False):
    """A wrong kernel: every new token sees all of its sample's new tokens."""
    rows = torch.arange(k_cache.shape[0], device=k_cache.device)
    masks = [(rows >= s) & (rows < s + n + c) for c, s, n in zip(counts, kv_starts, kv_lengths, strict=True)
             for _ in range(c)]
    out, lse = oracle.attention_with_lse(q.transpose(0, 1), k_cache.transpose(0, 1), v_cache.transpose(0, 1),
                                         torch.stack(masks)[None])
    out, lse = out.transpose(0, 1).to(q.device, q.dtype), lse.transpose(0, 1).to(q.device, torch.float32)
    return (out, lse) if return_lse else out


def test_check_catches_a_kernel_that_is_not_causal():
    cases = list(checks.check_unpadded_attention(types.SimpleNamespace(unpadded_attention=_not_causal), 0))
    report = run_cases("emssd.unpadded_attention_kernel", cases[:2])
    assert not report.passed
    assert all(not r.passed and "out" in r.detail for r in report.results)


def test_bench_simulation_is_realistic():
    rng = random.Random(0)
    draws = [kv_bench.accept_length(8, rng) for _ in range(2000)]
    assert min(draws) == 1 and max(draws) <= 8
    assert 3.3 < sum(draws) / len(draws) < 3.9  # 1 + alpha + ... + alpha^7 = 3.6 for alpha = 0.75
    sim = kv_bench.simulate(16)
    assert sim["padded_length"] >= max(sim["kv_lengths"])
    assert all(2 <= c <= kv_bench.MAX_DRAFT + 1 for c in sim["counts"])


def test_a_checked_layout_is_reused_and_a_mismatch_refused():
    """A model's layers share one layout: check it once, pass it to every layer's call."""
    counts, lengths = [2, 3], [4, 5]
    q, k, v, starts = _batch(counts, lengths)
    checked = emssd.check_batch(q, k, v, counts, starts, lengths)
    again = emssd.unpadded_attention(q, k, v, counts, starts, lengths, checked=checked)
    assert torch.equal(again, emssd.unpadded_attention(q, k, v, counts, starts, lengths))
    with pytest.raises(ValueError, match="checked was made for a batch of 5 tokens"):
        emssd.unpadded_attention(q[:4], k, v, counts, starts, lengths, checked=checked)
    with pytest.raises(TypeError, match="checked must be a Batch"):
        emssd.unpadded_attention(q, k, v, counts, starts, lengths, checked="yes")
