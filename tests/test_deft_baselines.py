"""course.topics.deft.baselines against the float64 oracle (itself checked against pyspec_ref), and
course.topics.deft.bench's rows and targets, all on CPU with tiny workloads."""

import importlib
import math

import pytest
import torch

import course
import pyspec_ref
from course import oracle
from course.__main__ import main
from course.measure import results
from course.topics.deft import baselines as deft_baselines
from course.topics.deft import bench as deft_bench
from course.topics.deft import tuning, workloads
from course.topics.deft.baselines import BaselineUnavailable

CASES = workloads.tiny() + workloads.edge_cases(16)
IDS = [w.name for w in CASES]
DEVICE = course.torch_device()  # the Triton kernels want the kernel device (CPU in the interpreter)
ATOL = 2e-6 if course.SIMULATOR else 2e-5  # float32 inputs; a GPU's SDPA kernels round a little more


def qkv(workload, heads_q=8, heads_kv=2, d=16, dtype=torch.float32, seed=0):
    q = workloads.query_tensor(workload, heads_q, d, dtype, DEVICE, seed)
    k, v = workloads.kv_tensors(workload, heads_kv, d, dtype, DEVICE, seed)
    return q, k, v


def reference(q, k, v, workload):
    """The float64 oracle of every query of a workload."""
    return oracle.tree_kv_attention(q, k, v, workload.parents, workload.lengths, workload.query_nodes)


@pytest.mark.parametrize("workload", CASES, ids=IDS)
def test_visibility_mask_is_the_specifications(workload):
    from pyspec_ref import deft

    want = deft.visible_tokens(list(workload.parents), list(workload.lengths), list(workload.query_nodes))
    mask = deft_baselines.visibility_mask(workload)
    assert [row.nonzero().squeeze(1).tolist() for row in mask] == want


