"""pyspec_ref.attention against torch (float64) and against itself across algorithms."""

from __future__ import annotations

import importlib
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspec_ref import trees as T

# The package re-exports the function `attention`, which shadows the submodule's
# attribute on the package; import_module returns the module itself.
A = importlib.import_module("pyspec_ref.attention")

FAST = settings(max_examples=40, deadline=None)


# --------------------------------------------------------------------------- data


@st.composite
def random_trees(draw, min_nodes: int = 1, max_nodes: int = 40) -> list[int]:
    """A random tree (random recursive tree of random reach), ids shuffled."""
    n = draw(st.integers(min_nodes, max_nodes))
    reach = draw(st.integers(1, n))
    topo = [-1] + [draw(st.integers(max(0, i - reach), i - 1)) for i in range(1, n)]
    perm = draw(st.permutations(range(n)))
    parents = [0] * n
    for i, p in enumerate(topo):
        parents[perm[i]] = -1 if p == -1 else perm[p]
    return parents


def rand_matrix(rnd: random.Random, rows: int, cols: int) -> list[list[float]]:
    """Uniform in [-2, 2]: never all zeros, large enough to make softmax non-uniform."""
    return [[rnd.uniform(-2.0, 2.0) for _ in range(cols)] for _ in range(rows)]


def rand_mask(rnd: random.Random, n: int, m: int, density: float) -> list[list[bool]]:
    """A random mask in which every row sees at least one key."""
    mask = [[rnd.random() < density for _ in range(m)] for _ in range(n)]
    for row in mask:
        row[rnd.randrange(m)] = True
    return mask


seeds = st.integers(0, 2**32 - 1)
dims = st.integers(1, 8)


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def torch_reference(q, k, v, mask, scale):
    """(out, lse) from torch's SDPA and logsumexp, in float64."""
    qt, kt, vt, mt = t64(q), t64(k), t64(v), torch.tensor(mask, dtype=torch.bool)
    out = torch.nn.functional.scaled_dot_product_attention(
        qt[None, None], kt[None, None], vt[None, None], attn_mask=mt, scale=scale
    )[0, 0]
    s = (qt @ kt.T) * scale
    lse = torch.logsumexp(s.masked_fill(~mt, -math.inf), dim=-1)
    return out, lse


