"""Diffs shown in the notebooks are generated from the code."""

import pytest

from course import source
from solutions import trees


def test_diff_of_two_kernels_shows_only_the_change():
    text = source.diff(trees.tree_mask_kernel, trees.tree_bitmask_kernel, context=0)
    assert text.startswith("--- tree_mask_kernel\n+++ tree_bitmask_kernel")
    assert "+    bits = np.int64(0)" in text
    assert "-        mask[b, q, k] = start[b, k] <= start[b, q] and end[b, q] <= end[b, k]" in text
    assert source.diff(trees.tree_mask_kernel, trees.tree_mask_kernel) == ""


def test_source_arguments_are_checked():
    assert source.source_of(trees.dfs_times).startswith("def dfs_times(")
    with pytest.raises(TypeError, match="function must be a function or a kernel"):
        source.source_of(3)
    with pytest.raises(ValueError, match="context must be a non-negative int"):
        source.diff(trees.dfs_times, trees.dfs_times, context=-1)