@pytest.mark.parametrize("workload", [workloads.tiny()[2], workloads.edge_cases()[4]], ids=lambda w: w.name)
def test_the_oracle_is_attention_with_lse_of_pyspec_ref(workload):
    q, k, v = (t.cpu() for t in qkv(workload, heads_q=4, heads_kv=2, d=8))
    out, lse = reference(q, k, v, workload)
    mask = deft_baselines.visibility_mask(workload).tolist()
    for h in range(4):
        want, want_lse = pyspec_ref.attention_with_lse(q[:, h].tolist(), k[:, h // 2].tolist(),
                                                       v[:, h // 2].tolist(), mask)
        assert torch.allclose(out[:, h], torch.tensor(want, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(lse[:, h], torch.tensor(want_lse, dtype=torch.float64), atol=1e-12)
    some = [len(workload.query_nodes) - 1, 0]  # a subset of the queries, out of order, as the bench asks
    part, part_lse = oracle.tree_kv_attention(q[some], k, v, workload.parents, workload.lengths,
                                              [workload.query_nodes[i] for i in some])
    assert torch.allclose(part, out[some], atol=1e-12) and torch.allclose(part_lse, lse[some], atol=1e-12)
    spec = importlib.import_module("pyspec_ref.deft")
    if hasattr(spec, "tree_kv_attention"):  # the DeFT specification's own definition, one head
        want, _ = spec.tree_kv_attention(q[:, 0].tolist(), k[:, 0].tolist(), v[:, 0].tolist(),
                                         list(workload.parents), list(workload.lengths),
                                         list(workload.query_nodes))
        assert torch.allclose(out[:, 0], torch.tensor(want, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("name", ["sequence", "medusa_dense"])
@pytest.mark.parametrize("workload", CASES, ids=IDS)
def test_sdpa_baselines_equal_the_oracle(name, workload):
    for heads_q, heads_kv in ((8, 2), (2, 2)):  # grouped-query and plain multi-head
        q, k, v = qkv(workload, heads_q, heads_kv)
        want, _ = reference(q, k, v, workload)
        out = deft_baselines.BASELINES[name](q, k, v, workload)()
        assert out.shape == q.shape and out.dtype == q.dtype
        assert float((out.double() - want).abs().max()) < ATOL


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("workload", [workloads.tiny()[2], workloads.edge_cases()[6]], ids=lambda w: w.name)
def test_flex_eager_equals_the_oracle(workload):
    # torch.compile'd FlexAttention is the GPU's; on CPU its unfused eager version runs the same mask.
    q, k, v = qkv(workload)
    want, _ = reference(q, k, v, workload)
    out = deft_baselines.flex(q, k, v, workload, compile=False)
    assert float((out.double() - want).abs().max()) < ATOL


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
@pytest.mark.parametrize("workload", workloads.tiny() + workloads.edge_cases()[3:6], ids=lambda w: w.name)
def test_triton_tree_equals_the_oracle(workload, dtype, atol):
    pytest.importorskip("solutions.triton_attention")
    q, k, v = qkv(workload, dtype=dtype)
    want, _ = reference(q, k, v, workload)
    out = deft_baselines.triton_tree(q, k, v, workload)
    assert out.shape == q.shape and out.dtype == dtype
    assert float((out.double() - want).abs().max()) < atol


def test_token_tree_times_are_the_dfs_times_of_the_token_tree():
    for workload in CASES:
        offsets = workloads.token_offsets(workload)
        parents = [-1] * workload.tokens  # every token a node: a node's tokens form a chain
        for node in range(workload.nodes):
            first = offsets[node]
            parent = workload.parents[node]
            parents[first] = -1 if parent == -1 else offsets[parent] + workload.lengths[parent] - 1
            for j in range(first + 1, first + workload.lengths[node]):
                parents[j] = j - 1
        start, end = pyspec_ref.dfs_times(parents)
        got_start, got_end = deft_baselines.token_tree_times(workload)
        assert got_start[0].tolist() == start and got_end[0].tolist() == end


def test_sequence_based_rereads_the_shared_prefix():
    workload = workloads.speculative(40, 12, seed=1)
    q, k, v = qkv(workload)
    run = deft_baselines.make_sequence_based(q, k, v, workload)
    per_query_copy = 2 * k[:1].numel() * k.element_size() * max(workload.path_tokens())
    assert run.kv_copy_bytes == workload.queries * per_query_copy  # Q copies of the longest path


def test_bad_inputs_are_named():
    workload = workloads.tiny()[0]
    q, k, v = qkv(workload)
    with pytest.raises(ValueError, match="q has 2 rows, but the workload has Q = 3"):
        deft_baselines.medusa_dense(q[:2], k, v, workload)
    with pytest.raises(ValueError, match="k has 38 tokens"):
        deft_baselines.medusa_dense(q, k[:-1], v[:-1], workload)
    with pytest.raises(ValueError, match=r"q's heads \(8\) must be a multiple of k's heads \(3\)"):
        deft_baselines.sequence_based(q, *qkv(workload, heads_kv=3)[1:], workload)
    with pytest.raises(TypeError, match="k must have dtype float32"):
        deft_baselines.sequence_based(q, k.double(), v.double(), workload)
    with pytest.raises(ValueError, match="q contains NaN"):
        deft_baselines.sequence_based(q * math.nan, k, v, workload)
    with pytest.raises(TypeError, match="workload must be a course.topics.deft.workloads.Workload"):
        deft_baselines.sequence_based(q, k, v, "tree")
    twice = workloads.Workload("two queries at one node", "edge", (-1, 0), (3, 2), (1, 1))
    with pytest.raises(BaselineUnavailable, match="distinct nodes"):
        deft_baselines.triton_tree(*qkv(twice), twice)


# --------------------------------------------------------------------------- the bench

TINY_SHAPE = {"heads_q": 4, "heads_kv": 2, "d": 16, "dtype": "float32"}


def fake_timer(fn):
    fn()
    return 0.5


def test_bench_rows_on_cpu_follow_the_results_schema():
    methods = ["sequence", "medusa_dense"]
    try:
        importlib.import_module("solutions.deft")
        methods += ["deft_flatten", "deft_node", "deft_flatten_paged"]
    except ImportError:
        pass
    twice = workloads.Workload("two queries at one node", "edge", (-1, 0), (3, 2), (1, 1))
    rows = deft_bench.run([workloads.tiny()[2]], methods, timer=fake_timer, device=DEVICE, shape=TINY_SHAPE,
                          copy_bytes=1 << 16, matmul_size=64, block_tokens=16, log=lambda line: None)
    rows += deft_bench.measure_workload(twice, ["triton_tree"], timer=fake_timer, device=DEVICE,
                                        shape=TINY_SHAPE, log=lambda line: None)
    document = deft_bench.dry_run_document(rows)
    assert results.validate(document) is document
    by = {(row["workload"], row["name"]): row for row in rows}
    assert by[("copy 65536 B", "copy")]["gbps"] > 0
    assert by[("matmul 64", "matmul")]["tflops"] > 0
    tiny = workloads.tiny()[2]
    pairs = sum(len(tokens) for tokens in pyspec_ref.deft.visible_tokens(tiny.parents, tiny.lengths,
                                                                          tiny.query_nodes))
    compute = by[(tiny.name, "compute_floor")]
    assert compute["modelled"] and compute["flops"] == 4 * TINY_SHAPE["d"] * TINY_SHAPE["heads_q"] * pairs
    for method in methods:
        row = by[("tiny speculative P=40 t=12", method)]
        assert row["max_abs_err"] < 1e-3 and row["modelled_bytes"] > 0 and "error" not in row
        assert row["N"] == 52 and row["Q"] == 12 and row["family"] == "speculative"
    floor = by[("tiny speculative P=40 t=12", "read_once")]
    assert floor["modelled"] and floor["modelled_kv_bytes"] == 2 * 52 * 2 * 16 * 4
    assert "distinct nodes" in by[("two queries at one node", "triton_tree")]["error"]
    assert len(deft_bench.ok_rows(rows)) == len(rows) - 1


def test_the_bench_takes_the_kernels_block_rule_and_sweeps_its_candidates():
    for workload in (workloads.speculative(4096, 64), workloads.reasoning()):
        tree = (workload.parents, workload.lengths, workload.query_nodes)
        chosen = deft_bench.flatten_block_tokens(workload, sms=132)
        assert chosen == tuning.suggest_block_tokens(*tree, 32, 8, 128, sms=132)
        model = deft_bench.sweep_blocks(workload, sms=132)
        assert chosen in model and chosen == min(model, key=lambda block: (model[block], -block))


def _row(name, workload, ms, **extra):
    return {"name": name, "workload": workload, "family": extra.pop("family", "speculative"),
            "params": extra.pop("params", {"P": 4096, "t": 64}), "median_ms": ms, "max_abs_err": 1e-3,
            **extra}


def test_targets_are_computed_from_rows():
    spec = "speculative P=4096 t=64"
    rows = [
        _row("deft_flatten", spec, 0.010, modelled_kv_bytes=105),
        _row("deft_node", spec, 0.020),
        _row("medusa_dense", spec, 0.104),
        _row("flex", spec, 0.0, error="BackendCompilerFailed: ..."),
        _row("sequence", spec, 0.566),
        _row("read_once", spec, 0.0057, modelled=True, modelled_kv_bytes=100),
        _row("deft_flatten", "reasoning", 0.2, family="reasoning", params={}),
        _row("deft_node", "reasoning", 0.3, family="reasoning", params={}),
        _row("deft_flatten", "speculative P=4096 t=32", 1.0, params={"P": 4096, "t": 32}),
        _row("deft_flatten_sweep", spec, 0.05, block_tokens=64),
        _row("deft_flatten_sweep", spec, 0.008, block_tokens=1024),
    ]
    found = {(t["target"].split(" (")[0], t["workload"]): t for t in deft_bench.targets(rows)}
    speedup = found[("DeFT-Flatten speedup over the best baseline", spec)]
    assert speedup["value"] == pytest.approx(10.4) and speedup["met"]
    assert "medusa_dense" in speedup["target"]  # the failed flex row is no baseline
    swept = found[("DeFT-Flatten speedup over the best baseline, best block of the sweep", spec)]
    assert swept["value"] == pytest.approx(13.0) and "1024 tokens" in swept["target"]
    floor = found[("DeFT-Flatten time / read-once floor", spec)]
    assert floor["value"] == pytest.approx(0.010 / 0.0057) and floor["met"]
    assert found[("DeFT-Flatten KV bytes / the tree's KV", spec)]["met"]
    assert found[("DeFT-Flatten speedup over DeFT-Node", "reasoning")]["value"] == pytest.approx(1.5)
    assert not any(w == "speculative P=4096 t=32" and "best baseline" in t for t, w in found)  # t < 64
    assert "met" in deft_bench.format_targets(deft_bench.targets(rows))
    rows[0]["median_ms"] = 0.1  # now only 1.04x faster than medusa_dense, and 17.5 floors
    slower = {(t["target"].split(" (")[0], t["workload"]): t["met"] for t in deft_bench.targets(rows)}
    assert not slower[("DeFT-Flatten speedup over the best baseline", spec)]
    assert not slower[("DeFT-Flatten time / read-once floor", spec)]


def test_the_bench_refuses_to_time_the_simulator(capsys):
    if course.core.runtime.on_gpu():
        pytest.skip("on a GPU the bench would run")
    assert main(["bench", "deft"]) == 2
    assert "measures a GPU" in capsys.readouterr().out
