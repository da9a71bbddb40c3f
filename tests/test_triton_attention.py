"""The Triton tree-attention launcher (notebook 12): its errors, its block lists, a tiny run, its bench.

The full check (`course.check("triton_attention.tree_attention_kernel")`) runs in
tests/test_checks.py and in notebook 12; here only what those do not cover.
"""

import importlib
from types import SimpleNamespace

import pytest
import torch

import course
from course import oracle
from course.__main__ import main
from course.checks import run_cases
from course.core import inputs
from course.core.stubs import ExerciseNotImplemented, kernel_stub_name
from course.measure import results
from course.topics.triton_attention import bench as triton_bench
from course.topics.triton_attention import launch
from course.topics.triton_attention import validate as ta_checks
from course.topics.triton_attention.check import check_triton_tree_attention
from solutions import triton_attention as ta

DEVICE = course.torch_device()
TREE = [-1, 0, 0, 1, 1, 2, 0, 6, 7]  # 9 nodes: the last block of 64 is ragged


def _inputs(d=16, dtype=torch.float16, heads=2, parents=TREE):
    n = len(parents)
    q, k, v = (inputs.random_tensor((1, heads, n, d), seed, dtype, DEVICE) for seed in (1, 2, 3))
    start, end = inputs.dfs_times_tensors([parents], DEVICE)
    return q, k, v, start, end


def test_tiny_run_matches_the_oracle_with_its_lse():
    for dtype, tolerance in ((torch.float16, 2e-3), (torch.float32, 2e-5)):
        q, k, v, start, end = _inputs(dtype=dtype)
        out, lse = ta.tree_attention(q, k, v, start, end, return_lse=True)
        want, want_lse = oracle.tree_attention(q, k, v, start, end)
        assert out.dtype == dtype and out.shape == q.shape
        assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
        assert (out.double() - want).abs().max() < tolerance
        assert (lse.double() - want_lse).abs().max() < 1e-4
        assert torch.equal(ta.tree_attention(q, k, v, start, end), out)


