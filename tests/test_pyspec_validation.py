"""Every public function of pyspec_ref refuses bad input with an error naming the argument.

Also: pyspec_ref imports nothing outside the standard library, re-exports its
public names, and cites a paper in every public docstring.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import sys
from pathlib import Path

import pytest

import pyspec_ref
from pyspec_ref import trees as T

# The package re-exports the function `attention`, which shadows the submodule.
A = importlib.import_module("pyspec_ref.attention")

INF = math.inf
Q1, K1, V1 = [[1.0, 2.0]], [[0.5, -1.0], [1.5, 0.25]], [[1.0], [-2.0]]  # N=1, M=2, d=2, dv=1

# --------------------------------------------------------------------------- trees

BAD_PARENTS = [
    ([1, 2, 0], ValueError, r"parents has no root"),
    ([-1, 2, 1], ValueError, r"parents has a cycle through node 1 \(1 -> 2 -> 1\)"),
    ([-1, 0, 3, 4, 2], ValueError, r"parents has a cycle through node 2"),
    ([-1, -1, 0, -1], ValueError, r"parents has 3 roots \(nodes 0, 1, 3\)"),
    ([-1, 0, 0, 7, 0], ValueError, r"parents\[3\] = 7 is out of range for a tree of 5 nodes"),
    ([-1, -2], ValueError, r"parents\[1\] = -2 is out of range"),
    ([-1, 0, 2], ValueError, r"parents\[2\] = 2: node 2 is its own parent"),
    ([-1, 0.0], TypeError, r"parents\[1\] must be an int, got 0\.0"),
    ([-1, True], TypeError, r"parents\[1\] must be an int, got True"),
    ([-1, None], TypeError, r"parents\[1\] must be an int, got None"),
    ([-1, "0"], TypeError, r"parents\[1\] must be an int"),
    ([], ValueError, r"parents must not be empty"),
    ("-1", TypeError, r"parents must be a sequence of ints"),
    ({0: -1}, TypeError, r"parents must be a sequence of ints"),
    (None, TypeError, r"parents must be a sequence of ints"),
]

# every public function that takes a parent array as its only tree argument
PARENT_FUNCTIONS = [
    T.validate_parents,
    T.validate_topological,
    T.children,
    T.root,
    T.depths,
    T.dfs_times,
    T.dfs_order,
    T.bfs_order,
    T.tree_mask,
    T.tree_bitmask,
    lambda p: T.ancestors(p, 0),
    lambda p: T.relabel(p, [0]),
]


@pytest.mark.parametrize("parents,exc,match", BAD_PARENTS)
@pytest.mark.parametrize("fn", PARENT_FUNCTIONS)
def test_bad_parent_arrays_are_refused_everywhere(fn, parents, exc, match):
    with pytest.raises(exc, match=match):
        fn(parents)


def test_validate_parents_uses_the_given_name():
    with pytest.raises(ValueError, match=r"draft\[1\] = 5 is out of range"):
        T.validate_parents([-1, 5], name="draft")
    with pytest.raises(ValueError, match=r"draft has 2 roots"):
        T.validate_topological([-1, -1], name="draft")


def test_validate_parents_returns_a_copy_of_any_sequence():
    assert T.validate_parents((-1, 0, 0)) == [-1, 0, 0]
    assert T.validate_parents(range(-1, 3)) == [-1, 0, 1, 2]


@pytest.mark.parametrize(
    "parents,match",
    [
        ([-1, 2, 0], r"parents\[1\] = 2: node 1's parent must come before it"),
        ([-1, 0, 3, 1], r"parents\[2\] = 3"),
        ([1, -1], r"parents\[0\] = 1: in topological order the root must be node 0"),
    ],
)
def test_validate_topological_refuses_parent_after_child(parents, match):
    assert T.validate_parents(parents) == parents  # a valid tree, just not in order
    with pytest.raises(ValueError, match=match):
        T.validate_topological(parents)


@pytest.mark.parametrize(
    "node,exc,match",
    [
        (3, ValueError, r"node = 3 is out of range"),
        (-1, ValueError, r"node = -1"),
        (1.0, TypeError, r"node must be an int"),
        (True, TypeError, r"node must be an int"),
    ],
)
def test_ancestors_validates_node(node, exc, match):
    with pytest.raises(exc, match=match):
        T.ancestors([-1, 0, 0], node)


@pytest.mark.parametrize(
    "order,exc,match",
    [
        ([0, 0, 1], ValueError, r"order\[1\] = 0 repeats order\[0\]"),
        ([0, 1], ValueError, r"order has 2 entries, expected 3"),
        ([0, 1, 3], ValueError, r"order\[2\] = 3 is out of range"),
        ([0, 1, 2.0], TypeError, r"order\[2\] must be an int"),
    ],
)
def test_relabel_validates_order(order, exc, match):
    with pytest.raises(exc, match=match):
        T.relabel([-1, 0, 0], order)


BAD_TIMES = [
    ([0, 1, 1], [2, 2, 2], ValueError, r"start\[2\] = 1 repeats start\[1\]"),
    ([0, 1, 3], [2, 2, 2], ValueError, r"start\[2\] = 3 is out of range"),
    ([0, 1, 2, 3], [3, 2, 3, 3], ValueError, r"start/end: the intervals of nodes 1 .* cross"),
    ([0, 1], [0, 1], ValueError, r"end\[0\] = 0: the root .* must have the interval \[0, 1\]"),
    ([0, 1], [1], ValueError, r"start has 2 entries but end has 1"),
    ([0, 1], [1, 0], ValueError, r"end\[1\] = 0 is out of range"),
    ([0, 1], [1, 2], ValueError, r"end\[1\] = 2 is out of range"),
    ([], [], ValueError, r"start must not be empty"),
    ([0, 1.0], [1, 1], TypeError, r"start\[1\] must be an int"),
    ([0, 1], [1, None], TypeError, r"end\[1\] must be an int"),
]


@pytest.mark.parametrize("start,end,exc,match", BAD_TIMES)
@pytest.mark.parametrize(
    "fn",
    [
        T.validate_times,
        T.parents_from_times,
        T.tree_mask_from_times,
        lambda s, e: T.sees(s, e, 0, 0),
        lambda s, e: A.tree_attention([[1.0]] * len(s), [[1.0]] * len(s), [[1.0]] * len(s), s, e),
    ],
)
def test_bad_times_are_refused_everywhere(fn, start, end, exc, match):
    with pytest.raises(exc, match=match):
        fn(start, end)


def test_validate_times_uses_the_given_names():
    with pytest.raises(ValueError, match=r"e\[1\] = 0 is out of range: need s\[1\] = 1"):
        T.validate_times([0, 1], [1, 0], name="s/e")
    with pytest.raises(ValueError, match=r"t start\[1\] = 0 repeats"):
        T.validate_times([0, 0], [1, 1], name="t")


@pytest.mark.parametrize(
    "query,key,match", [(2, 0, r"query = 2 is out of range"), (0, -1, r"key = -1 is out of range")]
)
def test_sees_validates_node_indices(query, key, match):
    with pytest.raises(ValueError, match=match):
        T.sees([0, 1], [1, 1], query, key)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: T.chain_parents(0), ValueError, r"n must be a positive int"),
        (lambda: T.causal_mask(-3), ValueError, r"n must be a positive int"),
        (lambda: T.causal_mask(2.0), TypeError, r"n must be an int"),
        (lambda: T.dense_mask_bits(0, 128), ValueError, r"n must be a positive int"),
        (lambda: T.dense_mask_bits(4096, -1), ValueError, r"batch must be a positive int"),
        (lambda: T.interval_mask_bits(4096, 1.5), TypeError, r"batch must be an int"),
        (lambda: T.interval_mask_bits(4, 1, 0), ValueError, r"bits_per_time must be a positive"),
    ],
)
def test_sizes_must_be_positive_ints(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# --------------------------------------------------------------------------- bitmasks


@pytest.mark.parametrize(
    "word_bits,exc",
    [(0, ValueError), (-8, ValueError), (8.0, TypeError), (True, TypeError), ("64", TypeError)],
)
def test_bad_word_bits(word_bits, exc):
    match = r"word_bits must be"
    with pytest.raises(exc, match=match):
        T.bitmask_from_mask([[True]], word_bits)
    with pytest.raises(exc, match=match):
        T.mask_from_bitmask([[1]], 1, word_bits)
    with pytest.raises(exc, match=match):
        T.tree_bitmask([-1], word_bits)


@pytest.mark.parametrize(
    "mask,exc,match",
    [
        ([[1, 0]], TypeError, r"mask\[0\]\[0\] must be a bool"),
        ([[True], [True, False]], ValueError, r"mask\[1\] has 2 columns, expected 1"),
        ([], ValueError, r"mask must have at least one row"),
        ([[]], ValueError, r"mask\[0\] is empty"),
        ([True], TypeError, r"mask\[0\] must be a row"),
    ],
)
def test_bitmask_from_mask_validates_mask(mask, exc, match):
    with pytest.raises(exc, match=match):
        T.bitmask_from_mask(mask)


@pytest.mark.parametrize(
    "words,n_keys,exc,match",
    [
        ([[8]], 3, ValueError, r"words\[0\]\[0\] = 8 sets bits for keys >= n_keys = 3"),
        ([[0, 2]], 9, ValueError, r"words\[0\]\[1\] = 2 sets bits for keys >= n_keys = 9"),
        ([[256]], 8, ValueError, r"words\[0\]\[0\] = 256 does not fit in word_bits = 8"),
        ([[-1]], 8, ValueError, r"words\[0\]\[0\] = -1 does not fit"),
        ([[1, 0]], 3, ValueError, r"words\[0\] has 2 words, expected .* = 1"),
        ([[1]], 0, ValueError, r"n_keys must be a positive int"),
        ([[1.0]], 3, TypeError, r"words\[0\]\[0\] must be an int"),
        ([], 3, ValueError, r"words must have at least one row"),
    ],
)
def test_mask_from_bitmask_validates_words(words, n_keys, exc, match):
    with pytest.raises(exc, match=match):
        T.mask_from_bitmask(words, n_keys, 8)


# --------------------------------------------------------------------------- attention

ATTENTION_FUNCTIONS = [
    A.attention,
    A.attention_with_lse,
    A.flash_attention,
    lambda q, k, v, **kw: A.flash_attention(q, k, v, block_q=1, block_k=1, **kw),
]

BAD_QKV = [
    (3, K1, V1, TypeError, r"q must be a list of rows"),
    ([], K1, V1, ValueError, r"q must have at least one row"),
    ([[]], K1, V1, ValueError, r"q\[0\] is empty"),
    ([[1.0, 2.0], [1.0]], K1, V1, ValueError, r"q\[1\] has 1 columns, expected 2"),
    ([[math.nan, 1.0]], K1, V1, ValueError, r"q\[0\]\[0\] = nan is not allowed"),
    ([[1.0, INF]], K1, V1, ValueError, r"q\[0\]\[1\] = inf is not allowed"),
    ([[1.0, True]], K1, V1, TypeError, r"q\[0\]\[1\] must be a real number"),
    ([["1", 1.0]], K1, V1, TypeError, r"q\[0\]\[0\] must be a real number"),
    ([1.0, 2.0], K1, V1, TypeError, r"q\[0\] must be a row"),
    (
        Q1,
        [[1.0, 2.0], [1.0, 2.0, 3.0]],
        V1,
        ValueError,
        r"k\[1\] has 3 columns, expected d = 2 \(the width of q\)",
    ),
    (Q1, [[1.0, -INF], [0.0, 0.0]], V1, ValueError, r"k\[0\]\[1\] = -inf is not allowed"),
    (Q1, K1, [[1.0]], ValueError, r"v has 1 rows, expected M = 2 \(the number of rows of k\)"),
    (Q1, K1, [[1.0], [1.0, 2.0]], ValueError, r"v\[1\] has 2 columns, expected 1"),
    (Q1, K1, [[1.0], [math.nan]], ValueError, r"v\[1\]\[0\] = nan"),
]


@pytest.mark.parametrize("q,k,v,exc,match", BAD_QKV)
@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS)
def test_attention_validates_q_k_v(fn, q, k, v, exc, match):
    with pytest.raises(exc, match=match):
        fn(q, k, v)


BAD_MASKS = [
    ([[True, 1]], TypeError, r"mask\[0\]\[1\] must be a bool"),
    ([[True, 0.0]], TypeError, r"mask\[0\]\[1\] must be a bool"),
    ([[True]], ValueError, r"mask\[0\] has 1 columns, expected M = 2"),
    ([[True, True], [True, True]], ValueError, r"mask has 2 rows, expected N = 1"),
    ([[False, False]], ValueError, r"mask\[0\] has no True entry: query row 0 sees no key"),
    ("TT", TypeError, r"mask must be a list of rows"),
]


@pytest.mark.parametrize("mask,exc,match", BAD_MASKS)
@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS)
def test_attention_validates_mask(fn, mask, exc, match):
    with pytest.raises(exc, match=match):
        fn(Q1, K1, V1, mask=mask)


@pytest.mark.parametrize(
    "scale,exc,match",
    [
        (0, ValueError, r"scale must be positive"),
        (-0.5, ValueError, r"scale must be positive"),
        (INF, ValueError, r"scale = inf is not allowed"),
        (math.nan, ValueError, r"scale = nan is not allowed"),
        ("0.5", TypeError, r"scale must be a real number"),
        (True, TypeError, r"scale must be a real number"),
    ],
)
@pytest.mark.parametrize(
    "fn", ATTENTION_FUNCTIONS + [lambda q, k, v, scale: A.scores(q, k, scale=scale)]
)
def test_scale_must_be_positive_finite(fn, scale, exc, match):
    with pytest.raises(exc, match=match):
        fn(Q1, K1, V1, scale=scale)


@pytest.mark.parametrize("name", ["block_q", "block_k"])
@pytest.mark.parametrize("value,exc", [(0, ValueError), (-2, ValueError), (1.5, TypeError)])
def test_flash_attention_block_sizes(name, value, exc):
    with pytest.raises(exc, match=name):
        A.flash_attention(Q1, K1, V1, **{name: value})


def test_tree_attention_shapes_must_match_the_tree():
    start, end = T.dfs_times([-1, 0])
    two = [[1.0], [2.0]]
    with pytest.raises(ValueError, match=r"q has 1 rows, expected N = 2"):
        A.tree_attention([[1.0]], two, two, start, end)
    with pytest.raises(ValueError, match=r"k has 3 rows, expected N = 2"):
        A.tree_attention(two, two + [[3.0]], two, start, end)
    with pytest.raises(ValueError, match=r"v has 1 rows, expected M = 2"):
        A.tree_attention(two, two, [[1.0]], start, end)


@pytest.mark.parametrize("fn", [A.softmax, A.online_softmax, A.online_softmax_stats])
@pytest.mark.parametrize(
    "row,exc,match",
    [
        ([], ValueError, r"row must not be empty"),
        ([1.0, math.nan], ValueError, r"row\[1\] = nan is not allowed"),
        ([1.0, INF], ValueError, r"row\[1\] = inf is not allowed"),
        ([False], TypeError, r"row\[0\] must be a real number"),
        ("12", TypeError, r"row must be a sequence of real numbers"),
    ],
)
def test_softmax_rows(fn, row, exc, match):
    with pytest.raises(exc, match=match):
        fn(row)


@pytest.mark.parametrize("fn", [A.softmax, A.online_softmax])
def test_softmax_of_all_minus_inf_is_refused(fn):
    with pytest.raises(ValueError, match=r"row is all -inf"):
        fn([-INF, -INF])


@pytest.mark.parametrize("fn", [A.online_softmax, A.online_softmax_stats])
@pytest.mark.parametrize("block,exc", [(0, ValueError), (-1, ValueError), (2.0, TypeError)])
def test_online_softmax_block(fn, block, exc):
    with pytest.raises(exc, match=r"block must be"):
        fn([1.0, 2.0], block)


@pytest.mark.parametrize(
    "outs,lses,exc,match",
    [
        ([[1.0], [2.0]], [-INF, -INF], ValueError, r"lses are all -inf"),
        ([[1.0]], [0.0, 1.0], ValueError, r"outs has 1 rows but lses has 2"),
        ([[1.0], [1.0, 2.0]], [0.0, 0.0], ValueError, r"outs\[1\] has 2 entries, expected dv"),
        ([[1.0], [math.nan]], [0.0, 0.0], ValueError, r"outs\[1\]\[0\] = nan is not allowed"),
        ([[1.0], [2.0]], [0.0, math.nan], ValueError, r"lses\[1\] = nan is not allowed"),
        ([[1.0], [2.0]], [0.0, INF], ValueError, r"lses\[1\] = inf is not allowed"),
        ([[1.0]], [], ValueError, r"lses must not be empty"),
        ([[1.0]], 0.0, TypeError, r"lses must be a sequence"),
        ([1.0], [0.0], TypeError, r"outs\[0\] must be a row"),
        ([["x"]], [0.0], TypeError, r"outs\[0\]\[0\] must be a real number"),
    ],
)
def test_merge_attention_validation(outs, lses, exc, match):
    with pytest.raises(exc, match=match):
        A.merge_attention(outs, lses)


def test_merge_ignores_the_output_of_a_partial_that_saw_no_key():
    assert A.merge_attention([[math.nan], [2.0]], [-INF, 0.5]) == ([2.0], 0.5)


# --------------------------------------------------------------------------- package hygiene

PACKAGE_DIR = Path(pyspec_ref.__file__).parent


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.glob("*.py")), ids=lambda p: p.name)
def test_pyspec_ref_imports_only_the_standard_library(path):
    allowed = set(sys.stdlib_module_names) | {"pyspec_ref", "__future__"}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            tops = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            tops = [node.module.split(".")[0]]
        else:
            continue  # relative imports stay inside the package
        for top in tops:
            assert top in allowed, f"{path.name}:{node.lineno} imports {top!r}"


SUBMODULES = [T, A] + [
    importlib.import_module(f"pyspec_ref.{name}")
    for name in ("deft", "sampling", "kvcache", "parallel_tree", "tree_shape")
]


def test_package_reexports_every_public_name():
    for module in SUBMODULES:
        for name in module.__all__:
            assert getattr(pyspec_ref, name) is getattr(module, name), name
    assert set(pyspec_ref.__all__) == set().union(*(module.__all__ for module in SUBMODULES))


CITATIONS = (
    "FlashSpecInfer",
    "SpecInfer",
    "FlashAttention",
    "Milakov",
    "Flash-Decoding",
    "DeFT",
    "Vaswani",
    "Leviathan",
    "Chen et al.",
    "EMS-SD",
    "SwiftSpec",
)


@pytest.mark.parametrize("name", sorted(pyspec_ref.__all__))
def test_public_functions_cite_a_paper_and_have_type_hints(name):
    fn = getattr(pyspec_ref, name)
    doc = inspect.getdoc(fn) or ""
    assert any(c in doc for c in CITATIONS), f"{name}'s docstring cites no paper"
    hints = inspect.get_annotations(fn)
    assert "return" in hints and set(inspect.signature(fn).parameters) <= set(hints), name
