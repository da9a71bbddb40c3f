"""pyspec_ref.deft: the KV tree's layout, DeFT's groupings and reduction, and the IO model."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyspec_ref
from pyspec_ref import deft as D
from pyspec_ref.trees import ancestors

FAST = settings(max_examples=40, deadline=None)


@st.composite
def kv_trees(draw, max_nodes: int = 12, max_len: int = 6, max_queries: int = 8):
    """(parents, lengths, query_nodes): a topologically numbered tree, lengths >= 1, any queries."""
    n = draw(st.integers(1, max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    lengths = [draw(st.integers(1, max_len)) for _ in range(n)]
    queries = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=max_queries))
    return parents, lengths, queries


def _ranges(parents, lengths):
    offsets = D.token_offsets(parents, lengths)
    return [range(o, o + n) for o, n in zip(offsets, lengths, strict=True)]


def _rand(rnd: random.Random, rows: int, cols: int) -> list[list[float]]:
    return [[rnd.uniform(-2.0, 2.0) for _ in range(cols)] for _ in range(rows)]


# --------------------------------------------------------------------------- layout


def test_token_offsets_by_hand():
    # Node 0 (4 tokens) has children 1 and 2; node 3 is a child of 1. Preorder 0, 1, 3, 2:
    # node 0 -> 0..3, node 1 -> 4..5, node 3 -> 6, node 2 -> 7..9.
    assert D.token_offsets([-1, 0, 0, 1], [4, 2, 3, 1]) == [0, 4, 7, 6]
    assert D.visible_tokens([-1, 0, 0, 1], [4, 2, 3, 1], [3, 2, 0]) == [
        [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 7, 8, 9], [0, 1, 2, 3]]


@FAST
@given(kv_trees())
def test_nodes_tile_the_tokens_in_preorder(tree):
    parents, lengths, _ = tree
    ranges = _ranges(parents, lengths)
    covered = sorted(t for r in ranges for t in r)
    assert covered == list(range(sum(lengths)))
    for v in range(1, len(parents)):  # a subtree is contiguous and starts at its root
        assert ranges[parents[v]].start < ranges[v].start


@FAST
@given(kv_trees())
def test_a_query_sees_its_root_path_and_its_own_token(tree):
    parents, lengths, queries = tree
    ranges = _ranges(parents, lengths)
    for node, seen in zip(queries, D.visible_tokens(parents, lengths, queries), strict=True):
        assert seen == sorted(t for v in ancestors(parents, node) for t in ranges[v])
        assert ranges[node][-1] in seen  # its own key and value: the node's last token


# --------------------------------------------------------------------------- groupings


@FAST
@given(kv_trees())
def test_node_groups_cover_each_query_s_tokens_exactly_once(tree):
    parents, lengths, queries = tree
    groups = D.node_groups(parents, lengths, queries)
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)
    for i, seen in enumerate(D.visible_tokens(parents, lengths, queries)):
        mine = [t for node, s, e, members in groups if i in members for t in range(s, e)]
        assert mine == seen  # each visible token once, in order; nothing else
    for _, _, _, members in groups:
        assert members and members == sorted(members)


@FAST
@given(kv_trees(), st.integers(1, 9), st.sampled_from([1, 3, 8, 64]))
def test_flatten_blocks_tile_the_tokens_and_the_bitmasks_match(tree, block, bits):
    parents, lengths, queries = tree
    total = sum(lengths)
    blocks = D.flatten_blocks(parents, lengths, queries, block, word_bits=bits)
    assert [(b["token_start"], b["token_end"]) for b in blocks] == [
        (s, min(s + block, total)) for s in range(0, total, block)]
    pieces = [(s, e) for b in blocks for _, s, e, _ in b["segments"]]
    assert [t for s, e in pieces for t in range(s, e)] == list(range(total))  # segments tile [0, T)
    ranges = _ranges(parents, lengths)
    visible = [set(seen) for seen in D.visible_tokens(parents, lengths, queries)]
    for b in blocks:
        tokens = set(range(b["token_start"], b["token_end"]))
        assert b["queries"] == [i for i in range(len(queries)) if visible[i] & tokens]
        for node, s, e, words in b["segments"]:
            assert ranges[node].start <= s < e <= ranges[node].stop  # a piece of one node
            assert len(words) == math.ceil(len(b["queries"]) / bits)
            assert all(0 <= w < 1 << bits for w in words)
            for j, i in enumerate(b["queries"]):
                bit = words[j // bits] >> (j % bits) & 1
                assert bool(bit) == (s in visible[i])  # the query sees the node, so all its tokens


def test_a_node_cut_by_a_block_boundary_gives_a_segment_in_each_block():
    blocks = D.flatten_blocks([-1, 0], [5, 6], [1], 4)
    assert [[seg[:3] for seg in b["segments"]] for b in blocks] == [
        [(0, 0, 4)], [(0, 4, 5), (1, 5, 8)], [(1, 8, 11)]]


def test_more_than_64_queries_in_a_block_take_two_words():
    # A 3-token prefix with 70 one-token children, one query at each child. Blocks of 64 tokens:
    # block 0 holds the prefix and children 1..61, and all 70 queries see the prefix.
    blocks = D.flatten_blocks([-1] + [0] * 70, [3] + [1] * 70, list(range(1, 71)), 64)
    first, second = blocks
    assert first["queries"] == list(range(70))
    assert first["segments"][0][3] == [2**64 - 1, 2**6 - 1]  # the prefix: every block query
    assert first["segments"][-1][:3] == (61, 63, 64) and first["segments"][-1][3] == [1 << 60, 0]
    assert second["queries"] == list(range(61, 70))  # children 62..70: block queries 0..8
    assert second["segments"][0][3] == [1]
    last = D.flatten_blocks([-1] + [0] * 70, [3] + [1] * 70, list(range(1, 71)), 128)[0]["segments"][-1]
    assert last[3] == [0, 1 << 5]  # child 70 is seen by query 69 only: word 1, bit 5


# --------------------------------------------------------------------------- phase 2


@FAST
@given(kv_trees(max_nodes=8, max_len=4, max_queries=5), st.integers(1, 7), st.integers(1, 3),
       st.integers(0, 2**32 - 1))
def test_reduced_partials_equal_the_definition(tree, block, d, seed):
    parents, lengths, queries = tree
    rnd = random.Random(seed)
    total = sum(lengths)
    q, k, v = _rand(rnd, len(queries), d), _rand(rnd, total, d), _rand(rnd, total, d)
    want_out, want_lse = D.tree_kv_attention(q, k, v, parents, lengths, queries)
    for groups, bits in ((D.node_groups(parents, lengths, queries), 64),
                         (D.flatten_blocks(parents, lengths, queries, block, word_bits=2), 2)):
        partials = D.group_partials(q, k, v, groups, word_bits=bits)
        for i, own in enumerate(partials):
            assert [g for g, _, _ in own] == sorted(g for g, _, _ in own)  # the merge order
            assert own, f"query {i} has no partial"
        out, lse = D.reduce_partials(partials)
        for a, b in zip(out, want_out, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-12
        assert max(abs(x - y) for x, y in zip(lse, want_lse, strict=True)) < 1e-12


def test_tree_kv_attention_is_attention_with_the_visibility_mask():
    parents, lengths, queries = [-1, 0, 0], [3, 2, 1], [1, 2]
    rnd = random.Random(3)
    q, k, v = _rand(rnd, 2, 4), _rand(rnd, 6, 4), _rand(rnd, 6, 4)
    mask = [[True] * 5 + [False], [True] * 3 + [False, False, True]]
    want = pyspec_ref.attention_with_lse(q, k, v, mask)
    assert D.tree_kv_attention(q, k, v, parents, lengths, queries) == want


# --------------------------------------------------------------------------- IO model


def test_io_bytes_by_hand():
    # Root of 4 tokens with children of 2 and 3 tokens; queries at the children. d = 1, one head,
    # 2-byte values: a token's KV is 2 * 1 * 1 * 2 = 4 bytes; a query or output row 2 bytes; a
    # partial (out + lse, float32) 8 bytes. Q = 2, so 2 * 2 = 4 bytes of output.
    args = ([-1, 0, 0], [4, 2, 3], [1, 2], 1, 1, 1, 2)
    io = {m: D.io_bytes(m, *args, block_tokens=4, word_bits=8) for m in D.IO_METHODS}
    # Sequence: the queries see 6 and 7 tokens: (6 + 7) * 4 = 52; queries 2 * 2 read + 4 written.
    assert io["sequence"] == {"kv": 52, "queries": 8, "masks": 0, "partials": 0, "total": 60}
    # Dense mask: one query block reads all 9 tokens (36) and a 2 x 9 byte mask.
    assert io["dense_mask"] == {"kv": 36, "queries": 8, "masks": 18, "partials": 0, "total": 62}
    # DeFT-Node: groups {node 0: q0, q1}, {node 1: q0}, {node 2: q1}: 4 members. KV 9 * 4; queries
    # 4 * 2 + 4; ids 4 * 4 bytes; partials 2 * 4 * 8.
    assert io["deft_node"] == {"kv": 36, "queries": 12, "masks": 16, "partials": 64, "total": 128}
    # DeFT-Flatten, blocks of 4 tokens: [0,4) {q0,q1}, [4,8) {q0,q1} (node 1, node 2's first
    # token), [8,9) {q1}: 5 members. Words: 1 + 2 + 1 segments, one 1-byte word each = 4;
    # ids 5 * 4 = 20; token -> segment 9 * 4 = 36. Partials 2 * 5 * 8 = 80.
    assert io["deft_flatten"] == {"kv": 36, "queries": 14, "masks": 60, "partials": 80, "total": 190}
    assert io["read_once"] == {"kv": 36, "queries": 8, "masks": 0, "partials": 0, "total": 44}


def test_io_bytes_orders_the_methods_on_a_shared_prefix():
    # Few-shot prompting: a 4096-token prompt and 20 branches of 64 generated tokens, Llama-3-8B
    # attention (32 query heads, 8 KV heads, d = 128, fp16): 2 * 8 * 128 * 2 = 4096 bytes per token.
    parents, lengths = [-1] + [0] * 20, [4096] + [64] * 20
    queries = list(range(1, 21))
    io = {m: D.io_bytes(m, parents, lengths, queries, 128, 8, 32, 2, block_tokens=256) for m in D.IO_METHODS}
    total = {m: io[m]["total"] for m in D.IO_METHODS}
    assert io["read_once"]["kv"] == io["deft_node"]["kv"] == io["deft_flatten"]["kv"] == 5376 * 4096
    assert io["sequence"]["kv"] == 20 * (4096 + 64) * 4096  # the prompt re-read by every branch
    assert io["dense_mask"]["kv"] == 5376 * 4096  # 20 queries: one query block reads the tree once
    assert total["read_once"] < total["deft_node"] < total["deft_flatten"] < total["sequence"]
    # Flatten's partials shrink with longer blocks: one per (block, query) pair.
    longer = D.io_bytes("deft_flatten", parents, lengths, queries, 128, 8, 32, 2, block_tokens=1024)
    assert longer["partials"] < io["deft_flatten"]["partials"]


def test_io_bytes_speculative_tree():
    # A 4096-token prefix and a token tree of 256 one-token nodes (a chain here, for a hand count).
    parents, lengths = [-1] + list(range(256)), [4096] + [1] * 256
    queries = list(range(1, 257))
    io = {m: D.io_bytes(m, parents, lengths, queries, 128, 8, 32, 2, block_tokens=1024) for m in D.IO_METHODS}
    token = 4096  # bytes of KV per token
    assert io["read_once"]["kv"] == 4352 * token
    assert io["dense_mask"]["kv"] == 4 * 4352 * token  # 256 queries = 4 query blocks of 64
    assert io["sequence"]["kv"] == sum(4096 + j for j in range(1, 257)) * token
    assert io["deft_flatten"]["total"] < io["dense_mask"]["total"] < io["sequence"]["total"]


def test_io_bytes_without_sharing_sequence_equals_read_once():
    io = {m: D.io_bytes(m, [-1], [100], [0], 64, 2, 4, 2) for m in ("sequence", "read_once")}
    assert io["sequence"] == io["read_once"]


# --------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("call, kind, message", [
    (lambda: D.token_offsets([-1, 0], [3]), ValueError, "lengths has 1 entries"),
    (lambda: D.token_offsets([-1, 0], [3, 0]), ValueError, r"lengths\[1\] = 0"),
    (lambda: D.token_offsets([-1, 1], [3, 1]), ValueError, r"parents\[1\]"),
    (lambda: D.token_offsets([1, -1], [3, 1]), ValueError, "root must be node 0"),
    (lambda: D.token_offsets([-1], [2.0]), TypeError, r"lengths\[0\]"),
    (lambda: D.visible_tokens([-1, 0], [1, 1], [2]), ValueError, r"query_nodes\[0\] = 2"),
    (lambda: D.visible_tokens([-1, 0], [1, 1], []), ValueError, "query_nodes must not be empty"),
    (lambda: D.flatten_blocks([-1], [4], [0], 0), ValueError, "block_tokens"),
    (lambda: D.flatten_blocks([-1], [4], [0], 2, word_bits=0), ValueError, "word_bits"),
    (lambda: D.tree_kv_attention([[1.0]], [[1.0]], [[1.0]], [-1], [2], [0]), ValueError, "k has 1 rows"),
    (lambda: D.tree_kv_attention([[1.0], [2.0]], [[1.0]], [[1.0]], [-1], [1], [0]), ValueError,
     "q has 2 rows"),
    (lambda: D.reduce_partials([[]]), ValueError, r"partials\[0\] is empty"),
    (lambda: D.io_bytes("flash", [-1], [1], [0], 4, 1, 1, 2), ValueError, "method must be one of"),
    (lambda: D.io_bytes("sequence", [-1], [1], [0], 4, 2, 3, 2), ValueError, "heads_q = 3"),
    (lambda: D.io_bytes("sequence", [-1], [1], [0], 0, 1, 1, 2), ValueError, "d must be a positive int"),
    (lambda: D.io_bytes("deft_flatten", [-1], [1], [0], 4, 1, 1, 2, word_bits=12), ValueError, "word_bits"),
])
def test_bad_arguments_are_named(call, kind, message):
    with pytest.raises(kind, match=message):
        call()


def test_exported_from_the_package():
    for name in D.__all__:
        assert getattr(pyspec_ref, name) is getattr(D, name)
