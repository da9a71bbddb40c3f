"""Every torch oracle of `course.oracle` agrees with `pyspec_ref` on small random inputs.

The oracles check whole GPU outputs where the pure-Python specification would take hours; each is
only as good as its agreement with the specification, which these tests (or the ones COVERED
names) establish. A new oracle without a test here fails `test_every_oracle_is_covered`.
"""

import inspect
import random
from pathlib import Path

import pytest
import torch

import pyspec_ref
import pyspec_ref.kvcache as kv_spec
from course import oracle
from course.core import inputs
from course.oracle import kvcache as kv_oracle
from course.oracle import sampling as sampling_oracle
from course.topics.kvcache.check import attention_problem

# oracle -> the test that checks it against pyspec_ref (file::function)
COVERED = {
    "course.oracle.dense_tree_mask": "test_launchers.py::test_oracle_agrees_with_pyspec_ref",
    "course.oracle.tree_attention": "test_launchers.py::test_oracle_agrees_with_pyspec_ref",
    "course.oracle.tile_mask": "test_launchers.py::test_oracle_tile_mask_agrees_with_pyspec_ref",
    "course.oracle.attention_with_lse": "test_oracle.py::test_attention_with_lse_is_the_specifications",
    "course.oracle.tree_kv_mask": "test_oracle.py::test_tree_kv_mask_is_the_specifications",
    "course.oracle.tree_kv_attention":
        "test_deft_baselines.py::test_the_oracle_is_attention_with_lse_of_pyspec_ref",
    "course.oracle.kvcache.unpadded_attention":
        "test_oracle.py::test_unpadded_attention_is_the_specifications",
    "course.oracle.kvcache.nonsquare_tree_attention":
        "test_oracle.py::test_nonsquare_tree_attention_is_the_specifications",
    # the masks the two attentions above are built on (and the checks' diagnoses replay)
    "course.oracle.kvcache.unpadded_mask": "test_oracle.py::test_unpadded_attention_is_the_specifications",
    "course.oracle.kvcache.nonsquare_mask":
        "test_oracle.py::test_nonsquare_tree_attention_is_the_specifications",
    "course.oracle.kvcache.compaction": "test_oracle.py::test_compaction_is_apply_moves",
    "course.oracle.sampling.weights_of": "test_spec_sampling.py::test_float64_torch_reference_equals_pyspec",
    "course.oracle.sampling.speculative_sampling":
        "test_spec_sampling.py::test_float64_torch_reference_equals_pyspec",
    "course.oracle.sampling.tree_speculative_sampling":
        "test_tree_verification.py::test_the_references_agree_with_pyspec",
}


def _oracles() -> list[str]:
    found = []
    for module in (oracle, kv_oracle, sampling_oracle):
        found += [f"{module.__name__}.{name}" for name, value in vars(module).items()
                  if inspect.isfunction(value) and value.__module__ == module.__name__
                  and not name.startswith("_")]
    return found


def test_every_oracle_is_covered():
    missing = sorted(set(_oracles()) - set(COVERED))
    assert not missing, f"oracles without a test against pyspec_ref: {missing}"
    for name, where in COVERED.items():
        file, test = where.split("::")
        assert f"def {test}(" in (Path(__file__).parent / file).read_text(), f"{name}: {where} is gone"


def _close(got, want, atol=1e-12):
    return torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=atol)


@pytest.mark.parametrize("seed", range(4))
def test_attention_with_lse_is_the_specifications(seed):
    rng = random.Random(seed)
    n, m, d = rng.randint(1, 6), rng.randint(1, 7), rng.randint(1, 5)
    q, k, v = (inputs.random_tensor(shape, seed * 3 + i, torch.float64) for i, shape in
               enumerate(((n, d), (m, d), (m, d))))
    mask = torch.tensor([[rng.random() < 0.6 for _ in range(m)] for _ in range(n)])
    mask[:, 0] = True  # every row sees a key: the specification refuses an empty row
    out, lse = oracle.attention_with_lse(q, k, v, mask, scale=0.7)
    want, want_lse = pyspec_ref.attention_with_lse(q.tolist(), k.tolist(), v.tolist(), mask.tolist(), 0.7)
    assert _close(out, want) and _close(lse, want_lse)


