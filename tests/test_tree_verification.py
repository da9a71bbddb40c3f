"""Notebook 16: token-tree verification kernels (sampled and greedy), their checks and bench rows."""

from __future__ import annotations

import random

import pytest
import torch

from course.checks import run_cases
from course.core import inputs, runtime
from course.measure import timing
from course.oracle import sampling as sampling_oracle
from course.registry import EXERCISES
from course.topics.verification import bench as verification_bench
from course.topics.verification import check as checks
from course.topics.verification import launch
from pyspec_ref import sampling as spec
from solutions import tree_verification as tv

DEVICE = runtime.torch_device()


def test_exercises_are_registered():
    for exercise in ("tree_verification.tree_walk_kernel", "tree_verification.greedy_walk_kernel"):
        assert EXERCISES[exercise].notebook == "16_tree_verification"


def test_the_solution_passes_both_checks():
    for cases in (checks.check_tree_sampling(tv, 1234), checks.check_greedy_verification(tv, 1234)):
        report = run_cases("tree_verification", cases)
        assert report.passed, report.text()


def _random_case(seed: int, n: int = 8, vocabulary: int = 11, batch: int = 3) -> checks.SamplingCase:
    rng = random.Random(seed)
    trees = [inputs.random_tree(n, rng, max_children=3) for _ in range(batch)]
    return checks.sampling_case(f"random {seed}", trees, vocabulary, seed)


@pytest.mark.parametrize("replacement", [False, True], ids=["without", "with"])
@pytest.mark.parametrize("seed", range(3))
def test_the_references_agree_with_pyspec(seed, replacement):
    rng = random.Random(seed)
    trees = [inputs.random_tree(8, rng, max_children=3) for _ in range(3)]
    case = checks.sampling_case(f"random {seed}", trees, 11, seed, replacement=replacement)
    path, token = sampling_oracle.tree_speculative_sampling(inputs.batch_of_trees(case.parents), case.tokens,
                                                            case.q, case.p, case.accept, case.sample,
                                                            replacement=replacement)
    for b in range(len(case.parents)):
        args = case.tree_args(b)
        want = spec.tree_speculative_sampling(*args, replacement=replacement)
        walk = checks.reference_walk(*args, replacement=replacement)
        assert (walk.path, walk.token) == want
        assert checks.closed_form_walk(*args, replacement) == want  # the kernel's closed form, in Python
        assert ([x for x in path[b].tolist() if x >= 0], int(token[b])) == want


def test_siblings_are_drawn_without_replacement_unless_asked():
    parents = inputs.batch_of_trees([inputs.star(6)] * 20)
    q, _ = checks.draft_and_target(20, 6, 7, seed=1)
    without = checks.draft_tokens(parents, q, seed=2)
    assert all(len(set(row[1:])) == 5 for row in without.tolist())
    repeated = checks.draft_tokens(parents, checks.peaked_wrong_draft(q, q), seed=2, replacement=True)
    assert any(len(set(row[1:])) < 5 for row in repeated.tolist())


def test_differences_are_excused_only_by_a_near_decision():
    # One node, dyadic p, u = 0.5 - 2^-54: u * total lies 2^-54 below the boundary after token 14.
    vocabulary = 37
    mass = torch.zeros(vocabulary, dtype=torch.float64)
    mass[list(range(0, 32, 2))] = 1 / 16
    p = mass.to(torch.float32).reshape(1, 1, vocabulary)
    sample = torch.tensor([[0.5 - 2.0 ** -54]], dtype=torch.float64)
    case = checks.SamplingCase("near", [[-1]], torch.zeros((1, 1), dtype=torch.int32), p.clone(), p,
                               torch.zeros((1, 1)), sample.float())
    case.sample = sample  # float64 uniforms: the specification sees exactly this u
    assert spec.tree_speculative_sampling([-1], [0], p[0].tolist(), p[0].tolist(), [0.0], [sample.item()]) \
        == ([0], 14)
    path = torch.zeros((1, 1), dtype=torch.int32)
    same = checks.compare_sampling(case, path, torch.tensor([14], dtype=torch.int32))
    assert (same.exact, same.within_rounding, same.wrong) == (1, [], [])
    beside = checks.compare_sampling(case, path, torch.tensor([16], dtype=torch.int32))
    assert beside.exact == 0 and len(beside.within_rounding) == 1 and not beside.problem()
    far = checks.compare_sampling(case, path, torch.tensor([20], dtype=torch.int32))
    assert far.wrong and "next token 20" in far.problem()
    case.exact = True  # a case whose sums are exact allows no excuse
    assert checks.compare_sampling(case, path, torch.tensor([16], dtype=torch.int32)).wrong


