"""SwiftSpec (notebook 18): in-place compaction and non-square tree attention, their checks and bench."""

import random
import types

import pytest
import torch

import course
import pyspec_ref
import pyspec_ref.kvcache as spec
from course.checks import run_cases
from course.core import inputs, runtime
from course.oracle import kvcache as kv_oracle
from course.topics.kvcache import baselines, launch, tuning
from course.topics.kvcache import bench as swiftspec_bench
from course.topics.kvcache import check as checks
from course.topics.kvcache import figures as kv_figures
from solutions import swiftspec

DEVICE = runtime.torch_device()


def _cache(shape, seed=0, dtype=torch.float32):
    return inputs.random_tensor(shape, seed, dtype, DEVICE)


def _samples(seed, batch=3, prefix=4):
    rng = random.Random(seed)
    out = []
    for _ in range(batch):
        parents = inputs.random_tree(rng.randint(1, 30), rng, max_children=3)
        out.append((prefix + rng.randint(0, 3), parents, checks.random_root_path(parents, rng)))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compact_and_naive_equal_the_specification(dtype):
    samples = _samples(1)
    capacity = 40
    plans = [spec.compact_plan(p, t, path) for p, t, path in samples]
    sources = [checks.slot_sources(p, t, path, capacity) for p, t, path in samples]
    cache = _cache((3, 2, capacity, 16), 1, dtype)
    want = kv_oracle.compaction(cache, sources)
    src, dst, counts = launch.plan_tensors(plans, DEVICE)
    got = cache.clone()
    assert swiftspec.compact(got, src, dst, counts) is got
    assert torch.equal(got, want)
    naive = cache.clone()
    baselines.naive_compact(naive, src, dst, counts)
    assert torch.equal(naive, want)


def test_compact_handles_a_long_overlapping_shift_and_views():
    # Root -> leaf 1, root -> a chain of 40: verifying [0, 2] shifts 40 rows left by one slot.
    parents = [-1, 0, 0] + list(range(2, 41))
    plan = spec.compact_plan(3, parents, [0, 2])
    assert len(plan) == 40 and all(s == d + 1 for s, d in plan)
    data = _cache((1, 5, 50, 16), 2)
    old = data.clone()
    view = data[:, 1:4]  # stacked rows 1..3 only: non-contiguous in dims 0/1
    src, dst, counts = launch.plan_tensors([plan], DEVICE)
    swiftspec.compact(view, src, dst, counts)
    want = kv_oracle.compaction(old[:, 1:4], [checks.slot_sources(3, parents, [0, 2], 50)])
    assert torch.equal(data[:, 1:4], want)
    assert torch.equal(data[:, [0, 4]], old[:, [0, 4]])


def test_moves_in_any_order_and_no_moves():
    cache = _cache((2, 1, 10, 16), 3)
    src = torch.tensor([[7, 9, 8], [0, 0, 0]], dtype=torch.int32, device=DEVICE)
    dst = torch.tensor([[6, 8, 7], [0, 0, 0]], dtype=torch.int32, device=DEVICE)
    counts = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    want = cache.clone()
    want[0, :, [6, 7, 8]] = cache[0, :, [7, 8, 9]]
    swiftspec.compact(cache, src, dst, counts)
    assert torch.equal(cache, want)


@pytest.mark.parametrize("change, error, message", [
    ("right shift", ValueError, r"dst\[0, 1\] = 8 >= src\[0, 1\] = 6"),
    ("duplicate", ValueError, r"dst\[1, 0\] and dst\[1, 1\] are both slot 3"),
    ("src out of range", ValueError, r"src\[1, 0\] = 12 is out of range"),
    ("negative dst", ValueError, r"dst\[0, 0\] = -1 is out of range"),
    ("counts too large", ValueError, r"counts\[0\] = 4 must be in \[0, M = 3\]"),
    ("negative counts", ValueError, r"counts\[1\] = -1"),
    ("float src", TypeError, "src must be an int32"),
    ("src shape", ValueError, r"src must be a \(B, M\)"),
    ("counts shape", ValueError, r"counts must have shape \(2,\)"),
])
def test_bad_moves_are_refused_by_name_and_the_cache_is_unchanged(change, error, message):
    cache = _cache((2, 2, 12, 16), 4)
    old = cache.clone()
    for fn in (swiftspec.compact, baselines.naive_compact):
        with pytest.raises(error, match=message):
            fn(cache, *checks.bad_moves(change, DEVICE))
        assert torch.equal(cache, old)


