"""course.topics.deft.workloads: DeFT's workloads are valid KV trees of the documented sizes; the
helpers' tensors."""

import pytest
import torch

import pyspec_ref
from course.topics.deft import workloads
from course.topics.deft.workloads import Workload


def test_benchmark_has_the_issues_workloads_with_documented_sizes():
    found = {w.name: w for w in workloads.benchmark()}
    assert len(found) == 2 * 4 + 3 + 1
    for P in (4096, 16384):
        for t in (32, 64, 128, 256):
            w = found[f"speculative P={P} t={t}"]
            assert (w.nodes, w.tokens, w.queries) == (t + 1, P + t, t)
            assert w.lengths == (P,) + (1,) * t and w.query_nodes == tuple(range(1, t + 1))
            fan_out = [w.parents.count(node) for node in range(w.nodes)]
            assert max(fan_out) <= 10
    for b in (20, 30, 50):
        w = found[f"few-shot b={b} prompt=4096 g=256"]
        assert (w.nodes, w.tokens, w.queries) == (b + 1, 4096 + 256 * b, b)
        assert w.parents == (-1,) + (0,) * b
    (w,) = [w for w in found.values() if w.family == "reasoning"]
    assert 1 + 3 + 10 <= w.nodes <= 1 + 3 * 3 + 10 and w.queries == 10
    assert 1024 + (w.nodes - 1) * 32 <= w.tokens <= 1024 + (w.nodes - 1) * 512
    thoughts = w.lengths[1:]
    assert min(thoughts) >= 32 and max(thoughts) <= 512 and max(thoughts) >= 4 * min(thoughts)  # uneven
    leaves = {n for n in range(w.nodes) if n not in w.parents}
    assert set(w.query_nodes) == leaves  # pruned thoughts are gone: every leaf is being decoded
    depths = pyspec_ref.depths(list(w.parents))
    assert {depths[n] for n in w.query_nodes} == {4}


@pytest.mark.parametrize("workload", workloads.benchmark() + workloads.tiny() + workloads.edge_cases(),
                         ids=lambda w: w.name)
def test_every_workload_is_a_valid_kv_tree(workload):
    assert pyspec_ref.validate_topological(list(workload.parents)) == list(workload.parents)
    assert len(workload.lengths) == workload.nodes and min(workload.lengths) >= 1
    assert all(0 <= node < workload.nodes for node in workload.query_nodes)
    assert workload.family in workloads.FAMILIES and workload.description
    assert workload.summary().startswith(workload.name)


def test_generators_are_deterministic_per_seed():
    assert workloads.speculative(64, 20, seed=1) == workloads.speculative(64, 20, seed=1)
    assert workloads.speculative(64, 20, seed=1).parents != workloads.speculative(64, 20, seed=2).parents
    assert workloads.reasoning(seed=3) == workloads.reasoning(seed=3)
    assert workloads.reasoning(seed=3).lengths != workloads.reasoning(seed=4).lengths


def test_tiny_workloads_fit_the_interpreter():
    tiny = workloads.tiny()
    assert {w.family for w in tiny} == {"few_shot", "reasoning", "speculative"}
    assert all(w.tokens <= 64 for w in tiny)


