"""Diffs shown in the notebooks are generated from the code."""

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



def test_function_in_file_reads_a_function_with_its_closing_comments():
    text = textwrap.dedent("""\
        import functools


        @functools.cache
        def f(x):
            \"\"\"Doc.\"\"\"
            ### BEGIN SOLUTION
            return x
            ### END SOLUTION
        # a comment of the module, not of f


        def g():
            pass
        """)
    assert source.function_in_file(text, "f") == textwrap.dedent("""\
        @functools.cache
        def f(x):
            \"\"\"Doc.\"\"\"
            ### BEGIN SOLUTION
            return x
            ### END SOLUTION""")
    assert source.function_in_file(text, "g") == "def g():\n    pass"
    assert source.function_in_file(text, "h") is None


def test_diff_sources_leaves_the_markers_out():
    old = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"
    new = "def f():\n    return 2"
    assert source.diff_sources(old, new, "a.f", "b.f", context=0).splitlines()[2:] == [
        "@@ -2 +2 @@", "-    return 1", "+    return 2"]


def test_without_docstring_keeps_the_code():
    code = source.without_docstring(source.source_of)
    assert '"""' not in code and code.startswith("def source_of(function) -> str:")
    assert "plain = python_function(function)" in code
