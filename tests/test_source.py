"""Diffs shown in the notebooks are generated from the code."""

import importlib
import textwrap

import pytest

from course.core import source
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



def test_region_is_the_answer_between_the_markers():
    answer = source.region(trees.tree_mask_kernel)
    assert "mask[b, q, k] = start[b, k] <= start[b, q] and end[b, q] <= end[b, k]" in answer
    assert answer == textwrap.dedent(answer) and "### " not in answer
    whole = source.source_of(trees.tree_mask_kernel)
    assert all(line.strip() in whole for line in answer.splitlines())
    with pytest.raises(ValueError, match="has no exercise region"):
        source.region(source.region)


def test_region_leaves_out_the_lesson_lines():
    bug = importlib.import_module("solutions.ladder_bug").tree_attention_kernel
    assert "### LESSON" in source.source_of(bug)
    assert "### LESSON" not in source.region(bug) and "cuda.syncthreads()" in source.region(bug)


def test_without_docstring_keeps_the_code():
    code = source.without_docstring(source.region)
    assert '"""' not in code and code.startswith("def region(function) -> str:")
    assert "lines = source_of(function).splitlines()" in code