def test_edge_cases_cover_what_breaks_kernels():
    block = 16
    cases = {w.name.removeprefix("edge: "): w for w in workloads.edge_cases(block)}
    assert cases["single node"].nodes == 1 and cases["single token"].tokens == 1
    assert all(length == 1 for length in cases["one-token nodes, every node queried"].lengths)
    many = cases["more than 128 queries see one block"]
    assert many.queries > 128 and many.lengths[0] < block  # all of them see the first block
    assert cases["one query in a bushy tree"].queries == 1
    crossing = cases["node across a block boundary"]
    offsets = workloads.token_offsets(crossing)
    spans = [(offsets[n], offsets[n] + crossing.lengths[n]) for n in range(crossing.nodes)]
    assert any(s // block != (e - 1) // block for s, e in spans)  # a node crosses a boundary
    assert max(crossing.lengths) > 2 * block  # and one is longer than two blocks
    unordered = cases["queries out of DFS order"]
    offsets = workloads.token_offsets(unordered)
    by_layout = sorted(unordered.query_nodes, key=offsets.__getitem__)
    assert list(unordered.query_nodes) != by_layout
    assert any(node in unordered.parents for node in unordered.query_nodes)  # an internal node


def test_token_offsets_are_the_dfs_preorder_layout():
    for w in workloads.tiny() + workloads.edge_cases():
        offsets = workloads.token_offsets(w)
        start, _ = pyspec_ref.dfs_times(list(w.parents))
        order = sorted(range(w.nodes), key=start.__getitem__)
        running = 0
        for node in order:
            assert offsets[node] == running
            running += w.lengths[node]
        assert running == w.tokens
        assert workloads.query_tokens(w) == [offsets[n] + w.lengths[n] - 1 for n in w.query_nodes]


@pytest.mark.parametrize("make, message", [
    (lambda: Workload("x", "edge", (-1, 0), (3,), (1,)), "lengths has 1 entries"),
    (lambda: Workload("x", "edge", (-1, 0), (3, 0), (1,)), r"lengths\[1\] must be a positive int"),
    (lambda: Workload("x", "edge", (-1, 0), (3, 1), (2,)), r"query_nodes\[0\] = 2"),
    (lambda: Workload("x", "edge", (-1, 0), (3, 1), ()), "query_nodes must hold at least one"),
    (lambda: Workload("x", "edge", (-1, 2, 0), (3, 1, 1), (1,)), r"parents\[1\] = 2"),
    (lambda: Workload("x", "edge", (-1, -1), (3, 1), (1,)), "parents has 2 roots"),
    (lambda: Workload("x", "nope", (-1,), (3,), (0,)), "family must be one of"),
    (lambda: workloads.few_shot(0), "b must be a positive int"),
    (lambda: workloads.speculative(16, 0), "t must be a positive int"),
    (lambda: workloads.reasoning(min_len=10, max_len=5), "max_len must be >= min_len"),
    (lambda: workloads.reasoning(width=2, keep=3), "keep must be at most width"),
    (lambda: workloads.edge_cases(2), "block_tokens must be at least 4"),
])
def test_bad_workloads_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_tensors_have_the_data_models_shapes_and_are_random():
    w = workloads.tiny()[2]
    q = workloads.query_tensor(w, 8, 16, torch.float16, seed=3)
    k, v = workloads.kv_tensors(w, 2, 16, torch.float16, seed=3)
    assert q.shape == (w.queries, 8, 16) and q.dtype == torch.float16
    assert k.shape == v.shape == (w.tokens, 2, 16)
    assert not torch.equal(k, v) and bool((k != 0).all())
    assert torch.equal(k, workloads.kv_tensors(w, 2, 16, torch.float16, seed=3)[0])
    with pytest.raises(ValueError, match="heads_kv must be a positive int"):
        workloads.kv_tensors(w, 0, 16)


def test_paged_scatters_tokens_into_a_larger_cache():
    w = workloads.tiny()[0]
    k, v = workloads.kv_tensors(w, 2, 16, seed=5)
    cache_k, cache_v, slots = workloads.paged(k, v, seed=6)
    assert slots.dtype == torch.int32 and slots.shape == (w.tokens,)
    assert cache_k.shape[0] > w.tokens and len(set(slots.tolist())) == w.tokens
    assert slots.tolist() != list(range(w.tokens))  # really permuted
    assert torch.equal(cache_k[slots.long()], k) and torch.equal(cache_v[slots.long()], v)
    assert workloads.paged(k, v, seed=6, extra=0)[0].shape[0] == w.tokens
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        workloads.paged(k, v[:-1])
    with pytest.raises(ValueError, match="extra must be a non-negative int"):
        workloads.paged(k, v, extra=-1)