def test_float64_uniforms_and_the_kernel_agree_exactly_on_the_boundary():
    vocabulary = 37
    mass = torch.zeros(vocabulary, dtype=torch.float64)
    mass[list(range(0, 32, 2))] = 1 / 16
    p = mass.to(torch.float32).reshape(1, 1, vocabulary).expand(2, 1, vocabulary).contiguous()
    sample = torch.tensor([[0.5 - 2.0 ** -54], [0.5]], dtype=torch.float64)
    path, token = tv.tree_speculative_sampling(torch.tensor([[-1], [-1]], dtype=torch.int32, device=DEVICE),
                                               torch.zeros((2, 1), dtype=torch.int32, device=DEVICE),
                                               p.to(DEVICE), p.to(DEVICE),
                                               torch.zeros((2, 1), device=DEVICE), sample.to(DEVICE))
    assert token.tolist() == [14, 16] and path.tolist() == [[0], [0]]


def test_outputs_as_production_samplers_report_them():
    tokens = torch.tensor([[7, 3, 4, 5], [7, 3, 4, 5]], dtype=torch.int32)
    path = torch.tensor([[0, 2, 3, -1], [0, -1, -1, -1]], dtype=torch.int32)
    next_token = torch.tensor([9, 8], dtype=torch.int32)
    assert launch.accepted_counts(path).tolist() == [2, 0]
    assert launch.emitted_tokens(tokens, path, next_token).tolist() == [[4, 5, 9, -1], [8, -1, -1, -1]]


def _good_inputs(n: int = 4, vocabulary: int = 6, batch: int = 2) -> dict:
    case = checks.sampling_case("good", [inputs.star(n)] * batch, vocabulary, 1)
    return dict(tree=inputs.batch_of_trees(case.parents, DEVICE), tokens=case.tokens.to(DEVICE),
                q=case.q.to(DEVICE), p=case.p.to(DEVICE), accept_uniforms=case.accept.to(DEVICE),
                sample_uniforms=case.sample.to(DEVICE))


def _change(name, index, value):
    def apply(arguments):
        tensor = arguments[name].clone()
        tensor[index] = value
        arguments[name] = tensor
    return apply


@pytest.mark.parametrize("change, message", [
    (_change("tree", (1, 0), 0), r"parents\[1, 0\] = 0: node 0 must be the root"),
    (_change("tree", (0, 2), 2), r"parents\[0, 2\] = 2: every node's parent must be a node numbered before"),
    (_change("p", (1, 2, 3), float("nan")), "p contains NaN"),
    (_change("q", (0, 1, 0), -0.25), r"q\[0, 1, 0\] = -0.25 is negative"),
    (_change("p", (0, 3, 0), 3.0), r"p\[0, 3\] sums to .*not 1"),
    (_change("tokens", (1, 2), 6), r"tokens\[1, 2\] = 6 is not a token id in \[0, 6\)"),
    (_change("tokens", (0, 1), -1), r"tokens\[0, 1\] = -1 is not a token id"),
    (_change("accept_uniforms", (0, 3), 1.0), r"accept_uniforms\[0, 3\] = 1.0 must lie in \[0, 1\)"),
    (_change("sample_uniforms", (1, 0), -0.5), r"sample_uniforms\[1, 0\] = -0.5 must lie in \[0, 1\)"),
    (lambda a: a.update(q=a["q"][:, :3].contiguous()), "p and q must have the same shape"),
    (lambda a: a.update(p=a["p"][:1].contiguous()),
     r"p must have shape \(B, N, V\) with \(B, N\) = \(2, 4\)"),
    (lambda a: a.update(tokens=a["tokens"][:, :3].contiguous()),
     r"tokens must have shape \(B, N\) = \(2, 4\)"),
    (lambda a: a.update(sample_uniforms=a["sample_uniforms"][:1].contiguous()),
     r"sample_uniforms must have shape \(B, N\) = \(2, 4\)"),
    (lambda a: a.update(p=a["p"].double()), "p must have dtype float32"),
    (lambda a: a.update(tokens=a["tokens"].long()), "tokens must have dtype int32"),
    (lambda a: a.update(tree=(a["tree"], a["tree"], a["tree"])), "tree must be a .* or a .start, end. pair"),
    (lambda a: a.update(tree=(torch.tensor([[0, 0, 2, 3]] * 2, dtype=torch.int32, device=DEVICE),
                              torch.tensor([[3, 1, 2, 3]] * 2, dtype=torch.int32, device=DEVICE))),
     "start/end are not the DFS times of a tree"),
    (lambda a: a.update(tree=torch.full((1, launch.MAX_NODES + 1), 0, dtype=torch.int32, device=DEVICE)),
     f"at most {launch.MAX_NODES} nodes"),
    (_change("tokens", (1, 3), -7), r"tokens\[1, 3\] = -7 is not a token id"),
    (lambda a: a["tokens"].__setitem__((1, 3), int(a["tokens"][1, 1])),
     r"tokens\[1, 1\] = tokens\[1, 3\] = \d+: siblings \(children of node 0\) drawn without replacement"),
    (_change("q", (0, 2, 4), float("nan")), "q contains NaN"),
    (lambda a: a.update(accept_uniforms=a["accept_uniforms"].to(torch.int32)),
     "accept_uniforms must have dtype float32, float64"),
    (lambda a: a.update(q=a["q"].reshape(2, 4, 2, 3)), "q must have 3 dimensions"),
    (lambda a: a.update(replacement=1), "replacement must be True or False, got 1"),
])
def test_bad_sampling_input_is_named(change, message):
    arguments = _good_inputs()
    change(arguments)
    before = {name: t.clone() for name, t in arguments.items() if isinstance(t, torch.Tensor)}
    with pytest.raises((ValueError, TypeError), match=message):
        tv.tree_speculative_sampling(**arguments)
    for name, tensor in before.items():  # the caller's tensors are unchanged
        torch.testing.assert_close(arguments[name], tensor, rtol=0, atol=0, equal_nan=True)