@pytest.mark.parametrize("change, error, message", [
    (lambda a: dict(a, q=a["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    (lambda a: dict(a, q=a["q"][0]), ValueError, "q must have 4 dimensions"),
    (lambda a: dict(a, q=a["q"].double()), TypeError, "q must have dtype float16, bfloat16, float32"),
    (lambda a: dict(a, k=a["k"].float()), TypeError, "k must have dtype float16"),
    (lambda a: dict(a, v=a["v"][:, :1].contiguous()), ValueError, "q and v must have the same shape"),
    (lambda a: dict(a, k=a["k"].transpose(2, 3)), ValueError, "k must be contiguous"),
    (lambda a: dict(a, q=torch.full_like(a["q"], float("nan"))), ValueError, "q contains NaN"),
    (lambda a: dict(a, start=a["start"].long()), TypeError, "start must have dtype int32"),
    (lambda a: dict(a, end=a["end"][:, :5]), ValueError, "start and end must have the same shape"),
    (lambda a: dict(a, end=a["end"] + 20), ValueError, "end must hold DFS times"),
    (lambda a: dict(a, start=a["end"], end=a["start"]), ValueError, "start must not exceed end"),
    (lambda a: dict(a, **dict(zip(("start", "end"), inputs.dfs_times_tensors([[-1, 0, 1, 2, 3]], DEVICE),
                                  strict=True))),
     ValueError, r"start and end must have shape \(B, N\) = \(1, 9\)"),
    (lambda a: dict(a, return_lse=1), TypeError, "return_lse must be a bool"),
])
def test_bad_inputs_are_refused_with_the_argument_named(change, error, message):
    q, k, v, start, end = _inputs()
    arguments = change({"q": q, "k": k, "v": v, "start": start, "end": end, "return_lse": False})
    with pytest.raises(error, match=message):
        ta.tree_attention(**arguments)


def test_unsupported_head_dims_and_configs_are_refused():
    q, k, v, start, end = _inputs(d=24)
    with pytest.raises(ValueError, match=r"head dimension \(last axis\) must be one of \(16, 32, 64, 128\)"):
        ta.tree_attention(q, k, v, start, end)
    q, k, v, start, end = _inputs()
    with pytest.raises(ValueError, match="BLOCK_N must be a power of two >= 16"):
        launch.prepare_attention(ta, q, k, v, start, end, config=launch.Config(64, 24, 4, 2))
    with pytest.raises(ValueError, match="config.num_warps must be a power of two"):
        launch.prepare_attention(ta, q, k, v, start, end, config=launch.Config(64, 64, 3, 2))
    with pytest.raises(TypeError, match="config must be a Config"):
        launch.prepare_attention(ta, q, k, v, start, end, config=(64, 64, 4, 2))
    with pytest.raises(ValueError, match="d must be one of"):
        launch.config_for(48, torch.float16)
    q = k = v = inputs.random_tensor((1, ta_checks.MAX_GRID_Y + 1, 1, 16), 0, torch.float16, DEVICE)
    one = torch.zeros((1, 1), dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="q has B \\* H = 65536 .* split the batch"):
        ta.tree_attention(q, k, v, one, one)


@pytest.mark.skipif(not course.SIMULATOR, reason="bf16 runs on a GPU")
def test_bf16_is_refused_in_the_interpreter():
    q, k, v, start, end = _inputs(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="q is bfloat16, but Triton's interpreter"):
        ta.tree_attention(q, k, v, start, end)


def _expected_lists(start, end, block_m, block_n):
    """(count, list) from the dense mask: key block j is listed for query block i iff some pair sees."""
    mask = oracle.dense_tree_mask(start.long().cpu(), end.long().cpu())
    batch, n = start.shape
    tm, tn = -(-n // block_m), -(-n // block_n)
    padded = torch.zeros((batch, tm * block_m, tn * block_n), dtype=torch.bool)
    padded[:, :n, :n] = mask
    blocks = padded.view(batch, tm, block_m, tn, block_n).any(dim=4).any(dim=2)
    return blocks.sum(dim=2).to(torch.int32), blocks


@pytest.mark.parametrize("block_m, block_n", [(16, 16), (32, 16), (16, 32)])
def test_visible_blocks_lists_exactly_the_tile_mask(block_m, block_n):
    cases = inputs.edge_case_trees(16)
    cases = [case for case in cases if case.n == cases[4].n]  # four ragged 35-node trees
    start, end = (t.to(DEVICE) for t in inputs.dfs_times_tensors(cases))
    count, lists = launch.visible_blocks(start, end, block_m, block_n)
    want_count, want_blocks = _expected_lists(start, end, block_m, block_n)
    assert torch.equal(count.cpu(), want_count)
    for b in range(start.shape[0]):
        for i in range(count.shape[1]):
            listed = lists[b, i, : int(count[b, i])].tolist()
            assert listed == torch.nonzero(want_blocks[b, i]).flatten().tolist()  # increasing order
    if block_m == block_n:
        assert torch.equal(want_blocks, oracle.tile_mask(start.cpu(), end.cpu(), block_m))


def test_the_check_catches_a_kernel_that_ignores_the_tree():
    def tree_attention(q, k, v, start, end, *, return_lse=False):  # the causal mask: right for chains
        n = q.shape[2]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        out, lse = oracle.attention_with_lse(q, k, v, causal)
        out, lse = out.to(q.dtype), lse.float()
        return (out, lse) if return_lse else out

    module = SimpleNamespace(tree_attention=tree_attention, config_for=ta.config_for, HEAD_DIMS=ta.HEAD_DIMS)
    report = run_cases("triton_attention.tree_attention_kernel", check_triton_tree_attention(module, 0))
    assert 0 < report.fraction < 1  # N <= 2 and chains pass, real trees fail
    assert "max |got - expected|" in report.text()


def test_runtimes_report_missing_measurements(monkeypatch):
    with pytest.raises(ValueError, match="names must be some of"):
        triton_bench.runtimes(["triton_fp8"])
    if course.on_gpu():
        pytest.skip("on a GPU runtimes() measures")

    def missing(suite, *args, **kwargs):
        raise FileNotFoundError(suite)

    monkeypatch.setattr(results, "load", missing)
    with pytest.raises(results.NotMeasuredYet, match="python -m course bench triton_attention"):
        triton_bench.runtimes(["triton_fp16"])
    document = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-01-01T00:00:00+00:00",
                "rows": [{"name": "triton_fp16", "figure": "paper", "order": "bfs", "median_ms": 0.05,
                          "max_abs_err": 1e-3}]}
    monkeypatch.setattr(results, "load", lambda suite, *args, **kwargs: document)
    rows, where = triton_bench.runtimes(["triton_fp16"])
    assert rows[0]["median_ms"] == 0.05 and "committed measurements from NVIDIA H100" in where
    with pytest.raises(results.NotMeasuredYet, match="no 'flex_fp16' row"):
        triton_bench.runtimes(["flex_fp16"])
    assert main(["bench", "triton_attention"]) == 2  # the benchmark refuses to run in the simulator


def test_a_stub_in_the_softmax_helper_stops_the_launcher_by_name(monkeypatch):
    """The online-softmax step is a @triton.jit helper the kernel calls: a lesson stub there must
    be named before any launch (a GPU would refuse to compile the todo() call, the interpreter
    would bury its message), even when the kernel's own region is written."""
    lesson = importlib.import_module("lessons.triton_attention")
    assert kernel_stub_name(lesson.online_softmax_step) == "triton_attention.online_softmax_step"
    assert kernel_stub_name(ta.online_softmax_step) is None
    monkeypatch.setattr(ta, "online_softmax_step", lesson.online_softmax_step)
    with pytest.raises(ExerciseNotImplemented, match="exercise triton_attention.online_softmax_step"):
        ta.tree_attention(*_inputs())
