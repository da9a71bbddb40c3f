"""Property tests of pyspec_ref.trees against independent brute-force implementations.

The oracles below (ancestor walks, recursive DFS, bit-by-bit packing) are
written here from the definitions, not borrowed from pyspec_ref, so that a
shared mistake cannot hide.
"""

from __future__ import annotations

import sys
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspec_ref import trees as T

# --------------------------------------------------------------------------- strategies


@st.composite
def random_trees(draw, min_nodes: int = 1, max_nodes: int = 40) -> list[int]:
    """A random tree with arbitrary labels.

    Node i > 0 of a topological tree picks its parent among the `reach`
    previous nodes (reach 1 = a chain, large reach = bushy), then the ids are
    shuffled by a random permutation so that the root need not be node 0.
    """
    n = draw(st.integers(min_nodes, max_nodes))
    reach = draw(st.integers(1, max(1, n)))
    topo = [-1] + [draw(st.integers(max(0, i - reach), i - 1)) for i in range(1, n)]
    perm = draw(st.permutations(range(n)))  # old id i -> new id perm[i]
    parents = [0] * n
    for i, p in enumerate(topo):
        parents[perm[i]] = -1 if p == -1 else perm[p]
    return parents


# --------------------------------------------------------------------------- oracles


def brute_ancestors(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] != -1:
        path.append(parents[path[-1]])
    return path


def brute_mask(parents: list[int]) -> list[list[bool]]:
    n = len(parents)
    return [[k in brute_ancestors(parents, q) for k in range(n)] for q in range(n)]


def brute_dfs_times(parents: list[int]) -> tuple[list[int], list[int]]:
    """Recursive DFS straight from the definition (fine for the small trees here)."""
    n = len(parents)
    kids = {v: sorted(i for i in range(n) if parents[i] == v) for v in range(n)}
    start, end = [0] * n, [0] * n
    clock = [0]

    def visit(v: int) -> None:
        start[v] = clock[0]
        clock[0] += 1
        for c in kids[v]:
            visit(c)
        end[v] = clock[0] - 1

    visit(parents.index(-1))
    return start, end


def brute_bitmask(mask: list[list[bool]], word_bits: int) -> list[list[int]]:
    m = len(mask[0])
    n_words = (m + word_bits - 1) // word_bits
    out = []
    for row in mask:
        words = []
        for w in range(n_words):
            word = 0
            for b in range(word_bits):
                key = w * word_bits + b
                if key < m and row[key]:
                    word += 2**b
            words.append(word)
        out.append(words)
    return out


# --------------------------------------------------------------------------- properties

FAST = settings(max_examples=60, deadline=None)


@FAST
@given(random_trees())
def test_validate_parents_accepts_random_trees_and_copies(parents):
    got = T.validate_parents(parents)
    assert got == parents and got is not parents


@FAST
@given(random_trees())
def test_structure_matches_brute_force(parents):
    n = len(parents)
    assert T.root(parents) == parents.index(-1)
    assert T.children(parents) == [[i for i in range(n) if parents[i] == v] for v in range(n)]
    assert T.depths(parents) == [len(brute_ancestors(parents, v)) - 1 for v in range(n)]
    for v in range(n):
        assert T.ancestors(parents, v) == brute_ancestors(parents, v)


@FAST
@given(random_trees())
def test_dfs_times_match_recursive_definition(parents):
    start, end = T.dfs_times(parents)
    assert (start, end) == brute_dfs_times(parents)
    assert sorted(start) == list(range(len(parents)))
    assert T.validate_times(start, end) == (start, end)


@FAST
@given(random_trees())
def test_interval_test_is_ancestry(parents):
    start, end = T.dfs_times(parents)
    expected = brute_mask(parents)
    assert T.tree_mask(parents) == expected
    assert T.tree_mask_from_times(start, end) == expected
    n = len(parents)
    for q in range(min(n, 6)):  # `sees` validates per call: spot-check a few rows
        for k in range(n):
            assert T.sees(start, end, q, k) == expected[q][k]


@FAST
@given(random_trees())
def test_parents_from_times_inverts_dfs_times(parents):
    assert T.parents_from_times(*T.dfs_times(parents)) == parents


@FAST
@given(random_trees(), st.randoms(use_true_random=False))
def test_times_of_any_sibling_order_are_accepted(parents, rnd):
    """A preorder with siblings in any order is a valid encoding of the same tree."""
    n = len(parents)
    kids = [[i for i in range(n) if parents[i] == v] for v in range(n)]
    for ks in kids:
        rnd.shuffle(ks)
    start, end, clock = [0] * n, [0] * n, 0
    stack = [(parents.index(-1), False)]
    while stack:
        v, done = stack.pop()
        if done:
            end[v] = clock - 1
            continue
        start[v] = clock
        clock += 1
        stack.append((v, True))
        stack.extend((c, False) for c in reversed(kids[v]))
    assert T.validate_times(start, end) == (start, end)
    assert T.parents_from_times(start, end) == parents
    assert T.tree_mask_from_times(start, end) == brute_mask(parents)


@FAST
@given(random_trees())
def test_relabel_by_dfs_order_numbers_nodes_in_dfs_order(parents):
    order = T.dfs_order(parents)
    new = T.relabel(parents, order)
    n = len(parents)
    start, end = T.dfs_times(new)
    assert start == list(range(n))
    assert T.validate_topological(new) == new
    # same tree: new node i is old node order[i]
    for i in range(n):
        assert (new[i] == -1) == (parents[order[i]] == -1)
        if new[i] != -1:
            assert order[new[i]] == parents[order[i]]
    # dfs_order lists nodes by start time
    old_start, _ = T.dfs_times(parents)
    assert [old_start[v] for v in order] == list(range(n))


