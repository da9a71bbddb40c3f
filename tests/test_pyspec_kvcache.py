"""pyspec_ref.kvcache: EMS-SD's unpadded batch bookkeeping and SwiftSpec's tree-aware KV cache."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspec_ref import attention_with_lse
from pyspec_ref import kvcache as K
from pyspec_ref.trees import ancestors, dfs_times, relabel, tree_mask

FAST = settings(max_examples=40, deadline=None)


def _rand(rnd: random.Random, rows: int, cols: int = 2) -> list[list[float]]:
    return [[rnd.uniform(-2.0, 2.0) for _ in range(cols)] for _ in range(rows)]


def _close(a, b) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12) for x, y in zip(a, b, strict=True))


def _rows_close(a, b) -> bool:
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))


@st.composite
def trees_and_paths(draw, max_nodes: int = 10):
    """(parents, verified_path): a tree with arbitrary labels and a random root path of it."""
    n = draw(st.integers(1, max_nodes))
    topo = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    order = draw(st.permutations(range(n)))
    parents = relabel(topo, order)
    kids = [[c for c in range(n) if parents[c] == v] for v in range(n)]
    path = [parents.index(-1)]
    while kids[path[-1]] and draw(st.booleans()):
        path.append(draw(st.sampled_from(kids[path[-1]])))
    return parents, path


# --------------------------------------------------------------------------- EMS-SD: inputs


@FAST
@given(st.lists(st.lists(st.integers(0, 50), max_size=5), min_size=1, max_size=6))
def test_restore_indices_inverts_concatenation(samples):
    flat, counts, offsets = K.concatenate_inputs(samples)
    assert counts == [len(s) for s in samples]
    assert offsets[0] == 0 and offsets[-1] == len(flat) and len(offsets) == len(samples) + 1
    restored = K.restore_indices(counts)
    assert len(restored) == len(flat)
    for t, (b, i) in enumerate(restored):
        assert samples[b][i] == flat[t]
        assert K.restore_index_scan(counts, t) == (b, i)  # the paper's linear scan agrees
    assert [(b, i) for b, s in enumerate(samples) for i in range(len(s))] == restored


def test_restore_indices_skips_empty_samples():
    assert K.restore_indices([0, 2, 0, 0, 1]) == [(1, 0), (1, 1), (4, 0)]
    assert K.restore_indices([0, 0]) == []


# --------------------------------------------------------------------------- EMS-SD: layouts


def test_padded_vs_unpadded_arithmetic_worked_example():
    # three samples feed 1, 3, 2 tokens onto caches of 10, 8, 9 tokens
    padded = K.padded_layout([1, 3, 2], [10, 8, 9])
    assert padded["input_width"] == 3 and padded["kv_width"] == 10
    assert (padded["input_slots"], padded["real_inputs"], padded["wasted_input_slots"]) == (9, 6, 3)
    # each sample holds 10 + 3 slots; real tokens: 27 cached + 6 new
    assert (padded["kv_slots"], padded["real_kv"], padded["wasted_kv_slots"]) == (39, 33, 6)
    # padded: 3 samples * (3 * 10 + 1 + 2 + 3); real: (10 + 1) + (3 * 8 + 6) + (2 * 9 + 3)
    assert (padded["attention_pairs"], padded["real_attention_pairs"]) == (108, 62)
    assert padded["wasted_attention_pairs"] == 46
    unpadded = K.unpadded_layout([1, 3, 2], [10, 8, 9])
    assert unpadded["input_slots"] == 6 and unpadded["kv_slots"] == 33 and unpadded["attention_pairs"] == 62
    assert all(unpadded[k] == 0 for k in unpadded if k.startswith("wasted"))


@FAST
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 20)), min_size=1, max_size=8))
def test_padding_never_saves_and_is_free_only_for_equal_samples(rows):
    counts, lengths = [c for c, _ in rows], [n for _, n in rows]
    padded, unpadded = K.padded_layout(counts, lengths), K.unpadded_layout(counts, lengths)
    for key in ("input_slots", "kv_slots", "attention_pairs"):
        assert padded[key] >= unpadded[key]
    equal = len(set(counts)) == 1 and len(set(lengths)) == 1
    assert (padded["wasted_kv_slots"] == 0) == equal


def test_vanilla_kv_growth_accumulates_the_max():
    g = K.vanilla_kv_growth([[1, 3], [2, 2], [4, 1]], [5, 5])
    assert g["padded_length"] == [8, 10, 14]
    assert g["unpadded_lengths"] == [[6, 8], [8, 10], [12, 11]]
    assert g["wasted_kv_slots"] == [2, 2, 5]


def test_advance_kv_lengths_each_sample_by_its_own_count():
    assert K.advance_kv_lengths([0, 16, 32], [5, 9, 0], [4, 4, 2], [1, 4, 0], [16, 16, 8]) == [6, 13, 0]


def _padded_reference(q_flat, kc, vc, counts, starts, lengths):
    """Each sample separately: its cache region then its new tokens, a causal mask with an offset."""
    out, lse = [], []
    flat = 0
    for b, c in enumerate(counts):
        if c == 0:
            continue
        keys = range(starts[b], starts[b] + lengths[b] + c)
        mask = [[j <= lengths[b] + i for j in range(len(keys))] for i in range(c)]
        o, l = attention_with_lse(q_flat[flat : flat + c], [kc[j] for j in keys], [vc[j] for j in keys], mask)
        out += o
        lse += l
        flat += c
    return out, lse


@FAST
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 2)), min_size=1, max_size=4),
       st.integers(0, 10**6))
def test_unpadded_attention_equals_per_sample_attention(rows, seed):
    counts = [c for c, _, _ in rows]
    if sum(counts) == 0:
        counts[0] = 1
    lengths = [n for _, n, _ in rows]
    starts, at = [], 0
    for (_, _, gap), c, n in zip(rows, counts, lengths, strict=True):
        starts.append(at + gap)  # regions with gaps between them, in order
        at = starts[-1] + n + c
    rnd = random.Random(seed)
    kc, vc, q = _rand(rnd, at + 1), _rand(rnd, at + 1, 3), _rand(rnd, sum(counts))
    got = K.unpadded_attention(q, kc, vc, counts, starts, lengths)
    want = _padded_reference(q, kc, vc, counts, starts, lengths)
    assert _rows_close(got[0], want[0]) and _close(got[1], want[1])


# --------------------------------------------------------------------------- SwiftSpec: re-rooting


@FAST
@given(trees_and_paths(), st.integers(0, 3), st.integers(0, 10**6))
def test_attention_after_reroot_and_compaction_equals_attention_from_scratch(tree, prefix_len, seed):
    parents, path = tree
    n = len(parents)
    rnd = random.Random(seed)
    q = _rand(rnd, n)  # per old node
    prefix_k, prefix_v = _rand(rnd, prefix_len), _rand(rnd, prefix_len, 3)
    node_k, node_v = _rand(rnd, n), _rand(rnd, n, 3)
    start, end = dfs_times(parents)
    order = sorted(range(n), key=start.__getitem__)
    spare = 2  # capacity beyond the tree, holding junk
    k_cache = prefix_k + [node_k[v] for v in order] + _rand(rnd, spare)
    v_cache = prefix_v + [node_v[v] for v in order] + _rand(rnd, spare, 3)

    r = K.reroot(parents, path)
    kept, prefix_nodes = r["kept"], r["prefix_nodes"]
    assert r["new_root"] == path[-1] and prefix_nodes == path[:-1]
    assert sorted(prefix_nodes + kept + r["discarded"]) == list(range(n))
    assert r["start"] == list(range(len(kept)))  # new ids are DFS order
    assert r["new_of_old"] == {old: new for new, old in enumerate(kept)}

    moves = K.compact_plan(prefix_len, parents, path)
    assert len({d for _, d in moves}) == len(moves) and len({s for s, _ in moves}) == len(moves)
    assert all(s > d for s, d in moves)  # only left shifts
    new_k = K.apply_moves(k_cache, moves)
    new_v = K.apply_moves(v_cache, moves)
    assert new_k == K.apply_moves_in_order(k_cache, moves)

    # no surviving entry lost or duplicated: the new [prefix | tree] holds exactly these
    p2 = prefix_len + len(prefix_nodes)
    assert new_k[:p2] == prefix_k + [node_k[v] for v in prefix_nodes]
    assert new_k[p2 : p2 + len(kept)] == [node_k[v] for v in kept]
    assert new_v[p2 : p2 + len(kept)] == [node_v[v] for v in kept]

    # attention of every kept node on the compacted cache with the re-rooted tree ...
    queries = list(range(len(kept)))
    q_new = [q[v] for v in kept]
    after = K.nonsquare_tree_attention(q_new, new_k, new_v, r["start"], r["end"], queries, p2)
    # ... equals attention from scratch: fresh cache, mask from the new parents' ancestors
    fresh_k = prefix_k + [node_k[v] for v in prefix_nodes] + [node_k[v] for v in kept]
    fresh_v = prefix_v + [node_v[v] for v in prefix_nodes] + [node_v[v] for v in kept]
    mask = [[True] * p2 + row for row in tree_mask(r["parents"])]
    scratch = attention_with_lse(q_new, fresh_k, fresh_v, mask)
    assert _rows_close(after[0], scratch[0]) and _close(after[1], scratch[1])
    # ... and equals what those nodes saw before verification: same keys, moved
    before = K.nonsquare_tree_attention(q_new, k_cache, v_cache, start, end, kept, prefix_len)
    assert _rows_close(after[0], before[0]) and _close(after[1], before[1])


def test_reroot_worked_example():
    #      0
    #    /   \
    #   1     2        verified 0 -> 2 -> 4: commit 0, 2; keep 4's subtree {4, 5, 6}
    #  / \   / \
    # 3   7 4   8
    #      / \
    #     5   6
    parents = [-1, 0, 0, 1, 2, 4, 4, 1, 2]
    r = K.reroot(parents, [0, 2, 4])
    assert r["prefix_nodes"] == [0, 2] and r["kept"] == [4, 5, 6] and r["parents"] == [-1, 0, 0]
    assert r["discarded"] == [1, 3, 7, 8]
    # DFS slots: 0:0 1:1 2:3 3:7 4:2 5:4 6:5 7:6 8:8 (prefix of 3 in front)
    assert K.compact_plan(3, parents, [0, 2, 4]) == [(7, 4), (8, 5), (9, 6), (10, 7)]
    assert K.compact_plan(0, parents, [0]) == []  # nothing verified past the root: all in place


def test_apply_moves_is_simultaneous_and_safe_with_overlap():
    cache = ["a", "b", "c", "d", "e"]
    right = [(0, 1), (1, 2), (2, 3)]
    assert K.apply_moves(cache, right) == ["a", "a", "b", "c", "e"]
    assert K.apply_moves_in_order(cache, right) == ["a", "a", "a", "a", "e"]  # the naive loop is wrong
    left = [(2, 0), (3, 1), (4, 2)]
    assert K.apply_moves(cache, left) == K.apply_moves_in_order(cache, left) == ["c", "d", "e", "d", "e"]
    assert K.apply_moves(cache, [(0, 1), (1, 0)]) == ["b", "a", "c", "d", "e"]  # a swap
    assert cache == ["a", "b", "c", "d", "e"]  # never modified


@FAST
@given(trees_and_paths(max_nodes=8))
def test_nonsquare_mask_rows_are_tree_mask_rows(tree):
    parents, _ = tree
    start, end = dfs_times(parents)
    full = tree_mask(parents)
    order = sorted(range(len(parents)), key=start.__getitem__)  # node at each tree slot
    queries = list(reversed(range(len(parents))))
    rows = K.nonsquare_tree_mask(start, end, queries, prefix_len=2)
    for q, row in zip(queries, rows, strict=True):
        assert row[:2] == [True, True]
        assert row[2:] == [full[q][v] for v in order]
        assert [order[j] for j, seen in enumerate(row[2:]) if seen] == sorted(
            ancestors(parents, q), key=start.__getitem__)


# --------------------------------------------------------------------------- SwiftSpec: tree growth


def _two_level(path):
    if len(path) == 1:
        return {10: math.log(0.6), 11: math.log(0.4)}
    return {20: math.log(0.5), 21: math.log(0.5)}


def test_expand_tree_takes_the_w_most_probable_candidates():
    t = K.expand_tree(_two_level, 7, 2, 2)
    assert t["tokens"] == [7, 10, 11, 20, 21] and t["parents"] == [-1, 0, 0, 1, 1]
    assert t["rounds"] == [[1, 2], [3, 4]]
    assert _close(t["cum_logprob"], [0.0, math.log(0.6), math.log(0.4), math.log(0.3), math.log(0.3)])
    # w = 1 is best-first, not a greedy chain: 0.6, then the sibling 0.4 beats 0.6 * 0.5, then 0.3
    one = K.expand_tree(_two_level, 7, 1, 3)
    assert one["parents"] == [-1, 0, 0, 1] and one["tokens"] == [7, 10, 11, 20]
    assert one["rounds"] == [[1], [2], [3]]


def test_expand_tree_stops_when_no_candidate_is_left():
    t = K.expand_tree(lambda path: {1: -0.5} if len(path) == 1 else {}, 0, 4, 3)
    assert t["rounds"] == [[1], [], []] and t["parents"] == [-1, 0]


@FAST
@given(st.integers(1, 7), st.integers(0, 10**6), st.data())
def test_best_subtree_is_the_most_probable_connected_subtree(n, seed, data):
    rnd = random.Random(seed)
    parents = [-1] + [rnd.randrange(i) for i in range(1, n)]
    lp = [0.0] + [math.log(rnd.choice([0.1, 0.25, 0.5, 1.0])) for _ in range(1, n)]  # ties included
    cum = [0.0] * n
    for v in range(1, n):
        cum[v] = cum[parents[v]] + lp[v]
    size = data.draw(st.integers(1, n))
    chosen = K.best_subtree(parents, cum, size)
    assert len(chosen) == size and 0 in chosen
    assert all(parents[v] in chosen for v in chosen if v != 0)  # connected, contains the root
    best = max(
        sum(math.exp(cum[v]) for v in subset)
        for subset in itertools.combinations(range(n), size)
        if 0 in subset and all(parents[v] in subset for v in subset if v != 0)
    )
    assert math.isclose(sum(math.exp(cum[v]) for v in chosen), best, rel_tol=1e-12)


# --------------------------------------------------------------------------- bad input


TREE = [-1, 0, 0, 1, 2, 4, 4, 1, 2]


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: K.reroot(TREE, [2, 4]), ValueError, r"verified_path\[0\] = 2 is not the root \(node 0\)"),
        (lambda: K.reroot(TREE, [0, 4]), ValueError,
         r"verified_path\[1\] = 4 is not a child of verified_path\[0\]"),
        (lambda: K.reroot(TREE, [0, 2, 2]), ValueError, r"verified_path\[2\] = 2 is not a child"),
        (lambda: K.reroot(TREE, [0, 9]), ValueError, r"verified_path\[1\] = 9 is out of range"),
        (lambda: K.reroot(TREE, []), ValueError, r"verified_path must not be empty"),
        (lambda: K.reroot([-1, -1], [0]), ValueError, r"parents has 2 roots"),
        (lambda: K.compact_plan(-1, TREE, [0]), ValueError, r"prefix_len must be >= 0"),
        (lambda: K.concatenate_inputs([]), ValueError, r"tokens_per_sample must not be empty"),
        (lambda: K.concatenate_inputs([[1], [-2]]), ValueError, r"tokens_per_sample\[1\]\[0\] = -2"),
        (lambda: K.concatenate_inputs([[1], 2]), TypeError, r"tokens_per_sample\[1\] must be a sequence"),
        (lambda: K.restore_indices([1, -1]), ValueError, r"counts\[1\] = -1 must be >= 0"),
        (lambda: K.restore_index_scan([1, 2], 3), ValueError, r"token = 3 is out of range"),
        (lambda: K.padded_layout([1, 2], [3]), ValueError, r"kv_lengths has 1 entries, expected B = 2"),
        (lambda: K.vanilla_kv_growth([[1]], [3, 3]), ValueError, r"accepted_steps\[0\] has 1 entries"),
        (lambda: K.advance_kv_lengths([0, 8], [2, 2], [3, 3], [4, 1], [8, 8]), ValueError,
         r"accepted\[0\] = 4 > counts\[0\] = 3"),
        (lambda: K.advance_kv_lengths([0, 8], [2, 6], [3, 3], [1, 1], [8, 8]), ValueError,
         r"cache overflow: sample 1"),
        (lambda: K.advance_kv_lengths([0, 4], [2, 2], [1, 1], [1, 1], [8, 8]), ValueError,
         r"regions of samples 0 \[0, 8\) and 1 \[4, 12\) overlap"),
        (lambda: K.unpadded_attention([[1.0]] * 3, [[1.0]] * 8, [[1.0]] * 8, [1, 1], [0, 4], [1, 1]),
         ValueError, r"q_flat has 3 rows, expected sum\(counts\) = 2"),
        (lambda: K.unpadded_attention([[1.0]] * 2, [[1.0]] * 6, [[1.0]] * 6, [1, 1], [0, 4], [1, 2]),
         ValueError, r"sample 1's KV region \[4, 7\) runs past the end of the cache \(6 slots\)"),
        (lambda: K.unpadded_attention([[1.0]] * 2, [[1.0]] * 8, [[1.0]] * 8, [1, 1], [0, 1], [1, 1]),
         ValueError, r"KV regions of samples 0 \[0, 2\) and 1 \[1, 3\) overlap"),
        (lambda: K.unpadded_attention([[1.0]], [[1.0]] * 8, [[1.0]] * 8, [0, 0], [0, 4], [1, 1]),
         ValueError, r"counts are all 0"),
        (lambda: K.apply_moves([1, 2, 3], [(0, 3)]), ValueError, r"moves\[0\] dst = 3 is out of range"),
        (lambda: K.apply_moves([1, 2, 3], [(-1, 0)]), ValueError, r"moves\[0\] src = -1 is out of range"),
        (lambda: K.apply_moves([1, 2, 3], [(0, 1), (2, 1)]), ValueError,
         r"moves\[1\] and moves\[0\] both write slot 1"),
        (lambda: K.apply_moves([1, 2, 3], [(0, 1, 2)]), ValueError, r"moves\[0\] has 3 entries"),
        (lambda: K.apply_moves_in_order([1, 2], [(0.0, 1)]), TypeError, r"moves\[0\] src must be an int"),
        (lambda: K.nonsquare_tree_mask([0, 1], [1, 1], [2]), ValueError,
         r"query_nodes\[0\] = 2 is out of range"),
        (lambda: K.nonsquare_tree_mask([0, 1], [1, 1], [0], -1), ValueError, r"prefix_len must be >= 0"),
        (lambda: K.nonsquare_tree_attention([[1.0]], [[1.0]] * 2, [[1.0]] * 2, [0, 1], [1, 1], [1], 1),
         ValueError, r"k_cache has 2 rows, but prefix_len \+ N = 3 slots are in use"),
        (lambda: K.expand_tree(_two_level, 0, 0, 1), ValueError, r"w must be a positive int"),
        (lambda: K.expand_tree(lambda p: {1: 0.5}, 0, 1, 1), ValueError,
         r"logprobs_of\(\(0,\)\)\[1\] = 0.5 is not a log-probability"),
        (lambda: K.expand_tree(lambda p: [0.0], 0, 1, 1), TypeError, r"must return a mapping"),
        (lambda: K.expand_tree(None, 0, 1, 1), TypeError, r"logprobs_of must be callable"),
        (lambda: K.best_subtree([-1, 0], [0.0, 0.5], 1), ValueError,
         r"cumulative_logprob\[1\] = 0.5 > cumulative_logprob\[0\] = 0.0"),
        (lambda: K.best_subtree([-1, 0], [0.0, -1.0], 3), ValueError, r"size = 3 is larger than the tree"),
        (lambda: K.best_subtree([-1, 0], [0.0], 1), ValueError, r"cumulative_logprob has 1 entries"),
        (lambda: K.best_subtree([-1, 0], [0.0, math.nan], 1), ValueError,
         r"cumulative_logprob\[1\] = nan is not allowed"),
    ],
)
def test_bad_input_raises_named_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_cache_unchanged_when_moves_are_refused():
    cache = [[1.0], [2.0], [3.0]]
    snapshot = [row[:] for row in cache]
    for moves in ([(0, 1), (2, 1)], [(0, 5)], [(2, 0), "x"]):
        with pytest.raises((ValueError, TypeError)):
            K.apply_moves(cache, moves)
        assert cache == snapshot