def assert_close(got, expected, tol=1e-9):
    torch.testing.assert_close(t64(got), expected, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- vs torch


@FAST
@given(seeds, st.integers(1, 12), st.integers(1, 12), dims)
def test_scores_and_softmax_match_torch(seed, n, m, d):
    rnd = random.Random(seed)
    q, k = rand_matrix(rnd, n, d), rand_matrix(rnd, m, d)
    s = A.scores(q, k)
    assert_close(s, (t64(q) @ t64(k).T) / math.sqrt(d))
    assert_close(A.scores(q, k, scale=0.3), (t64(q) @ t64(k).T) * 0.3)
    for row in s:
        assert_close(A.softmax(row), torch.softmax(t64(row), dim=0))


@FAST
@given(seeds, random_trees(), dims, dims)
def test_tree_attention_matches_torch_sdpa(seed, parents, d, dv):
    rnd = random.Random(seed)
    n = len(parents)
    q, k, v = rand_matrix(rnd, n, d), rand_matrix(rnd, n, d), rand_matrix(rnd, n, dv)
    mask = T.tree_mask(parents)
    out, lse = A.attention_with_lse(q, k, v, mask)
    ref_out, ref_lse = torch_reference(q, k, v, mask, 1 / math.sqrt(d))
    assert_close(out, ref_out)
    assert_close(lse, ref_lse)
    t_out, t_lse = A.tree_attention(q, k, v, *T.dfs_times(parents))
    assert_close(t_out, ref_out)
    assert_close(t_lse, ref_lse)
    assert A.attention(q, k, v, mask) == out


@FAST
@given(seeds, st.integers(1, 12), st.integers(1, 12), dims, dims, st.floats(0.05, 0.95))
def test_rectangular_masked_attention_matches_torch(seed, n, m, d, dv, density):
    rnd = random.Random(seed)
    q, k, v = rand_matrix(rnd, n, d), rand_matrix(rnd, m, d), rand_matrix(rnd, m, dv)
    mask = rand_mask(rnd, n, m, density)
    scale = rnd.uniform(0.1, 2.0)
    out, lse = A.attention_with_lse(q, k, v, mask, scale=scale)
    ref_out, ref_lse = torch_reference(q, k, v, mask, scale)
    assert_close(out, ref_out)
    assert_close(lse, ref_lse)


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_tree_attention_on_a_chain_is_causal_attention(n):
    rnd = random.Random(n)
    d = 4
    q, k, v = rand_matrix(rnd, n, d), rand_matrix(rnd, n, d), rand_matrix(rnd, n, 3)
    out, lse = A.tree_attention(q, k, v, *T.dfs_times(T.chain_parents(n)))
    assert (out, lse) == A.attention_with_lse(q, k, v, T.causal_mask(n))
    ref = torch.nn.functional.scaled_dot_product_attention(
        t64(q)[None], t64(k)[None], t64(v)[None], is_causal=True
    )[0]
    assert_close(out, ref)


# --------------------------------------------------------------------------- algorithms agree


@settings(max_examples=25, deadline=None)
@given(seeds, random_trees(max_nodes=24), dims, st.data())
def test_flash_attention_equals_naive_for_any_tiles(seed, parents, d, data):
    rnd = random.Random(seed)
    n = len(parents)
    q, k, v = rand_matrix(rnd, n, d), rand_matrix(rnd, n, d), rand_matrix(rnd, n, 3)
    mask = T.tree_mask(parents)
    expected_out, expected_lse = A.attention_with_lse(q, k, v, mask)
    for _ in range(3):
        bq = data.draw(st.integers(1, n + 3), label="block_q")
        bk = data.draw(st.integers(1, n + 3), label="block_k")
        out, lse = A.flash_attention(q, k, v, mask, block_q=bq, block_k=bk)
        assert_close(out, t64(expected_out))
        assert_close(lse, t64(expected_lse))


@pytest.mark.parametrize("bq,bk", [(1, 1), (1, 7), (3, 2), (32, 32), (40, 1)])
def test_flash_attention_with_sparse_rectangular_mask(bq, bk):
    """Many fully masked tiles: the m = -inf path must contribute nothing."""
    rnd = random.Random(bq * 100 + bk)
    n, m, d = 9, 23, 5
    q, k, v = rand_matrix(rnd, n, d), rand_matrix(rnd, m, d), rand_matrix(rnd, m, 2)
    mask = rand_mask(rnd, n, m, density=0.05)
    out, lse = A.flash_attention(q, k, v, mask, scale=0.7, block_q=bq, block_k=bk)
    ref_out, ref_lse = A.attention_with_lse(q, k, v, mask, scale=0.7)
    assert_close(out, t64(ref_out))
    assert_close(lse, t64(ref_lse))


@FAST
@given(
    st.lists(st.one_of(st.floats(-50, 50), st.just(-math.inf)), min_size=1, max_size=30).filter(
        lambda r: any(x != -math.inf for x in r)
    ),
    st.integers(1, 33),
)
def test_online_softmax_equals_softmax_for_any_block(row, block):
    expected = A.softmax(row)
    assert_close(A.online_softmax(row, block), t64(expected))
    m, l = A.online_softmax_stats(row, block)
    assert m == max(row)
    finite = t64([x for x in row if x != -math.inf])
    # abs_tol: near 0, log(l) of l close to 1 has only an absolute precision of a few ulps of 1
    assert math.isclose(m + math.log(l), torch.logsumexp(finite, 0).item(), rel_tol=1e-12, abs_tol=1e-14)
    assert all(p == 0.0 for p, x in zip(expected, row, strict=True) if x == -math.inf)


def test_online_softmax_stats_of_all_masked_row_is_empty_sum():
    assert A.online_softmax_stats([-math.inf] * 4, block=3) == (-math.inf, 0.0)


@FAST
@given(seeds, random_trees(max_nodes=30), dims, st.integers(1, 5))
def test_merge_of_disjoint_key_splits_equals_full_attention(seed, parents, d, n_parts):
    """The Flash-Decoding / DeFT §3.4 reduction: split keys, attend, merge by lse."""
    rnd = random.Random(seed)
    n, dv = len(parents), 3
    q, k, v = rand_matrix(rnd, n, d), rand_matrix(rnd, n, d), rand_matrix(rnd, n, dv)
    mask = T.tree_mask(parents)
    full_out, full_lse = A.attention_with_lse(q, k, v, mask)
    part_of = [rnd.randrange(n_parts) for _ in range(n)]  # some parts may be empty
    for i in range(n):
        outs, lses = [], []
        for p in range(n_parts):
            keys = [j for j in range(n) if part_of[j] == p and mask[i][j]]
            if not keys:  # this partial saw no key: lse -inf, output undefined
                outs.append([math.nan] * dv)
                lses.append(-math.inf)
                continue
            o, s = A.attention_with_lse(
                [q[i]], [k[j] for j in keys], [v[j] for j in keys], scale=1 / math.sqrt(d)
            )
            outs.append(o[0])
            lses.append(s[0])
        rnd.shuffle(order := list(range(n_parts)))
        out, lse = A.merge_attention([outs[p] for p in order], [lses[p] for p in order])
        assert_close(out, t64(full_out[i]))
        assert math.isclose(lse, full_lse[i], rel_tol=1e-12, abs_tol=1e-12)


def test_merge_is_stable_for_large_lse():
    out, lse = A.merge_attention([[1.0, 2.0], [3.0, 4.0]], [1000.0, 1000.0])
    assert out == [2.0, 3.0]
    assert math.isclose(lse, 1000.0 + math.log(2.0))
    assert A.merge_attention([[5.0]], [-3.0]) == ([5.0], -3.0)