@FAST
@given(random_trees())
def test_bfs_order_is_level_order(parents):
    n = len(parents)
    kids = [[i for i in range(n) if parents[i] == v] for v in range(n)]
    expected, queue = [], deque([parents.index(-1)])
    while queue:
        v = queue.popleft()
        expected.append(v)
        queue.extend(kids[v])
    order = T.bfs_order(parents)
    assert order == expected
    new = T.relabel(parents, order)
    assert T.validate_topological(new) == new
    assert T.depths(new) == sorted(T.depths(new))


@FAST
@given(random_trees(), st.sampled_from([1, 3, 8, 16, 32, 64]))
def test_tree_bitmask_matches_bit_by_bit(parents, word_bits):
    mask = brute_mask(parents)
    words = T.tree_bitmask(parents, word_bits)
    assert words == brute_bitmask(mask, word_bits)
    assert words == T.bitmask_from_mask(mask, word_bits)
    assert T.mask_from_bitmask(words, len(parents), word_bits) == mask


@settings(max_examples=10, deadline=None)
@given(random_trees(min_nodes=65, max_nodes=150), st.sampled_from([8, 32, 64]))
def test_bitmask_of_trees_wider_than_one_word(parents, word_bits):
    mask = brute_mask(parents)
    words = T.tree_bitmask(parents, word_bits)
    assert len(words[0]) == -(-len(parents) // word_bits) >= 2
    assert words == brute_bitmask(mask, word_bits)
    assert T.mask_from_bitmask(words, len(parents), word_bits) == mask


@FAST
@given(
    st.integers(1, 12).flatmap(
        lambda m: st.lists(st.lists(st.booleans(), min_size=m, max_size=m), min_size=1, max_size=5)
    ),
    st.integers(1, 70),
)
def test_bitmask_roundtrip_for_rectangular_masks(mask, word_bits):
    words = T.bitmask_from_mask(mask, word_bits)
    assert words == brute_bitmask(mask, word_bits)
    assert all(0 <= w < 2**word_bits for row in words for w in row)
    assert T.mask_from_bitmask(words, len(mask[0]), word_bits) == mask


def test_bitmask_bit_order_example():
    # keys 0 and 2 visible -> bits 0 and 2 -> 0b101 = 5; key 9 -> word 1, bit 1 with 8-bit words
    mask = [[True, False, True] + [False] * 6 + [True]]
    assert T.bitmask_from_mask(mask, 8) == [[5, 2]]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 40])
def test_chain_mask_is_causal_mask(n):
    chain = T.chain_parents(n)
    assert chain == [-1] + list(range(n - 1))
    assert T.causal_mask(n) == [[k <= q for k in range(n)] for q in range(n)]
    assert T.tree_mask(chain) == T.causal_mask(n)
    assert T.tree_mask_from_times(*T.dfs_times(chain)) == T.causal_mask(n)


def test_memory_arithmetic_of_section_6_1():
    # FlashSpecInfer §6.1: N = 4096 tree tokens, batch 128
    assert T.dense_mask_bits(4096, 128) == 2**31  # 2 Gbit
    assert T.interval_mask_bits(4096, 128) == 2**25  # 32 Mbit, 32-bit times
    assert T.interval_mask_bits(4096, 128, bits_per_time=16) == 2**24
    assert T.dense_mask_bits(3, 2) == 18


def test_worked_example_with_root_not_node_0():
    parents = [2, 0, -1, 0, 1]  # 2 -> 0 -> {1 -> 4, 3}
    assert T.dfs_order(parents) == [2, 0, 1, 4, 3]
    assert T.dfs_times(parents) == ([1, 2, 0, 4, 3], [4, 3, 4, 4, 3])
    assert T.ancestors(parents, 4) == [4, 1, 0, 2]


def test_100000_node_chain_does_not_recurse():
    n = 100_000
    assert n > sys.getrecursionlimit()
    chain = T.chain_parents(n)
    start, end = T.dfs_times(chain)
    assert start == list(range(n)) and end == [n - 1] * n
    assert T.validate_times(start, end) == (start, end)
    assert T.parents_from_times(start, end) == chain
    assert T.depths(chain) == list(range(n))
    assert T.dfs_order(chain) == list(range(n)) == T.bfs_order(chain)
    assert T.validate_topological(chain) == chain
    # reversed labels: the root is the last node, every parent comes after its child
    rev = [-1 if i == n - 1 else i + 1 for i in range(n)]
    assert T.validate_parents(rev) == rev
    assert T.dfs_order(rev) == list(range(n - 1, -1, -1))
    assert len(T.ancestors(rev, 0)) == n


@FAST
@given(random_trees(), st.integers(1, 5))
def test_tile_mask_ors_the_tree_mask_over_tiles(parents, tile):
    start, end = T.dfs_times(parents)
    mask = brute_mask(parents)
    n = len(parents)
    tiles = (n + tile - 1) // tile
    want = [[any(mask[q][k] for q in range(i * tile, min(n, i * tile + tile))
                 for k in range(j * tile, min(n, j * tile + tile))) for j in range(tiles)]
            for i in range(tiles)]
    assert T.tile_mask(start, end, tile) == want


def test_tile_mask_examples_and_bad_tile():
    start, end = T.dfs_times([-1, 0, 0, 1, 1, 2, 2])  # nodes 4, 5 see 0,1,4 and 0,2,5
    assert T.tile_mask(start, end, 2) == [[True, False, False, False], [True, True, False, False],
                                         [True, True, True, False], [True, True, False, True]]
    assert T.tile_mask(start, end, 1) == T.tree_mask_from_times(start, end)
    assert T.tile_mask(start, end, 100) == [[True]]
    with pytest.raises(ValueError, match="tile"):
        T.tile_mask(start, end, 0)
