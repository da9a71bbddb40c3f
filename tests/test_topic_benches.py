"""Notebook 01's and 02's benches at tiny sizes in the simulator (the timer replaced by one call):
every row agrees with the reference and fits the results schema."""

import pytest

from course.measure import results
from course.topics.attention import bench as attention_bench
from course.topics.trees import bench as trees_bench


@pytest.fixture
def untimed(monkeypatch):
    for module in (trees_bench, attention_bench):
        monkeypatch.setattr(module.timing, "bench", lambda fn, **_: (fn(), 1.0)[1])


def _valid(suite, rows):
    return results.validate({"suite": suite, "device": "test", "date": "2026-01-01", "software": {},
                             "rows": rows})


def test_trees_bench_rows_agree_with_the_reference(untimed):
    rows = trees_bench.measure_size(3, 70)  # two 64-bit words per row, a ragged mask tile
    assert [row["name"] for row in rows] == ["dfs_times", "tree_mask", "tree_bitmask", "torch_dense_mask"]
    assert all(row["max_abs_err"] == 0.0 for row in rows)
    assert {trees_bench.section_of(row) for row in rows} == set(trees_bench.SECTIONS)
    _valid(trees_bench.SUITE, rows)


def test_attention_bench_rows_agree_with_the_reference(untimed, monkeypatch):
    monkeypatch.setattr(attention_bench, "BLOCK_K", 8)
    rows = attention_bench.measure_shape(1, 2, 24, 16)
    assert [row["name"] for row in rows] == ["flash_attention", "sdpa"]
    assert all(row["max_abs_err"] < 1e-5 for row in rows)
    assert {attention_bench.section_of(row) for row in rows} == set(attention_bench.SECTIONS)
    _valid(attention_bench.SUITE, rows)
