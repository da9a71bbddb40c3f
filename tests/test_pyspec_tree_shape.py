"""Sequoia's dynamic program (`pyspec_ref.tree_shape`): optimal against brute force, equal to the
best-first growth when acceptance falls with the rank, and clear errors for bad tables."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pyspec_ref.tree_shape import best_tree, check_acceptance, expected_tokens, greedy_tree, tree_depth


def _all_trees(budget: int, max_depth: int, ranks: int):
    """Every tree of at most `budget` nodes whose nodes' children are a prefix of the ranks, as
    (parents, ranks), by adding one node at a time to every smaller tree."""
    seen, frontier = set(), [((-1,), (-1,))]
    while frontier:
        parents, node_ranks = frontier.pop()
        key = (parents, node_ranks)
        if key in seen:
            continue
        seen.add(key)
        yield list(parents), list(node_ranks)
        if len(parents) == budget:
            continue
        depth = [0] * len(parents)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        for u in range(len(parents)):
            used = [node_ranks[i] for i in range(1, len(parents)) if parents[i] == u]
            k = len(used)
            if depth[u] < max_depth and k < ranks:
                frontier.append((parents + (u,), node_ranks + (k,)))


def _random_table(rng: random.Random, depth: int, ranks: int, monotone: bool) -> list[list[float]]:
    table = []
    for _ in range(depth):
        row = [rng.random() for _ in range(ranks)]
        total = sum(row) / rng.uniform(0.3, 1.0)
        row = [x / total for x in row]
        table.append(sorted(row, reverse=True) if monotone else row)
    return table


@pytest.mark.parametrize("seed", range(6))
def test_the_dynamic_program_is_optimal_against_every_tree(seed):
    rng = random.Random(seed)
    budget, max_depth, ranks = 6, 3, 3
    table = _random_table(rng, max_depth, ranks, monotone=seed % 2 == 0)
    parents, node_ranks, value = best_tree(table, budget, max_depth)
    best = max(expected_tokens(p, k, table) for p, k in _all_trees(budget, max_depth, ranks))
    assert math.isclose(value, best, rel_tol=1e-12)
    assert math.isclose(expected_tokens(parents, node_ranks, table), value, rel_tol=1e-12)
    assert len(parents) <= budget and tree_depth(parents) <= max_depth


@pytest.mark.parametrize("seed", range(6))
def test_best_first_growth_equals_the_program_when_acceptance_falls_with_rank(seed):
    rng = random.Random(100 + seed)
    table = _random_table(rng, 6, 4, monotone=True)
    for budget in (1, 2, 5, 12, 30):
        _, _, dp = best_tree(table, budget, 6)
        parents, ranks, greedy = greedy_tree(table, budget, 6)
        assert math.isclose(dp, greedy, rel_tol=1e-12), budget
        assert math.isclose(expected_tokens(parents, ranks, table), greedy, rel_tol=1e-12)


def test_a_chain_is_the_tree_when_only_the_first_child_is_ever_accepted():
    parents, ranks, value = best_tree([0.9, 0.0], 5, 8)
    assert parents == [-1, 0, 1, 2, 3] and ranks == [-1, 0, 0, 0, 0]
    assert math.isclose(value, sum(0.9 ** i for i in range(5)))


def test_depth_limit_and_per_level_rows_are_honoured():
    table = [[0.5, 0.4], [0.9, 0.05], [0.1, 0.1]]
    parents, ranks, _ = best_tree(table, 8, 3)
    assert tree_depth(parents) <= 3
    levels = [0] * len(parents)
    for i in range(1, len(parents)):
        levels[i] = levels[parents[i]] + 1
    # Level 0 splits two ways (0.5 and 0.4 both pay); level 1 prefers its first child.
    assert sorted(k for i, k in enumerate(ranks) if i and levels[i] == 1) == [0, 1]


@pytest.mark.parametrize("table, message", [
    ([0.5, float("nan")], r"acceptance\[0\]\[1\]"),
    ([0.5, -0.1], r"acceptance\[0\]\[1\] = -0.1"),
    ([1.2], r"acceptance\[0\]\[0\] = 1.2"),
    ([0.7, 0.6], "sums to"),
    ([[0.5], [0.5]], "expected 1 or at least depth = 3"),
    ([[0.5, 0.1], [0.5], [0.2, 0.1]], r"acceptance\[1\] has 1 ranks"),
    ([], "must not be empty"),
])
def test_bad_acceptance_tables_name_the_entry(table, message):
    with pytest.raises(ValueError, match=message):
        check_acceptance(table, 3)


@pytest.mark.parametrize("budget, depth, name", [(0, 3, "budget"), (4, 0, "max_depth"), (2.5, 3, "budget")])
def test_bad_budget_or_depth_is_named(budget, depth, name):
    with pytest.raises((ValueError, TypeError), match=name):
        best_tree([0.5], budget, depth)


def test_every_tree_of_the_enumeration_is_valid():
    count = 0
    for parents, _ranks in itertools.islice(_all_trees(5, 2, 2), 200):
        count += 1
        for i in range(1, len(parents)):
            assert 0 <= parents[i] < i
    assert count > 10
