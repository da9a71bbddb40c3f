"""solutions/deft.py: phase 1 equals pyspec_ref.deft, bad inputs are named, the checks catch bugs.

The full correctness checks (every edge case, contiguous and paged, GQA, fp16/fp32, twice)
run in tests/test_checks.py and in notebooks 13 and 14.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from types import SimpleNamespace

import pytest
import torch

import course
import pyspec_ref.deft as spec
from course.core import inputs
from course.core.stubs import ExerciseNotImplemented
from course.topics.deft import check as deft_checks
from course.topics.deft import groups as deft_groups
from course.topics.deft import launch as deft_launch
from course.topics.deft import tuning
from course.topics.deft.check import KVTreeCase, case_tensors
from solutions import deft

DEVICE = course.torch_device()


def _i32(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32, device=DEVICE)


def _random_kv_tree(rng: random.Random):
    nodes = rng.randint(1, 14)
    parents = [-1] + [rng.randrange(i) for i in range(1, nodes)]
    lengths = [rng.choice([1, 1, 2, 5, 17, 40]) for _ in range(nodes)]
    queries = [rng.randrange(nodes) for _ in range(rng.randint(1, 80))]  # sometimes > 64 in a block
    return parents, lengths, queries


def _members(prepared, g):
    ptr = prepared.group_ptr.tolist()
    return prepared.member_query[ptr[g] : ptr[g + 1]].tolist()


def _signed(word: int) -> int:
    return word - (1 << 64) if word >= 1 << 63 else word


def _check_query_parts(prepared):
    """Query i's partials are exactly its (group, i) pairs, in increasing group order."""
    ptr, parts = prepared.query_ptr.tolist(), prepared.query_parts.tolist()
    members = prepared.member_query.tolist()
    group_ptr = prepared.group_ptr.tolist()
    group_of = [g for g in range(prepared.num_groups) for _ in range(group_ptr[g], group_ptr[g + 1])]
    for i in range(prepared.num_queries):
        own = parts[ptr[i] : ptr[i + 1]]
        assert all(members[p] == i for p in own)
        assert [group_of[p] for p in own] == sorted({group_of[p] for p, q in enumerate(members) if q == i})


@pytest.mark.parametrize("seed", range(12))
def test_phase_1_equals_pyspec_ref(seed):
    parents, lengths, queries = _random_kv_tree(random.Random(seed))
    node = deft.node_groups(parents, lengths, queries, DEVICE)
    groups = spec.node_groups(parents, lengths, queries)
    assert node.group_node.tolist() == [g[0] for g in groups]
    assert node.group_start.tolist() == [g[1] for g in groups]
    assert node.group_end.tolist() == [g[2] for g in groups]
    assert [_members(node, g) for g in range(node.num_groups)] == [g[3] for g in groups]
    _check_query_parts(node)

    block = random.Random(seed).choice([16, 32, 64])
    flat = deft.flatten_blocks(parents, lengths, queries, block, DEVICE)
    every_block = spec.flatten_blocks(parents, lengths, queries, block)
    blocks = [(b, x) for b, x in enumerate(every_block) if x["queries"]]
    assert flat.group_block.tolist() == [b for b, _ in blocks]
    assert flat.group_start.tolist() == [x["token_start"] for _, x in blocks]
    assert flat.group_end.tolist() == [x["token_end"] for _, x in blocks]
    assert [_members(flat, g) for g in range(flat.num_groups)] == [x["queries"] for _, x in blocks]
    segments = [s for _, x in blocks for s in x["segments"]]
    assert flat.segment_node.tolist() == [s[0] for s in segments]
    assert flat.segment_start.tolist() == [s[1] for s in segments]
    assert flat.segment_end.tolist() == [s[2] for s in segments]
    words = flat.segment_words.tolist()
    for row, s in zip(words, segments, strict=True):
        assert row[: len(s[3])] == [_signed(w) for w in s[3]] and not any(row[len(s[3]):])
    token_segment = flat.token_segment.tolist()
    for n, (_, start, end, _) in enumerate(segments):
        assert token_segment[start:end] == [n] * (end - start)
    assert flat.token_words.tolist() == [words[s] for s in token_segment]
    _check_query_parts(flat)