@pytest.mark.parametrize("seed", range(4))
def test_tree_kv_mask_is_the_specifications(seed):
    rng = random.Random(seed)
    parents = inputs.random_tree(rng.randint(1, 9), rng, max_children=3)
    lengths = [rng.randint(1, 4) for _ in parents]
    queries = [rng.randrange(len(parents)) for _ in range(rng.randint(1, 5))]
    mask = oracle.tree_kv_mask(parents, lengths, queries)
    want = pyspec_ref.visible_tokens(parents, lengths, queries)
    assert [row.nonzero().squeeze(1).tolist() for row in mask] == want


@pytest.mark.parametrize("seed", range(3))
def test_unpadded_attention_is_the_specifications(seed):
    rng = random.Random(seed)
    counts = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
    lengths = [rng.randint(0, 4) for _ in counts]
    starts, row = [], 1  # regions after a gap, in sample order
    for count, length in zip(counts, lengths, strict=True):
        starts.append(row)
        row += length + count + rng.randint(0, 2)
    heads, heads_kv, d = 4, 2, 3
    q = inputs.random_tensor((sum(counts), heads, d), seed, torch.float64)
    k, v = (inputs.random_tensor((row, heads_kv, d), seed + i, torch.float64) for i in (1, 2))
    out, lse = kv_oracle.unpadded_attention(q, k, v, counts, starts, lengths)
    for h in range(heads):
        want, want_lse = kv_spec.unpadded_attention(q[:, h].tolist(), k[:, h // 2].tolist(),
                                                    v[:, h // 2].tolist(), counts, starts, lengths)
        assert _close(out[:, h], want) and _close(lse[:, h], want_lse)


@pytest.mark.parametrize("seed", range(3))
def test_nonsquare_tree_attention_is_the_specifications(seed):
    rng = random.Random(seed)
    parents = inputs.random_tree(rng.randint(1, 10), rng, max_children=3)
    prefix, width = rng.randint(0, 4), rng.randint(1, 4)
    queries = [rng.randrange(len(parents)) for _ in range(width)]
    kwargs, _ = attention_problem([(prefix, parents, queries, None)], 4, 2, width, 3, torch.float64, seed)
    out, lse = kv_oracle.nonsquare_tree_attention(**kwargs)
    start, end = pyspec_ref.dfs_times(parents)
    for h in range(4):
        want, want_lse = kv_spec.nonsquare_tree_attention(
            kwargs["q"][0, h].tolist(), kwargs["k_cache"][0, h // 2].tolist(),
            kwargs["v_cache"][0, h // 2].tolist(), start, end, queries, prefix)
        assert _close(out[0, h].cpu(), want) and _close(lse[0, h].cpu(), want_lse)


@pytest.mark.parametrize("seed", range(3))
def test_compaction_is_apply_moves(seed):
    rng = random.Random(seed)
    parents = inputs.random_tree(rng.randint(2, 12), rng, max_children=3)
    prefix, capacity = rng.randint(0, 3), 20
    path = [0]
    while children := [c for c in range(len(parents)) if parents[c] == path[-1]]:
        path.append(rng.choice(children))
    moves = kv_spec.compact_plan(prefix, parents, path)
    sources = kv_spec.apply_moves(list(range(capacity)), moves)
    cache = inputs.random_tensor((1, 2, capacity, 3), seed, torch.float32)
    got = kv_oracle.compaction(cache, [sources])
    for row in range(2):
        want = kv_spec.apply_moves(cache[0, row].tolist(), moves)
        assert got[0, row].tolist() == want