def test_plan_tensors_pads_and_refuses_bad_plans():
    src, dst, counts = launch.plan_tensors([[(5, 3), (6, 4)], []], DEVICE)
    assert src.tolist() == [[5, 6], [0, 0]] and dst.tolist() == [[3, 4], [0, 0]] and counts.tolist() == [2, 0]
    assert launch.plan_tensors([[]], DEVICE)[0].shape == (1, 1)
    with pytest.raises(ValueError, match="width"):
        launch.plan_tensors([[(5, 3), (6, 4)]], DEVICE, width=1)
    with pytest.raises(TypeError, match=r"plans\[0\]\[0\]"):
        launch.plan_tensors([[(5, 3.0)]], DEVICE)


def _attention(samples, heads=4, heads_kv=2, width=4, d=16, dtype=torch.float32, **options):
    return checks.attention_problem(samples, heads, heads_kv, width, d, dtype, seed=5, **options)


def _tree(n, seed):
    return tuple(inputs.random_tree(n, random.Random(seed), max_children=3))


def test_attention_equals_the_oracle_and_the_specification():
    t1, t2 = _tree(20, 1), _tree(9, 2)
    order = list(range(20))
    random.Random(3).shuffle(order)
    samples = [(7, t1, (19, 3, 0, 12), order), (0, t2, (8, 5, 1, 2), None)]
    kwargs, nodes = _attention(samples, counts=[4, 2], view=True)
    out, lse = swiftspec.tree_cache_attention(**kwargs, return_lse=True)
    want, want_lse = kv_oracle.nonsquare_tree_attention(**kwargs)
    torch.testing.assert_close(out.double().cpu(), want.cpu(), atol=2e-5, rtol=1e-4)
    assert torch.equal(out[1, :, 2:], torch.zeros_like(out[1, :, 2:]))  # padding queries
    assert torch.isinf(lse[1, :, 2:]).all()
    want_lse = want_lse.cpu()
    seen = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.double().cpu()[seen], want_lse[seen], atol=1e-4, rtol=1e-5)
    # The specification itself, on sample 1 (rows in DFS order), head 3 (KV head 1).
    p, parents, query, _ = samples[1]
    start, end = pyspec_ref.dfs_times(list(parents))
    spec_out, _ = spec.nonsquare_tree_attention(
        kwargs["q"][1, 3, :2].double().tolist(), kwargs["k_cache"][1, 1].double().tolist(),
        kwargs["v_cache"][1, 1].double().tolist(), start, end, list(query[:2]), p)
    torch.testing.assert_close(out[1, 3, :2].double().cpu(), torch.tensor(spec_out, dtype=torch.float64),
                               atol=2e-5, rtol=1e-4)
    assert torch.equal(swiftspec.tree_cache_attention(**kwargs), out)  # twice: the same bits


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_key_ranges_merged_by_lse_equal_one_pass(splits):
    """Flash-Decoding's split: ranges that hold only prefix, only tree rows, both, or nothing at
    all (7 ranges of whole blocks over fewer blocks) give the same result as one pass."""
    t1, t2 = _tree(20, 1), _tree(9, 2)
    samples = [(37, t1, (19, 3, 0, 12), None), (0, t2, (8, 5, 1, 2), None)]
    kwargs, _ = _attention(samples, counts=[4, 2], capacity=80)
    one = launch.prepare_tree_attention(**kwargs, return_lse=True, impl="solutions")()
    config = tuning.attention_config(2 * 4, 16, torch.float32)
    split = launch.prepare_tree_attention(**kwargs, return_lse=True, impl="solutions",
                                          config=tuning.AttentionConfig(config.block_m, config.block_n,
                                                                        config.num_warps, config.num_stages,
                                                                        splits=splits))()
    want, want_lse = kv_oracle.nonsquare_tree_attention(**kwargs)
    torch.testing.assert_close(split[0].double().cpu(), want.cpu(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(split[0], one[0], atol=1e-5, rtol=1e-5)
    seen = torch.isfinite(want_lse.cpu())
    assert torch.equal(torch.isfinite(split[1].cpu()), seen)
    torch.testing.assert_close(split[1].cpu()[seen].double(), want_lse.cpu()[seen], atol=1e-4, rtol=1e-5)


def test_prefix_only_one_node_and_int64_lists():
    samples = [(5, (), (), None), (3, (-1,), (0,), None)]
    kwargs, _ = _attention(samples, width=1, counts=[1, 1])
    kwargs["prefix_lengths"] = kwargs["prefix_lengths"].tolist()  # lists and int64 work too
    kwargs["kv_start"] = kwargs["kv_start"].long()
    out = swiftspec.tree_cache_attention(**kwargs)
    want, _ = kv_oracle.nonsquare_tree_attention(**kwargs)
    torch.testing.assert_close(out.double().cpu(), want.cpu(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("change, error, message", [
    ("overflow", ValueError, r"tree_lengths\[0\] = 14 plus prefix_lengths exceeds the cache"),
    ("q_end", ValueError, r"q_end\[0, 1\] = -1 must be >= q_start"),
    ("kv_end", ValueError, r"kv_end\[0, 5\] = -3 must be >= kv_start"),
    ("counts", ValueError, r"query_counts\[0\] = 5 must be in \[0, W = 4\]"),
    ("kv shape", ValueError, r"kv_start must have shape \(1, 17\)"),
    ("dtype", TypeError, "k_cache must have q's dtype float32"),
    ("heads", ValueError, "multiple of k_cache's 3 KV heads"),
    ("nan", ValueError, r"q contains NaN or infinite values in a real query \(sample 0, query 2\)"),
    ("stride", ValueError, "last dimension must be contiguous"),
    ("head dim", ValueError, "head dimension"),
    ("scale", ValueError, "scale"),
])
def test_bad_attention_input_is_refused_by_name(change, error, message):
    kwargs, _ = _attention([(4, _tree(8, 4), (7, 6, 5, 1), None)], heads=6, heads_kv=3, capacity=17)
    extra = {}
    if change == "overflow":
        kwargs["tree_lengths"] = kwargs["tree_lengths"] + 6
    elif change == "q_end":
        kwargs["q_end"][0, 1] = -1
    elif change == "kv_end":
        kwargs["kv_end"][0, 5] = -3
    elif change == "counts":
        extra["query_counts"] = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    elif change == "kv shape":
        kwargs["kv_start"] = kwargs["kv_start"][:, :16]
    elif change == "dtype":
        kwargs["k_cache"] = kwargs["k_cache"].half()
    elif change == "heads":
        kwargs["q"] = kwargs["q"][:, :4].contiguous()
    elif change == "nan":
        kwargs["q"][0, 0, 2, 0] = float("nan")
    elif change == "stride":
        kwargs["k_cache"] = kwargs["k_cache"].transpose(2, 3).contiguous().transpose(2, 3)
    elif change == "head dim":
        for key in ("q", "k_cache", "v_cache"):
            kwargs[key] = kwargs[key][..., :12].contiguous()
    elif change == "scale":
        extra["scale"] = 0.0
    with pytest.raises(error, match=message):
        swiftspec.tree_cache_attention(**kwargs, **extra)


def test_nan_in_padding_queries_and_unused_rows_is_ignored():
    kwargs, _ = _attention([(4, _tree(8, 4), (7, 6, 5, 1), None)], capacity=20, counts=[3])
    kwargs["q"][0, :, 3] = float("nan")  # a padding query
    kwargs["k_cache"][0, :, 15:] = float("nan")  # capacity beyond P + T = 12
    kwargs["v_cache"][0, :, 15:] = float("inf")
    out = swiftspec.tree_cache_attention(**kwargs)
    assert torch.isfinite(out).all() and (out[:, :, 3] == 0).all()


@pytest.mark.skipif(course.on_gpu(), reason="bfloat16 is refused only in the interpreter")
def test_bfloat16_is_refused_in_the_interpreter():
    kwargs, _ = _attention([(4, _tree(8, 4), (7, 6, 5, 1), None)])
    for key in ("q", "k_cache", "v_cache"):
        kwargs[key] = kwargs[key].bfloat16()
    with pytest.raises(TypeError, match="bfloat16"):
        swiftspec.tree_cache_attention(**kwargs)


def _reverse_order_compact(cache, src, dst, counts):
    """A wrong compaction: the moves one by one in place, right to left (reads overwritten rows)."""
    for b in range(cache.shape[0]):
        pairs = sorted(zip(src[b, :int(counts[b])].tolist(), dst[b, :int(counts[b])].tolist(), strict=True),
                       key=lambda m: -m[1])
        for s, d in pairs:
            cache[b, :, d] = cache[b, :, s]
    return cache


def _square_only(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end, prefix_lengths, tree_lengths, *,
                 query_counts=None, scale=None, return_lse=False):
    """A wrong attention: forgets the prefix (as if the mask were the tree's square one)."""
    zero = torch.zeros_like(torch.as_tensor(prefix_lengths))
    shift = torch.as_tensor(prefix_lengths).long()
    rows = (torch.arange(k_cache.shape[2], device=shift.device)[None, :] + shift[:, None]).clamp(
        max=k_cache.shape[2] - 1)
    k = torch.stack([k_cache[b][:, rows[b]] for b in range(k_cache.shape[0])])
    v = torch.stack([v_cache[b][:, rows[b]] for b in range(v_cache.shape[0])])
    ks = torch.stack([kv_start[b][rows[b]] for b in range(k_cache.shape[0])])
    ke = torch.stack([kv_end[b][rows[b]] for b in range(k_cache.shape[0])])
    out, lse = kv_oracle.nonsquare_tree_attention(q, k, v, q_start, q_end, ks, ke, zero, tree_lengths,
                                                  query_counts)
    out, lse = out.to(q.device, q.dtype), lse.to(q.device, torch.float32)
    return (out, lse) if return_lse else out


def test_checks_catch_wrong_kernels():
    wrong = types.SimpleNamespace(compact=_reverse_order_compact, plan_tensors=launch.plan_tensors)
    cases = list(checks.check_compaction(wrong, 0))
    report = run_cases("swiftspec.compact_kernel", cases[1:2])  # the long overlapping shift
    assert not report.passed and "holds the row of old slot" in report.results[0].detail
    refusals = run_cases("swiftspec.compact_kernel", cases[-4:])
    assert not refusals.passed  # it never refuses anything
    wrong = types.SimpleNamespace(tree_cache_attention=_square_only, compact=swiftspec.compact,
                                  plan_tensors=launch.plan_tensors)
    cases = list(checks.check_tree_cache_attention(wrong, 0))
    report = run_cases("swiftspec.tree_cache_attention_kernel", cases[:1])
    assert not report.passed and "out" in report.results[0].detail


def test_reroot_property_holds_for_random_paths():
    rng = random.Random(7)
    for i in range(2):
        parents = inputs.random_tree(18, rng, max_children=3)
        path = checks.random_root_path(parents, rng, stop=0.2)
        assert checks.reroot_problem(swiftspec, 3 + i, parents, path, 2, 2, 1, 16, torch.float32, i) == ""


def test_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parents = [-1, 0, 0, 1, 1, 2, 2, 5]
    kv_figures.draw_cache_reroot(3, parents, [0, 2, 5])
    mask = spec.nonsquare_tree_mask(*pyspec_ref.dfs_times(parents), [7, 6, 4], 3)
    kv_figures.draw_nonsquare_mask(mask, 3, [7, 6, 4])
    rows = [dict(figure="compaction", model="m", name=n, C=c, moves=m,
                 median_ms=0.01 * m * (2 if n == "naive" else 1))
            for n in ("compact", "naive") for c in (64, 128) for m in (5, 50)]
    rows += [dict(figure="attention", workload=w, name=n, median_ms=0.1) for w in ("a", "b")
             for n in ("nonsquare", "sdpa_dense_mask")]
    compaction = kv_figures.compaction_figure(rows, note="test")
    assert len(compaction.axes[0].lines) == 4  # 2 methods x 2 values of C
    attention = kv_figures.attention_figure(rows)
    assert len(attention.axes[0].patches) == 4  # 2 methods x 2 workloads
    with pytest.raises(ValueError, match="no measured"):
        kv_figures.attention_figure(rows[:2])
    plt.close("all")


def test_bench_runs_at_tiny_sizes_and_merges_rows(monkeypatch, tmp_path):
    monkeypatch.setattr(swiftspec_bench, "MODELS", {"tiny": (1, 1, 16)})
    monkeypatch.setattr(swiftspec_bench, "PREFIX", 5)
    monkeypatch.setattr(swiftspec_bench, "BATCH", 2)
    monkeypatch.setattr(swiftspec_bench, "ATTN_HEADS", 2)
    monkeypatch.setattr(swiftspec_bench, "ATTN_KV_HEADS", 1)
    monkeypatch.setattr(swiftspec_bench, "ATTN_D", 16)
    monkeypatch.setattr(swiftspec_bench.timing, "bench", lambda fn, **_: (fn(), 1.0)[1])
    monkeypatch.setattr(swiftspec_bench.timing, "graphed", lambda fn: fn)  # no CUDA graphs in the simulator
    rows = swiftspec_bench.measure_compaction("tiny", 12, 24)
    assert [r["name"] for r in rows] == ["compact", "naive"] and all(r["max_abs_err"] == 0 for r in rows)
    rows += swiftspec_bench.measure_attention(6, 16, 4)
    assert {r["name"] for r in rows if r["figure"] == "attention"} == {"nonsquare", "sdpa_dense_mask",
                                                                        "square_tree"}
    assert all(r.get("error") or r["max_abs_err"] < 1e-2 for r in rows)
    old = [dict(name="unpadded", study="emssd", median_ms=1.0, max_abs_err=0.0),
           dict(name="compact", study="swiftspec", section="swiftspec", figure="compaction", median_ms=9.0,
                max_abs_err=0.0),
           dict(name="nonsquare", study="swiftspec", section="swiftspec", figure="attention", median_ms=9.0,
                max_abs_err=0.0)]
    # `python -m course bench kvcache compaction` keeps the committed rows of the other sections.
    assert [swiftspec_bench.section_of(row) for row in old] == ["emssd", "compaction", "attention"]
    assert {swiftspec_bench.section_of(row) for row in rows} == {"compaction", "attention"}


@pytest.mark.skipif(runtime.SIMULATOR, reason="needs a CUDA GPU")
def test_gpu_compaction_is_race_free_at_model_scale():
    parents = [-1, 0, 0] + list(range(2, 1001))  # a 1000-row subtree shifting left by one slot
    plan = spec.compact_plan(700, parents, [0, 2])
    cache = _cache((4, 96, 2048, 64), 9, torch.float16)
    old = cache.clone()
    src, dst, counts = launch.plan_tensors([plan] * 4, DEVICE)
    swiftspec.compact(cache, src, dst, counts)
    want = kv_oracle.compaction(old, [checks.slot_sources(700, parents, [0, 2], 2048)] * 4)
    assert torch.equal(cache, want)


@pytest.mark.skipif(runtime.SIMULATOR, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("width, d", [(1, 32), (7, 16), (64, 64), (256, 32)])
def test_gpu_attention_sizes(dtype, width, d):
    n = max(width + 3, 40)
    parents = _tree(n, width)
    samples = [(1500, parents, tuple(range(n - width, n)), None), (3, parents, tuple(range(width)), None)]
    kwargs, _ = _attention(samples, heads=8, heads_kv=2, width=width, d=d, dtype=dtype, view=True)
    out, lse = swiftspec.tree_cache_attention(**kwargs, return_lse=True)
    want, _ = kv_oracle.nonsquare_tree_attention(**kwargs)
    atol, rtol = checks.TOLERANCES[dtype]
    torch.testing.assert_close(out.cpu().double(), want, atol=atol, rtol=rtol)


def test_a_checked_layout_is_reused_and_a_mismatch_refused():
    kwargs, _ = _attention([(4, _tree(8, 4), (7, 6, 5, 1), None)], capacity=17)
    checked = swiftspec.check_attention_inputs(*(kwargs[k] for k in (
        "q", "k_cache", "v_cache", "q_start", "q_end", "kv_start", "kv_end", "prefix_lengths",
        "tree_lengths")))
    assert torch.equal(swiftspec.tree_cache_attention(**kwargs, checked=checked),
                       swiftspec.tree_cache_attention(**kwargs))
    short = dict(kwargs, q=kwargs["q"][:, :, :3].contiguous())
    with pytest.raises(ValueError, match="checked was made for queries"):
        swiftspec.tree_cache_attention(**short, checked=checked)