def test_duplicate_siblings_are_fine_with_replacement():
    arguments = _good_inputs()
    arguments["tokens"][:, 2:] = arguments["tokens"][:, 1:2]
    path, token = tv.tree_speculative_sampling(**arguments, replacement=True)
    case = checks.SamplingCase("same tokens", [inputs.star(4)] * 2, arguments["tokens"].cpu(),
                               arguments["q"].cpu(), arguments["p"].cpu(), arguments["accept_uniforms"].cpu(),
                               arguments["sample_uniforms"].cpu(), replacement=True)
    assert not checks.compare_sampling(case, path, token).problem()


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(target=a["target"][:, :3].contiguous()),
     r"target must have shape \(B, N, V\) with \(B, N\) = \(2, 4\)"),
    (lambda a: a.update(target=torch.full((2, 4), -1, dtype=torch.int32, device=DEVICE)), "token ids >= 0"),
    (_change("tokens", (0, 2), 6), r"tokens\[0, 2\] = 6 is not a token id in \[0, 6\)"),
    (_change("target", (0, 1, 1), float("inf")), "target contains NaN or infinite values"),
    (lambda a: a.update(target=[[0.5]]), "target must be a torch.Tensor"),
])
def test_bad_greedy_input_is_named(change, message):
    good = _good_inputs()
    arguments = dict(tree=good["tree"], tokens=good["tokens"], target=good["p"])
    change(arguments)
    with pytest.raises((ValueError, TypeError), match=message):
        tv.greedy_tree_verification(**arguments)


def test_trees_as_dfs_times_give_the_same_parents():
    rng = random.Random(5)
    trees = [inputs.random_tree(40, rng, order=order) for order in ("bfs", "dfs", "bfs")]
    start, end = inputs.dfs_times_tensors(trees, DEVICE)
    assert launch.parents_from_times(start, end).cpu().tolist() == trees


# Samples of the distribution test: the interpreter runs a walk in ~0.1 s; a GPU takes 40000 in
# well under a second, enough to catch a 1% shift of the first token's distribution.
SAMPLES = runtime.pick(sim=120, gpu=40000)


def test_emitted_tokens_follow_the_target_distribution():
    result = checks.distribution_test(tv, SAMPLES, seed=3)
    first, second = result.p_values()
    assert first > checks.SIGNIFICANCE and second > checks.SIGNIFICANCE, (result, first, second)
    assert sum(result.second_counts) > SAMPLES // 4  # the second position is exercised too
    if runtime.on_gpu():
        assert result.smallest_detected_shift() is not None
        assert result.smallest_detected_shift() <= 0.01


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.2])
def test_a_peaked_wrong_draft_stays_exact_and_accepts_more_without_replacement(temperature):
    """A draft that puts 0.9 on the token the target likes least: drawn with replacement, most
    siblings repeat that token and are rejected for certain; without, the second sibling is
    another token. Both walks (the kernel, equal to pyspec_ref on every tree) follow the target.
    (tests/test_pyspec_sampling.py computes the acceptance of both rules exactly.)"""
    walks = runtime.pick(sim=60, gpu=20000)
    results = {}
    for replacement in (False, True):
        case = checks.distribution_inputs(walks, seed=4, vocabulary=6, temperature=temperature, peaked=0.9,
                                          replacement=replacement)
        got = case.run(tv, DEVICE)
        assert not checks.compare_sampling(case, *got).problem()
        results[replacement] = checks.tally(case, *got)
        first, second = results[replacement].p_values()
        assert first > checks.SIGNIFICANCE and second > checks.SIGNIFICANCE, results[replacement]
    assert results[False].mean_accepted > results[True].mean_accepted, results


def test_the_bench_times_only_on_a_gpu():
    if runtime.SIMULATOR:
        with pytest.raises(timing.NoTimingInSimulator):
            verification_bench.verification_rows()
        rows = verification_bench.runtimes()
        assert rows is None or all(row["name"] in verification_bench.ROW_NAMES for row in rows)
    rows = [{"name": f"{kind}_{method}", "B": 1, "median_ms": ms}
            for kind, ms in (("tree", 0.03), ("chain", 0.02)) for method in ("sampling", "greedy")]
    assert [t["met"] for t in verification_bench.targets(rows)] == [True, True]
    rows[0]["median_ms"] = 0.05
    assert not verification_bench.targets(rows)[0]["met"]
