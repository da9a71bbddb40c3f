"""Fuzzing every public function of pyspec_ref with malformed arguments (hypothesis, seeded).

Each function gets one valid call (TABLE) and, for each argument, its kind. Hypothesis picks an
argument and a corruption that its kind makes malformed (a cycle or two roots in a parent array, a
parent after its child where the numbering must be topological, NaN or inf in a real row, a bool or
a float where an int belongs, a probability row that is negative or does not sum to 1, a uniform
outside [0, 1), a path that is not a path, a non-sequence, ...). The property: a ValueError or
TypeError whose message names the corrupted argument, and the arguments are left as they were.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyspec_ref
from pyspec_ref import deft as D
from pyspec_ref import kvcache as K
from pyspec_ref import sampling as S
from pyspec_ref import trees as T

A = importlib.import_module("pyspec_ref.attention")  # the package's `attention` is the function

NAN, INF = math.nan, math.inf

P = [-1, 0, 0, 1, 1, 2]  # a 6-node tree, numbered parent-before-child
START, END = T.dfs_times(P)
Q2 = [[0.5, -1.0], [1.0, 0.25]]
K3 = [[0.5, -1.0], [1.5, 0.25], [-0.5, 2.0]]
V3 = [[1.0], [-2.0], [0.5]]
QN = [[0.1 * i, -0.2 * i] for i in range(6)]  # one query per node of P
PROBS = [0.25, 0.25, 0.5, 0.0]
PROBS2 = [0.5, 0.125, 0.125, 0.25]
LOGP = {5: math.log(0.6), 7: math.log(0.4)}


def _logprobs_of(path):
    return LOGP


# (function, positional arguments, {argument: kind}); kinds are listed in `corruptions`.
TABLE = [
    (T.ancestors, (P, 4), {"parents": "tree", "node": "index"}),
    (T.bfs_order, (P,), {"parents": "tree"}),
    (T.bitmask_from_mask, (T.tree_mask(P), 64), {"mask": "bool_matrix", "word_bits": "positive"}),
    (T.causal_mask, (4,), {"n": "positive"}),
    (T.chain_parents, (4,), {"n": "positive"}),
    (T.children, (P,), {"parents": "tree"}),
    (T.dense_mask_bits, (6, 2), {"n": "positive", "batch": "positive"}),
    (T.depths, (P,), {"parents": "tree"}),
    (T.dfs_order, (P,), {"parents": "tree"}),
    (T.dfs_times, (P,), {"parents": "tree"}),
    (T.interval_mask_bits, (6, 2, 32), {"n": "positive", "batch": "positive", "bits_per_time": "positive"}),
    (
        T.mask_from_bitmask,
        (T.tree_bitmask(P, 8), 6, 8),
        {"words": "int_matrix", "n_keys": "positive", "word_bits": "positive"},
    ),
    (T.parents_from_times, (START, END), {"start": "times", "end": "times"}),
    (T.relabel, (P, [0, 2, 1, 5, 3, 4]), {"parents": "tree", "order": "permutation"}),
    (T.root, (P,), {"parents": "tree"}),
    (T.sees, (START, END, 3, 1), {"start": "times", "end": "times", "query": "index", "key": "index"}),
    (T.tile_mask, (START, END, 2), {"start": "times", "end": "times", "tile": "positive"}),
    (T.tree_bitmask, (P, 64), {"parents": "tree", "word_bits": "positive"}),
    (T.tree_mask, (P,), {"parents": "tree"}),
    (T.tree_mask_from_times, (START, END), {"start": "times", "end": "times"}),
    (T.validate_parents, (P,), {"parents": "tree"}),
    (T.validate_times, (START, END), {"start": "times", "end": "times"}),
    (T.validate_topological, (P,), {"parents": "topo_tree"}),
    (A.attention, (Q2, K3, V3), {"q": "matrix", "k": "matrix", "v": "matrix"}),
    (
        A.attention_with_lse,
        (Q2, K3, V3, [[True, False, True], [True, True, False]], 0.5),
        {"q": "matrix", "k": "matrix", "v": "matrix", "mask": "bool_matrix", "scale": "positive_real"},
    ),
    (
        A.flash_attention,
        (Q2, K3, V3, None, None, 1, 2),
        {"q": "matrix", "k": "matrix", "v": "matrix", "block_q": "positive", "block_k": "positive"},
    ),
    (A.merge_attention, ([[1.0, 2.0], [0.5, 0.5]], [0.3, -1.2]), {"outs": "matrix", "lses": "reals"}),
    (A.online_softmax, ([1.0, 2.0, -3.0], 2), {"row": "reals", "block": "positive"}),
    (A.online_softmax_stats, ([1.0, 2.0, -3.0], 2), {"row": "reals", "block": "positive"}),
    (A.scores, (Q2, K3, 0.5), {"q": "matrix", "k": "matrix", "scale": "positive_real"}),
    (A.softmax, ([1.0, 2.0, -3.0],), {"row": "reals"}),
    (
        A.tree_attention,
        (QN, QN, QN, START, END),
        {"q": "matrix", "k": "matrix", "v": "matrix", "start": "times", "end": "times"},
    ),
    (
        D.flatten_blocks,
        (P, [3, 1, 2, 1, 1, 2], [3, 4, 5], 4, 8),
        {
            "parents": "topo_tree",
            "lengths": "positive_ints",
            "query_nodes": "node_list",
            "block_tokens": "positive",
            "word_bits": "positive",
        },
    ),
    (
        D.group_partials,
        (
            QN[:3],
            [[0.1 * t, 0.2] for t in range(10)],
            [[0.3, -0.1 * t] for t in range(10)],
            D.node_groups(P, [3, 1, 2, 1, 1, 2], [3, 4, 5]),
        ),
        {"q": "matrix", "k": "matrix", "v": "matrix", "groups": "groups"},
    ),
    (
        D.reduce_partials,
        (
            D.group_partials(
                QN[:3],
                [[0.1 * t, 0.2] for t in range(10)],
                [[0.3, -0.1 * t] for t in range(10)],
                D.node_groups(P, [3, 1, 2, 1, 1, 2], [3, 4, 5]),
            ),
        ),
        {"partials": "partials"},
    ),
    (
        D.io_bytes,
        ("deft_flatten", P, [3, 1, 2, 1, 1, 2], [3, 4, 5], 16, 2, 4, 2, 4, 16, 8),
        {
            "parents": "topo_tree",
            "lengths": "positive_ints",
            "query_nodes": "node_list",
            "d": "positive",
            "heads_kv": "positive",
            "block_tokens": "positive",
            "word_bits": "positive",
        },
    ),
    (
        D.node_groups,
        (P, [3, 1, 2, 1, 1, 2], [3, 4, 5]),
        {"parents": "topo_tree", "lengths": "positive_ints", "query_nodes": "node_list"},
    ),
    (D.token_offsets, (P, [3, 1, 2, 1, 1, 2]), {"parents": "topo_tree", "lengths": "positive_ints"}),
    (
        D.tree_kv_attention,
        (
            [[0.5, 1.0]] * 2,
            [[0.1 * t, 0.2] for t in range(10)],
            [[0.3, -0.1 * t] for t in range(10)],
            P,
            [3, 1, 2, 1, 1, 2],
            [3, 5],
        ),
        {
            "q": "matrix",
            "k": "matrix",
            "v": "matrix",
            "parents": "topo_tree",
            "lengths": "positive_ints",
            "query_nodes": "node_list",
        },
    ),
    (
        D.validate_kv_tree,
        (P, [3, 1, 2, 1, 1, 2], [3, 4, 5]),
        {"parents": "topo_tree", "lengths": "positive_ints", "query_nodes": "node_list"},
    ),
    (
        D.visible_tokens,
        (P, [3, 1, 2, 1, 1, 2], [3, 4, 5]),
        {"parents": "topo_tree", "lengths": "positive_ints", "query_nodes": "node_list"},
    ),
    (
        K.advance_kv_lengths,
        ([0, 10], [4, 3], [2, 3], [1, 2], [10, 10]),
        {
            "kv_starts": "nonneg_ints",
            "kv_lengths": "nonneg_ints",
            "counts": "nonneg_ints",
            "accepted": "nonneg_ints",
            "capacities": "nonneg_ints",
        },
    ),
    (
        K.best_subtree,
        (P, [0.0, -0.5, -0.7, -1.0, -2.0, -1.5], 3),
        {"parents": "tree", "cumulative_logprob": "reals", "size": "positive"},
    ),
    (K.compact_plan, (4, P, [0, 1, 4]), {"prefix_len": "nonneg", "parents": "tree", "verified_path": "path"}),
    (K.concatenate_inputs, ([[1, 2], [3]],), {"tokens_per_sample": "int_matrix"}),
    (K.expand_tree, (_logprobs_of, 3, 2, 2), {"root_token": "nonneg", "w": "positive", "steps": "positive"}),
    (
        K.nonsquare_tree_attention,
        (
            [[0.5, 1.0]] * 2,
            [[0.1 * t, 0.2] for t in range(8)],
            [[0.3, -0.1 * t] for t in range(8)],
            START,
            END,
            [3, 4],
            2,
        ),
        {
            "q": "matrix",
            "k_cache": "matrix",
            "v_cache": "matrix",
            "start": "times",
            "end": "times",
            "query_nodes": "node_list",
            "prefix_len": "nonneg",
        },
    ),
    (
        K.nonsquare_tree_mask,
        (START, END, [3, 4], 2),
        {"start": "times", "end": "times", "query_nodes": "node_list", "prefix_len": "nonneg"},
    ),
    (K.padded_layout, ([2, 3], [4, 5]), {"counts": "nonneg_ints", "kv_lengths": "nonneg_ints"}),
    (K.reroot, (P, [0, 1, 4]), {"parents": "tree", "verified_path": "path"}),
    (K.restore_index_scan, ([2, 3], 3), {"counts": "nonneg_ints", "token": "nonneg"}),
    (K.restore_indices, ([2, 3],), {"counts": "nonneg_ints"}),
    (
        K.unpadded_attention,
        (
            [[0.5, 1.0]] * 3,
            [[0.1 * t, 0.2] for t in range(12)],
            [[0.3, -0.1 * t] for t in range(12)],
            [2, 1],
            [0, 6],
            [2, 3],
        ),
        {
            "q_flat": "matrix",
            "k_cache": "matrix",
            "v_cache": "matrix",
            "counts": "nonneg_ints",
            "kv_starts": "nonneg_ints",
            "kv_lengths": "nonneg_ints",
        },
    ),
    (K.unpadded_layout, ([2, 3], [4, 5]), {"counts": "nonneg_ints", "kv_lengths": "nonneg_ints"}),
    (
        K.vanilla_kv_growth,
        ([[1, 2], [0, 3]], [4, 5]),
        {"accepted_steps": "int_matrix", "kv_lengths": "nonneg_ints"},
    ),
    (
        S.greedy_tree_verification,
        (P, [7, 1, 2, 3, 1, 2], [1, 3, 9, 0, 0, 0]),
        {"parents": "topo_tree", "tokens": "nonneg_ints", "target_argmax": "nonneg_ints"},
    ),
    (
        S.speculative_sampling,
        ([2], [PROBS], [PROBS2, PROBS], [0.5], [0.25, 0.75]),
        {
            "draft_tokens": "tokens",
            "q": "prob_matrix",
            "p": "prob_matrix",
            "accept_uniforms": "uniforms",
            "sample_uniforms": "uniforms",
        },
    ),
    (
        S.speculative_sampling_batch,
        ([[2]], [[PROBS]], [[PROBS2, PROBS]], [[0.5]], [[0.25, 0.75]]),
        {
            "draft_tokens": "batch",
            "q": "batch",
            "p": "batch",
            "accept_uniforms": "batch",
            "sample_uniforms": "batch",
        },
    ),
    (
        S.tree_speculative_sampling,
        (P, [0, 1, 2, 3, 0, 1], [PROBS] * 6, [PROBS2] * 6, [0.0] + [0.5] * 5, [0.25] * 6),
        {
            "parents": "topo_tree",
            "tokens": "tokens",
            "q": "prob_matrix",
            "p": "prob_matrix",
            "accept_uniforms": "uniforms_from1",
            "sample_uniforms": "uniforms",
        },
    ),
    (S.sibling_distributions, (PROBS2, PROBS, [1, 2]), {"p": "probs", "q": "probs", "tokens": "tokens"}),
    (
        S.sample_without_replacement,
        (PROBS, 2, [0.25, 0.75]),
        {"q": "probs", "k": "nonneg", "uniforms": "uniforms"},
    ),
    (S.gumbel_top_k, (PROBS, 2, [0.5] * len(PROBS)), {"q": "probs", "k": "nonneg", "uniforms": "uniforms"}),
    (S.validate_distribution, (PROBS, "p"), {"p": "probs"}),
    (S.residual, (PROBS2, PROBS), {"p": "probs", "q": "probs"}),
    (S.inverse_cdf, (PROBS, 0.5), {"weights": "weights", "u": "uniform"}),
]
# Not fuzzed: S.accepts(r, p_x, q_x) is the bare comparison on numbers that its callers checked;
# K.apply_moves / apply_moves_in_order take an opaque cache list (fuzzed below with bad moves).

NOT_SEQUENCES = [None, "0", 3, {0: 1}, {1, 2}]
OPTIONAL = {"mask", "query_nodes", "scale"}  # None is their documented default


def _set(container, index, value):
    out = copy.deepcopy(container)
    out[index] = value
    return out


def corruptions(kind: str, value, draw) -> list:
    """Malformed variants of a valid argument of this kind (each must be refused)."""
    n = len(value) if isinstance(value, list) else 0
    i = draw(st.integers(0, max(0, n - 1))) if n else 0
    if kind in ("tree", "topo_tree"):
        bad = [
            _set(value, 0, 0),  # no root (node 0 points at itself)
            _set(value, i if i else 1, -1),  # two roots
            _set(value, i if i else 1, n + draw(st.integers(0, 5))),  # out of range
            _set(value, i if i else 1, -2 - draw(st.integers(0, 5))),
            _set(_set(value, 1, 3), 3, 1),  # a cycle 1 -> 3 -> 1
            _set(value, i if i else 1, 1.0),
            _set(value, i if i else 1, True),
            [],
        ]
        if kind == "topo_tree":
            bad.append([-1, 2, 0] + [0] * (n - 3))  # node 1's parent comes after it
        return bad + NOT_SEQUENCES
    if kind == "times":
        return [
            _set(value, i, n + 3),
            _set(value, i, -1),
            _set(value, i, 0.5),
            _set(value, i, None),
            value[:-1],
            [],
        ] + NOT_SEQUENCES
    if kind in ("index", "nonneg", "positive"):
        bad = [1.5, True, None, "1", -1, NAN]
        if kind == "positive":
            bad.append(0)
        if kind == "index":
            bad.append(10**6)
        return bad
    if kind in ("nonneg_ints", "positive_ints", "tokens", "node_list"):
        bad = [_set(value, i, -1), _set(value, i, 1.5), _set(value, i, True), _set(value, i, "1")]
        if kind == "positive_ints":
            bad.append(_set(value, i, 0))
        if kind == "node_list":
            bad.append(_set(value, i, 10**6))
        if kind == "tokens":
            bad.append(_set(value, i, 10**6))
        return bad + NOT_SEQUENCES
    if kind == "permutation":
        return [_set(value, i, value[(i + 1) % n]), _set(value, i, n), value[:-1]] + NOT_SEQUENCES
    if kind == "path":
        return [[1] + value[1:], [0, 4], [0, 1, 1], [0, 99], [], [0, 1.0]] + NOT_SEQUENCES
    if kind == "reals":
        # (-inf is a legitimate masked score or the LSE of an empty part: not a corruption)
        return [
            _set(value, i, NAN),
            _set(value, i, INF),
            _set(value, i, "1.0"),
            _set(value, i, None),
        ] + NOT_SEQUENCES
    if kind == "positive_real":
        return [0.0, -1.0, NAN, INF, "0.5", True]
    if kind in ("matrix", "int_matrix", "bool_matrix"):
        j = draw(st.integers(0, max(0, len(value[i]) - 1)))
        bad_entry = {
            "matrix": draw(st.sampled_from([NAN, INF, "x", None])),
            "int_matrix": draw(st.sampled_from([1.5, "x", None, True])),
            "bool_matrix": draw(st.sampled_from([1, None, "x", 1.0])),
        }[kind]
        ragged = copy.deepcopy(value)
        ragged[i] = ragged[i] + ragged[i][:1] if kind != "int_matrix" else ragged[i] + ["x"]
        empty = [[]] if kind != "int_matrix" else []  # a sample with no tokens may be legitimate
        return (
            [_set(value, i, _set(value[i], j, bad_entry)), ragged, _set(value, i, None)]
            + empty
            + NOT_SEQUENCES
        )
    if kind in ("probs", "prob_matrix", "weights"):
        row = value[i] if kind == "prob_matrix" else value
        k = draw(st.integers(0, len(row) - 1))
        rows = [_set(row, k, -0.25), [x * 1.5 for x in row], _set(row, k, NAN), _set(row, k, INF)]
        if kind == "weights":
            rows = [_set(row, k, -0.25), _set(row, k, NAN), _set(row, k, INF), [0.0] * len(row)]
        if kind == "prob_matrix":
            rows = [_set(value, i, r) for r in rows] + [value[:-1]]
        return rows + NOT_SEQUENCES
    if kind in ("uniforms", "uniform", "uniforms_from1"):
        if kind == "uniform":
            return [1.0, -0.1, NAN, INF, "0.5", None]
        if kind == "uniforms_from1":  # entry 0 is unused (the root is not tested)
            i = max(i, 1)
        return [_set(value, i, u) for u in (1.0, -0.1, NAN, INF)] + [value[:-1]] + NOT_SEQUENCES
    if kind == "groups":  # (node, start, end, queries) per group
        node, start, end, queries = value[i]
        return [
            _set(value, i, (node, start, end + 99, queries)),
            _set(value, i, (node, end, start, queries)),
            _set(value, i, (node, start, end, [99])),
            _set(value, i, (node, start, end)),
            _set(value, i, None),
        ] + NOT_SEQUENCES
    if kind == "partials":  # per query: [(group, out, lse), ...]
        group, out, lse = value[i][0]
        return [
            _set(value, i, [(group, [NAN] * len(out), lse)]),
            _set(value, i, [(group, out, NAN)]),
            _set(value, i, [(group, out + [1.0], lse)]),
            _set(value, i, []),
            _set(value, i, None),
            _set(value, i, [(group, out)]),
        ] + NOT_SEQUENCES
    if kind == "batch":
        return [value + value[:1], []] + NOT_SEQUENCES
    raise AssertionError(f"unknown kind {kind}")


def _alias(name: str) -> tuple[str, ...]:
    """Names a message may use for the argument `name`."""
    return (name,)


CASES = [(fn, args, name, kind) for fn, args, kinds in TABLE for name, kind in kinds.items()]


def _positional(fn, name: str) -> int:
    return list(inspect.signature(fn).parameters).index(name)


@pytest.mark.parametrize(
    ("fn", "args", "name", "kind"),
    CASES,
    ids=[f"{fn.__module__.split('.')[-1]}.{fn.__name__}:{name}" for fn, _, name, _ in CASES],
)
@settings(settings.get_profile("fuzz"), max_examples=min(settings.get_profile("fuzz").max_examples, 8))
@given(data=st.data())
def test_malformed_argument_is_refused_by_name(fn, args, name, kind, data):
    fn(*copy.deepcopy(args))  # the valid call works
    position = _positional(fn, name)
    options = corruptions(kind, args[position], data.draw)
    if name in OPTIONAL:
        options = [x for x in options if x is not None]
    bad = data.draw(st.sampled_from(options), label=f"{name}")
    call = list(copy.deepcopy(args))
    call[position] = bad
    before = repr(call)
    with pytest.raises((ValueError, TypeError)) as raised:
        fn(*call)
    message = str(raised.value)
    if kind != "batch":  # a batch row is refused by the per-sample call, which names its own argument
        assert any(alias in message for alias in _alias(name)), (
            f"{fn.__name__}: {message!r} does not name {name}"
        )
    assert repr(call) == before, f"{fn.__name__} changed its arguments"


@settings(settings.get_profile("fuzz"))
@given(moves=st.lists(st.tuples(st.integers(-3, 12), st.integers(-3, 12)), min_size=1, max_size=4))
def test_moves_out_of_range_or_colliding_are_refused(moves):
    cache = list(range(8))
    sources = [s for s, _ in moves]
    destinations = [d for _, d in moves]
    valid = (
        all(0 <= s < 8 and 0 <= d < 8 for s, d in moves)
        and len(set(destinations)) == len(destinations)
        and not set(sources) & set(destinations) - {s for s, d in moves if s == d}
    )
    for fn in (K.apply_moves, K.apply_moves_in_order):
        if not all(0 <= s < 8 and 0 <= d < 8 for s, d in moves):
            with pytest.raises(ValueError, match="moves"):
                fn(cache, moves)
        elif not valid:
            try:
                fn(cache, moves)
            except ValueError as error:
                assert "moves" in str(error)
        assert cache == list(range(8))


def test_every_public_function_is_fuzzed():
    fuzzed = {fn for fn, _, _ in TABLE} | {K.apply_moves, K.apply_moves_in_order, S.accepts}
    public = {
        getattr(module, name)
        for module in (T, A, D, K, S)
        for name in module.__all__
        if callable(getattr(module, name)) and not isinstance(getattr(module, name), type)
    }
    assert public - fuzzed == set(), sorted(f.__name__ for f in public - fuzzed)
    assert pyspec_ref.__all__  # the package re-exports them