@pytest.mark.parametrize("seed", range(6))
def test_the_oracle_agrees_with_pyspec_ref(seed):
    from course import oracle

    parents, lengths, queries = _random_kv_tree(random.Random(100 + seed))
    mask = oracle.tree_kv_mask(parents, lengths, queries)
    seen = [torch.nonzero(row)[:, 0].tolist() for row in mask]
    assert seen == spec.visible_tokens(parents, lengths, queries)
    total = sum(lengths)
    q, k, v = (inputs.random_tensor(shape, seed + i, torch.float64) for i, shape in
               enumerate([(len(queries), 4, 3), (total, 2, 3), (total, 2, 3)]))
    out, lse = oracle.tree_kv_attention(q, k, v, parents, lengths, queries)
    want, want_lse = spec.tree_kv_attention(q[:, 3].tolist(), k[:, 1].tolist(), v[:, 1].tolist(),
                                            parents, lengths, queries)
    assert torch.allclose(out[:, 3], torch.tensor(want, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(lse[:, 3], torch.tensor(want_lse, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_a_work_item_is_dense_exactly_when_its_members_see_its_whole_block(seed):
    """The flag that lets a Flatten program skip its mask: never set when a member misses a token."""
    parents, lengths, queries = _random_kv_tree(random.Random(200 + seed))
    seen = [set(tokens) for tokens in spec.visible_tokens(parents, lengths, queries)]
    flat = deft.flatten_blocks(parents, lengths, queries, random.Random(seed).choice([16, 32, 64]), DEVICE)
    per_tile = random.Random(seed).choice([4, 16, 64])
    groups, tiles, dense = (x.tolist() for x in deft_groups.work_list(flat, per_tile))
    assert set(dense) <= {0, 1}
    for g, tile, flag in zip(groups, tiles, dense, strict=True):
        members = _members(flat, g)[tile * per_tile : (tile + 1) * per_tile]
        block = range(flat.group_start[g].item(), flat.group_end[g].item())
        assert flag == all(token in seen[i] for i in members for token in block)
    node = deft.node_groups(parents, lengths, queries, DEVICE)
    assert set(deft_groups.work_list(node, per_tile)[2].tolist()) == {1}  # a node's queries see all of it


def test_block_candidates_are_whole_tiles_equal_cuts_and_powers_of_two():
    found = tuning.block_candidates(4160)
    assert all(block % 64 == 0 for block in found) and found == sorted(set(found))
    assert {576, 640, 4160, 64, 512, 4096} <= set(found)  # 4160 / 8 -> 520 -> 576; / 7 -> 595 -> 640
    assert max(found) == 4160


def test_the_block_model_charges_masked_blocks_and_the_longest_program():
    from course.topics.deft import workloads

    w = workloads.speculative(4096, 64)  # 4096 prefix tokens, then the 64-token tree
    tree, dims = (w.parents, w.lengths, w.query_nodes), (32, 8, 128)
    offsets = spec.token_offsets(w.parents, w.lengths)
    masks = tuning.seen_masks(list(w.parents), list(w.query_nodes))
    loads = tuning.block_loads(offsets, list(w.lengths), masks, 4096)
    assert loads == [(4096, 64, False), (64, 64, True)]  # the prefix is dense, the tree's tips are not
    # One SM: the total work counts, so a block holding prefix and tips (masked throughout) costs more.
    one_sm = [tuning.modelled_launch_time(*tree, *dims, block, 1) for block in (4096, 4160)]
    assert one_sm[0] < one_sm[1]
    # Countless SMs: only the longest program counts, so short blocks win: 128 tokens, as long as the
    # masked 64-token block of the tips counts (each masked token costs MASKED_COST = 2), ties to the longer.
    assert tuning.suggest_block_tokens(*tree, *dims, sms=10**6) == 64 * tuning.MASKED_COST
    with pytest.raises(ValueError, match="sms must be a positive int"):
        tuning.suggest_block_tokens(*tree, *dims, sms=0)


def test_prepared_tensors_are_int32_and_on_the_device():
    flat = deft.flatten_blocks([-1, 0], [3, 2], [1], 16, DEVICE)
    for name in ("group_start", "group_end", "group_ptr", "member_query", "query_ptr", "query_parts",
                 "token_segment", "segment_node"):
        tensor = getattr(flat, name)
        assert tensor.dtype == torch.int32 and tensor.device.type == DEVICE.type, name
    assert flat.segment_words.dtype == torch.int64


# --------------------------------------------------------------------------- bad inputs


def _small(dtype=torch.float32, heads_q=2, heads_kv=1, d=16):
    parents, lengths, queries = [-1, 0, 0], [5, 3, 2], [1, 2]
    prepared = deft.node_groups(parents, lengths, queries, DEVICE)
    q = inputs.random_tensor((2, heads_q, d), 0, dtype, DEVICE)
    k = inputs.random_tensor((10, heads_kv, d), 1, dtype, DEVICE)
    v = inputs.random_tensor((10, heads_kv, d), 2, dtype, DEVICE)
    return q, k, v, prepared


@pytest.mark.parametrize("call, kind, message", [
    (lambda: deft.node_groups([0, 0], [1, 1], [0], "cpu"), ValueError, r"parents\[0\] = 0"),
    (lambda: deft.node_groups([-1, 1], [1, 1], [0], "cpu"), ValueError, r"parents\[1\] = 1"),
    (lambda: deft.node_groups([-1, 0], [1], [0], "cpu"), ValueError, "lengths has 1 entries"),
    (lambda: deft.node_groups([-1, 0], [1, 0], [0], "cpu"), ValueError, r"lengths\[1\] = 0"),
    (lambda: deft.node_groups([-1, 0], [1, 1], [2], "cpu"), ValueError, r"query_nodes\[0\] = 2"),
    (lambda: deft.node_groups([-1, 0], [1, 1], [], "cpu"), ValueError, "query_nodes must not be empty"),
    (lambda: deft.node_groups([-1, 0], [1, 1.5], [0], "cpu"), TypeError, r"lengths\[1\]"),
    (lambda: deft.node_groups("ab", [1, 1], [0], "cpu"), TypeError, "parents must be a list"),
    (lambda: deft.node_groups([-1], [1], [0], "gpu0"), ValueError, "device must be"),
    (lambda: deft.flatten_blocks([-1], [4], [0], 24, "cpu"), ValueError, "positive multiple of 16"),
])
def test_bad_trees_are_named(call, kind, message):
    with pytest.raises(kind, match=message):
        call()


def _replace(index, value):
    def make():
        args = list(_small())
        args[index] = value(args)
        return args
    return make


@pytest.mark.parametrize("make, kind, message", [
    (_replace(0, lambda a: a[0][0]), ValueError, "q must have 3 dimensions"),
    (_replace(0, lambda a: a[0].double()), TypeError, "q must have dtype"),
    (_replace(1, lambda a: a[1].half()), TypeError, "k must have q's dtype"),
    (_replace(0, lambda a: a[0][:1].contiguous()), ValueError, "q has 1 queries"),
    (_replace(1, lambda a: a[1][:9].contiguous()), ValueError, "k and v must have the same shape"),
    (lambda: [*_small(heads_q=3, heads_kv=2)], ValueError, "multiple of k's 2 KV heads"),
    (lambda: [*_small(d=48)], ValueError, "head dimension .* must be one of"),
    (lambda: [*_small(heads_q=128, heads_kv=1)], ValueError, "more than a tile holds"),
    (_replace(0, lambda a: a[0].masked_fill(torch.ones_like(a[0], dtype=torch.bool), float("nan"))),
     ValueError, "q contains NaN"),
    (_replace(3, lambda a: deft.flatten_blocks([-1, 0, 0], [5, 3, 2], [1, 2], 16, DEVICE)), TypeError,
     "prepared must be the result of node_groups"),
])
def test_bad_attention_inputs_are_named(make, kind, message):
    q, k, v, prepared = make()
    with pytest.raises(kind, match=message):
        deft.deft_node_attention(q, k, v, prepared)


def test_contiguous_kv_must_hold_the_tree_and_slots_must_fit():
    q, k, v, prepared = _small()
    cache = torch.cat([k, k])
    with pytest.raises(ValueError, match="tree holds T = 10 tokens"):
        deft.deft_node_attention(q, cache, cache, prepared)
    with pytest.raises(TypeError, match="slots must have dtype int32"):
        deft.deft_node_attention(q, cache, cache, prepared, slots=torch.arange(10, device=DEVICE))
    with pytest.raises(ValueError, match="slots has 9 entries"):
        deft.deft_node_attention(q, cache, cache, prepared, slots=_i32(range(9)))
    with pytest.raises(ValueError, match=r"slots must be rows of the cache, in \[0, 20\)"):
        deft.deft_node_attention(q, cache, cache, prepared, slots=_i32(range(15, 25)))


@pytest.mark.skipif(course.on_gpu(), reason="bfloat16 is refused only in the interpreter")
def test_bfloat16_is_refused_in_the_interpreter():
    q, k, v, prepared = _small(torch.bfloat16)
    with pytest.raises(TypeError, match="q is bfloat16"):
        deft.deft_node_attention(q, k, v, prepared)


def test_reduce_partials_refuses_a_query_without_partials():
    out_part = torch.zeros((2, 1, 16), device=DEVICE)
    lse_part = torch.zeros((2, 1), device=DEVICE)
    parts = _i32([0, 1])
    with pytest.raises(ValueError, match="query 1 has 0 partials"):
        deft.reduce_partials(out_part, lse_part, _i32([0, 2, 2]), parts)
    with pytest.raises(ValueError, match="query_parts must be rows of out_part"):
        deft.reduce_partials(out_part, lse_part, _i32([0, 2]), parts + 1)


def test_a_stub_in_notebook_12s_softmax_step_stops_both_kernels(monkeypatch):
    """Both DeFT kernels call triton_attention.online_softmax_step: its lesson stub is named."""
    lesson = importlib.import_module("lessons.triton_attention")
    monkeypatch.setattr(deft, "online_softmax_step", lesson.online_softmax_step)
    q, k, v, prepared = _small()
    flat = deft.flatten_blocks([-1, 0, 0], [5, 3, 2], [1, 2], 16, DEVICE)
    for call in (lambda: deft.deft_node_attention(q, k, v, prepared),
                 lambda: deft.deft_flatten_attention(q, k, v, flat),
                 lambda: deft_launch.prepare_attention(q, k, v, prepared, impl="solutions"),
                 lambda: deft.group_partials(q, k, v, flat)):
        with pytest.raises(ExerciseNotImplemented, match="exercise triton_attention.online_softmax_step"):
            call()


# --------------------------------------------------------------------------- runner, checks


def test_runner_repeats_the_attention_bit_for_bit():
    case = KVTreeCase("few-shot", (-1, 0, 0, 0), (40, 7, 3, 12), (1, 2, 3, 0), 4, 2, 16, torch.float16,
                      True, 16)
    tensors = case_tensors(case, 5)
    prepared = deft.flatten_blocks(case.parents, case.lengths, case.query_nodes, 16, DEVICE)
    args = (tensors.q, tensors.cache_k, tensors.cache_v, prepared)
    want = deft.deft_flatten_attention(*args, slots=tensors.slots)
    run = deft_launch.prepare_attention(*args, slots=tensors.slots, impl="solutions")
    assert torch.equal(run(), want) and torch.equal(run(), want)


def _first_failure(cases) -> str:
    for _, run in cases:
        result = run()
        if result is not None and not result.passed:
            return result.detail
    return ""


def test_a_flatten_kernel_that_ignores_the_bitmask_is_caught():
    def flatten_blocks(*args):  # every query of a block sees all of it: the mask is lost
        prepared = deft.flatten_blocks(*args)
        return dataclasses.replace(prepared, segment_words=torch.full_like(prepared.segment_words, -1),
                                   token_words=torch.full_like(prepared.token_words, -1), work_lists={})

    module = SimpleNamespace(**{name: getattr(deft, name) for name in dir(deft) if not name.startswith("_")})
    module.flatten_blocks = flatten_blocks
    detail = _first_failure(deft_checks.check_deft_flatten(module, 0))
    assert "partial lse" in detail and "block group" in detail


def test_a_reduction_whose_running_max_starts_at_0_is_caught():
    def reduce_partials(out_part, lse_part, query_ptr, query_parts, *, out_dtype=torch.float32):
        # DeFT's own code starts the running max at 0: exp(lse - 0) underflows for very negative lse.
        outs, lses = [], []
        for i in range(query_ptr.shape[0] - 1):
            parts = query_parts[int(query_ptr[i]) : int(query_ptr[i + 1])].long()
            m = torch.zeros(lse_part.shape[1], device=lse_part.device)
            m = torch.maximum(m, lse_part[parts].max(dim=0).values)
            weights = torch.exp(lse_part[parts] - m)
            total = weights.sum(dim=0)
            outs.append((weights[..., None] * out_part[parts]).sum(dim=0) / total[:, None])
            lses.append(m + torch.log(total))
        return torch.stack(outs).to(out_dtype), torch.stack(lses)

    module = SimpleNamespace(reduce_partials=reduce_partials)
    report = [run() for _, run in deft_checks.check_reduce_partials(module, 0)]
    failed = [r for r in report if r is not None and not r.passed]
    assert len(failed) == 1 and "far below 0" in failed[0].case and "NaN" in failed[0].detail


# --------------------------------------------------------------------------- the shared workloads


def _workload_cases():
    from course.topics.deft import workloads

    return [pytest.param(w, id=w.name) for w in workloads.tiny() + workloads.edge_cases(16)]


@pytest.mark.parametrize("workload", _workload_cases())
def test_every_tiny_workload_and_edge_case_equals_the_oracle(workload):
    from course import oracle
    from course.topics.deft import workloads

    q = workloads.query_tensor(workload, 4, 16, torch.float32, DEVICE, seed=1)
    k, v = workloads.kv_tensors(workload, 2, 16, torch.float32, DEVICE, seed=2)
    want, _ = oracle.tree_kv_attention(q, k, v, workload.parents, workload.lengths, workload.query_nodes)
    tree = (workload.parents, workload.lengths, workload.query_nodes)
    flat = deft.deft_flatten_attention(q, k, v, deft.flatten_blocks(*tree, 16, DEVICE))
    assert (flat.double() - want).abs().max() < 2e-5
    if workload.queries <= 64 or course.on_gpu():  # DeFT-Node's 130 one-token groups take ~15 s here
        node = deft.deft_node_attention(q, k, v, deft.node_groups(*tree, DEVICE))
        assert (node.double() - want).abs().max() < 2e-5
