"""course.measure.plots: every figure draws on random trees and chains, and refuses bad input by name."""

import matplotlib

matplotlib.use("Agg")  # before pyplot: the tests never open a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from course.measure import plots  # noqa: E402
from course.topics.attention import figures as attention_figures  # noqa: E402
from course.topics.trees import figures as tree_figures  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ----------------------------------------------------------------------------- helpers


def random_parents(n, seed=0):
    """Node i's parent uniform in [0, i): a topologically numbered random tree."""
    rng = np.random.default_rng(seed)
    return [-1] + [int(rng.integers(0, i)) for i in range(1, n)]


def chain_parents(n):
    return [-1] + list(range(n - 1))


def dfs_times(parents):
    """Preorder start/end times, children in increasing id (a test-side reference)."""
    n = len(parents)
    kids = [[] for _ in range(n)]
    for child, parent in enumerate(parents):
        if parent >= 0:
            kids[parent].append(child)
    start, end, clock = [0] * n, [0] * n, 0
    stack = [(parents.index(-1), False)]
    while stack:
        v, finished = stack.pop()
        if finished:
            end[v] = clock - 1
            continue
        start[v], clock = clock, clock + 1
        stack.append((v, True))
        stack.extend((c, False) for c in reversed(kids[v]))
    return np.array(start), np.array(end)


def tree_mask(parents):
    start, end = dfs_times(parents)
    return (start[None, :] <= start[:, None]) & (end[:, None] <= end[None, :])


TREES = {
    "random 12": random_parents(12, seed=1),
    "random 37": random_parents(37, seed=2),
    "chain 9": chain_parents(9),
    "single node": [-1],
}


def gid_artist(ax, gid):
    found = [a for a in ax.get_children() if a.get_gid() == gid]
    assert len(found) == 1, f"expected one artist with gid {gid!r}, found {len(found)}"
    return found[0]


def gid_artists(ax, gid):
    """Every artist tagged gid (barh tags each bar of the container)."""
    return [a for a in ax.get_children() if a.get_gid() == gid]


def legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize("name", TREES)
def test_tree_layout_is_tidy(name):
    parents = TREES[name]
    pos = tree_figures.tree_layout(parents)
    assert sorted(pos) == list(range(len(parents)))
    kids = {v: [c for c, p in enumerate(parents) if p == v] for v in range(len(parents))}
    leaves = [v for v in range(len(parents)) if not kids[v]]
    start, _ = dfs_times(parents)
    # Leaves sit at 0, 1, 2, ... in DFS order.
    by_dfs = sorted(leaves, key=lambda v: start[v])
    assert [pos[v][0] for v in by_dfs] == list(range(len(leaves)))
    for v, cs in kids.items():
        if parents[v] >= 0:
            assert pos[v][1] == pos[parents[v]][1] - 1  # one level below its parent
        if cs:
            assert pos[v][0] == pytest.approx((pos[cs[0]][0] + pos[cs[-1]][0]) / 2)


def test_tree_layout_handles_a_deep_chain_without_recursion():
    n = 5000
    pos = tree_figures.tree_layout(chain_parents(n))
    assert pos[n - 1] == (0.0, -(n - 1.0))


def test_tree_layout_accepts_numpy_and_torch():
    parents = random_parents(20, seed=3)
    expected = tree_figures.tree_layout(parents)
    assert tree_figures.tree_layout(np.array(parents)) == expected
    assert tree_figures.tree_layout(torch.tensor(parents, dtype=torch.int32)) == expected


@pytest.mark.parametrize("bad, message", [
    ([[-1, 0]], "parents must be 1-D"),
    ([], "parents must hold at least one node"),
    # Tree structure is checked by pyspec_ref.validate_parents, in its words.
    ([-1, 5], r"parents\[1\] = 5 is out of range"),
    ([-1, -1], "parents has 2 roots"),
    ([0, 1], r"parents\[0\] = 0: node 0 is its own parent"),  # and so no root
    ([-1, 2, 1], "parents has a cycle through node 1"),
    ([-1.0, 0.5], "parents must hold integers"),
])
def test_tree_layout_rejects_bad_parents(bad, message):
    with pytest.raises(ValueError, match=message):
        tree_figures.tree_layout(bad)


# ----------------------------------------------------------------------------- trees


@pytest.mark.parametrize("name", TREES)
def test_draw_tree_draws_n_nodes_and_n_minus_1_edges(name):
    parents = TREES[name]
    n = len(parents)
    start, end = dfs_times(parents)
    ax = tree_figures.draw_tree(parents, start, end, highlight=n - 1, title="t")
    assert isinstance(ax, Axes)
    nodes = gid_artist(ax, "nodes")
    edges = gid_artist(ax, "edges")
    assert isinstance(nodes, PathCollection) and len(nodes.get_offsets()) == n
    assert isinstance(edges, LineCollection) and len(edges.get_segments()) == n - 1


def test_draw_tree_labels_ids_and_times_on_small_trees_only():
    parents = random_parents(12, seed=4)
    start, end = dfs_times(parents)
    ax = tree_figures.draw_tree(parents, start, end)
    texts = {t.get_text() for t in ax.texts}
    assert {str(v) for v in range(12)} <= texts
    assert f"[{start[5]},{end[5]}]" in texts
    big = random_parents(200, seed=5)
    ax = tree_figures.draw_tree(big, *dfs_times(big))
    assert not ax.texts  # above ~40 nodes labels would be an unreadable smear
    assert len(gid_artist(ax, "nodes").get_offsets()) == 200


def test_draw_tree_accepts_torch_tensors_and_a_given_axes():
    parents = random_parents(15, seed=6)
    start, end = (torch.tensor(t) for t in dfs_times(parents))
    fig, ax = plt.subplots()
    out = tree_figures.draw_tree(torch.tensor(parents), start, end, ax=ax, highlight=torch.tensor(7))
    assert out is ax


def test_draw_tree_handles_a_long_chain():
    ax = tree_figures.draw_tree(chain_parents(3000))
    assert len(gid_artist(ax, "edges").get_segments()) == 2999


@pytest.mark.parametrize("kwargs, message", [
    ({"start": [0, 1], "end": [1, 1, 2]}, "start and end must have the same length"),
    ({"start": [0, 1], "end": [2, 1]}, "start and end must have one entry per node"),
    ({"start": [0, 1, 2]}, "start and end must be given together"),
    ({"highlight": 3}, "highlight must be in"),
    ({"highlight": "a"}, "highlight must be an int"),
])
def test_draw_tree_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tree_figures.draw_tree([-1, 0, 0], **kwargs)


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("name", TREES)
def test_draw_mask_returns_axes_and_outlines_the_row(name):
    mask = tree_mask(TREES[name])
    n = len(mask)
    ax = tree_figures.draw_mask(mask, title="m", highlight_row=n - 1)
    assert isinstance(ax, Axes)
    assert len(ax.images) == 1
    outline = gid_artist(ax, "highlight_row")
    assert outline.get_y() == pytest.approx(n - 1 - 0.5)
    assert ax.get_xlabel() == "key j" and ax.get_ylabel() == "query i"


def test_draw_mask_counts_wrong_entries_in_the_title():
    mask = tree_mask(random_parents(16, seed=7))
    student = mask.copy()
    student[3, 9] = ~student[3, 9]
    student[10, 2] = ~student[10, 2]
    ax = tree_figures.draw_mask(torch.from_numpy(student), wrong=student != mask)
    assert "2 wrong" in ax.get_title(loc="left")
    assert len(ax.images) == 2  # the mask, then the wrong-entry overlay
    ax = tree_figures.draw_mask(mask, wrong=np.zeros_like(mask))
    assert "all correct" in ax.get_title(loc="left")


@pytest.mark.parametrize("args, message", [
    ((np.ones(4, dtype=bool),), "mask must be 2-D"),
    ((np.ones((3, 4), dtype=bool),), "mask must be square"),
    ((np.full((3, 3), 0.5),), "mask must be boolean"),
])
def test_draw_mask_rejects_bad_masks(args, message):
    with pytest.raises(ValueError, match=message):
        tree_figures.draw_mask(*args)


def test_draw_mask_rejects_bad_wrong_and_row():
    mask = tree_mask(chain_parents(4))
    with pytest.raises(ValueError, match="wrong must have the mask's shape"):
        tree_figures.draw_mask(mask, wrong=np.zeros((3, 3), dtype=bool))
    with pytest.raises(ValueError, match="highlight_row must be in"):
        tree_figures.draw_mask(mask, highlight_row=4)


@pytest.mark.parametrize("name", TREES)
def test_tree_and_mask_is_one_figure_of_two_panels(name):
    parents = TREES[name]
    start, end = dfs_times(parents)
    fig = tree_figures.tree_and_mask(parents, start, end, tree_mask(parents), highlight=len(parents) - 1)
    assert isinstance(fig, Figure)
    tree_ax, mask_ax = fig.axes[:2]
    assert len(gid_artist(tree_ax, "nodes").get_offsets()) == len(parents)
    gid_artist(mask_ax, "highlight_row")


def test_tree_and_mask_rejects_a_mask_of_the_wrong_size():
    parents = random_parents(6, seed=8)
    with pytest.raises(ValueError, match="mask must be 6 x 6"):
        tree_figures.tree_and_mask(parents, *dfs_times(parents), tree_mask(parents)[:5, :5])


def test_tree_and_mask_preview_png():
    """Writes the preview used to eyeball the style (a 12-node random tree)."""
    parents = random_parents(12, seed=3)
    start, end = dfs_times(parents)
    fig = tree_figures.tree_and_mask(parents, start, end, tree_mask(parents), highlight=11)
    fig.savefig("/tmp/plots_preview.png", dpi=110)


# ----------------------------------------------------------------------------- times


@pytest.mark.parametrize("name", TREES)
def test_draw_times_draws_one_bar_per_node_sorted_by_start(name):
    start, end = dfs_times(TREES[name])
    n = len(start)
    ax = tree_figures.draw_times(start, end, highlight=n - 1)
    assert isinstance(ax, Axes)
    bars = gid_artists(ax, "intervals")
    assert len(bars) == n
    lefts = [bar.get_x() for bar in bars]
    assert lefts == sorted(lefts)


def test_draw_times_highlights_exactly_the_ancestors():
    parents = random_parents(14, seed=9)
    start, end = dfs_times(parents)
    q = 13
    ax = tree_figures.draw_times(start, end, highlight=q)
    lit = sum(bar.get_facecolor()[:3] == matplotlib.colors.to_rgb(plots.HIGHLIGHT)
              for bar in gid_artists(ax, "intervals"))
    assert lit == int(tree_mask(parents)[q].sum())


def test_draw_times_rejects_bad_times():
    with pytest.raises(ValueError, match="start and end must have the same length"):
        tree_figures.draw_times([0, 1], [1])
    with pytest.raises(ValueError, match="start must not exceed end"):
        tree_figures.draw_times([0, 2], [1, 1])
    with pytest.raises(ValueError, match="end must be 1-D"):
        tree_figures.draw_times([0, 1], [[1, 1]])


# ----------------------------------------------------------------------------- tiles


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("block_q, block_k", [(4, 4), (3, 5), (16, 16), (1, 1)])
def test_draw_tiles_counts_add_up(name, block_q, block_k):
    mask = tree_mask(TREES[name])
    n = len(mask)
    ax = attention_figures.draw_tiles(mask, block_q, block_k)
    assert isinstance(ax, Axes)
    tiles = -(-n // block_q) * -(-n // block_k)
    counts = [int(text.rsplit("(", 1)[1].rstrip(")")) for text in legend_texts(ax)]
    assert len(counts) == 3 and sum(counts) == tiles
    classes = attention_figures.classify_tiles(mask, block_q, block_k)
    assert counts == [int((classes == c).sum()) for c in range(3)]


@pytest.mark.parametrize("n, block", [(16, 4), (19, 4), (9, 3), (5, 8), (7, 1)])
def test_chain_skips_exactly_the_tiles_above_the_diagonal(n, block):
    mask = torch.from_numpy(tree_mask(chain_parents(n)))
    classes = attention_figures.classify_tiles(mask, block, block)
    t = -(-n // block)
    assert (classes == attention_figures.TILE_SKIP).sum() == t * (t - 1) // 2
    assert np.all(classes[np.triu_indices(t, 1)] == attention_figures.TILE_SKIP)
    legend = legend_texts(attention_figures.draw_tiles(mask, block, block))
    assert legend[0].endswith(f"({t * (t - 1) // 2})")


def test_draw_tiles_rejects_bad_blocks_and_masks():
    mask = tree_mask(chain_parents(8))
    with pytest.raises(ValueError, match="block_q must be a positive int"):
        attention_figures.draw_tiles(mask, 0, 4)
    with pytest.raises(ValueError, match="block_k must be a positive int"):
        attention_figures.draw_tiles(mask, 4, 2.5)
    with pytest.raises(ValueError, match="mask must be 2-D"):
        attention_figures.draw_tiles(mask[0], 4, 4)


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("bits, text", [
    (2**31, "2.0 Gbit"), (2**25, "32.0 Mbit"), (2**10, "1.0 Kbit"), (1536, "1.5 Kbit"),
    (100, "100 bit"), (0, "0 bit"), (2**20 - 1, "1.0 Mbit"), (3 * 2**40, "3.0 Tbit"),
])
def test_format_bits(bits, text):
    assert tree_figures.format_bits(bits) == text


def test_format_bits_rejects_negative():
    with pytest.raises(ValueError, match="bits must be"):
        tree_figures.format_bits(-1)


def test_memory_bars_labels_each_bar():
    rows = [("dense N=64k", 2**32), ("start/end", 2**22), ("tile bitmask", 2**25)]
    ax = tree_figures.memory_bars(rows, title="mask storage")
    assert isinstance(ax, Axes)
    assert ax.get_xscale() == "log"
    assert len(ax.patches) == 3
    texts = {t.get_text() for t in ax.texts}
    assert {"4.0 Gbit", "4.0 Mbit", "32.0 Mbit"} <= texts


@pytest.mark.parametrize("rows, message", [
    ([], "rows must be a non-empty list"),
    ([("a", 1, 2)], r"rows\[0\] must be a \(label, value\) pair"),
    ([("a", 0)], "rows must hold positive finite bit counts"),
])
def test_memory_bars_rejects_bad_rows(rows, message):
    with pytest.raises(ValueError, match=message):
        tree_figures.memory_bars(rows)


# ----------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("length, block", [(64, 16), (50, 7), (5, 8), (1, 1)])
def test_online_softmax_trace_ends_at_the_exact_values(length, block):
    row = np.random.default_rng(length).normal(size=length) * 3
    ax = attention_figures.online_softmax_trace(torch.from_numpy(row), block)
    assert isinstance(ax, Axes)
    assert gid_artist(ax, "running_max").get_ydata()[-1] == pytest.approx(row.max())
    right = [other for other in ax.figure.axes if other is not ax][0]  # the twin for l
    exact_l = np.exp(row - row.max()).sum()
    assert gid_artist(right, "running_sum").get_ydata()[-1] == pytest.approx(exact_l)


def test_online_softmax_trace_handles_hidden_leading_scores():
    row = np.r_[[-np.inf] * 9, np.arange(5.0)]
    attention_figures.online_softmax_trace(row, 4)


@pytest.mark.parametrize("row, block, message", [
    ([[1.0, 2.0]], 1, "row must be a non-empty 1-D"),
    ([], 1, "row must be a non-empty 1-D"),
    ([1.0, np.nan], 1, "row must not hold NaN"),
    ([-np.inf, -np.inf], 1, "row must hold at least one finite score"),
    ([1.0, 2.0], 0, "block must be a positive int"),
])
def test_online_softmax_trace_rejects_bad_input(row, block, message):
    with pytest.raises(ValueError, match=message):
        attention_figures.online_softmax_trace(row, block)


# ----------------------------------------------------------------------------- results


RESULTS = [
    {"name": "sdpa", "median_ms": 3.0},
    {"name": "tree flash", "median_ms": 0.25},
    {"name": "naive", "median_ms": 12.0},
]


def test_results_bar_shows_values_and_speedups():
    ax = plots.results_bar(RESULTS, baseline="sdpa", title="H100 80GB · 2025-11-23")
    assert isinstance(ax, Axes)
    assert len(gid_artists(ax, "results")) == 3
    texts = [t.get_text() for t in ax.texts]
    assert any("12.0× vs sdpa" in t for t in texts)
    assert any("0.25× vs sdpa" in t for t in texts)  # slower than the baseline
    assert any("(baseline)" in t for t in texts)
    assert "H100" in ax.get_title(loc="left")


def test_results_bar_without_baseline_and_with_other_keys():
    rows = [{"impl": "a", "mean_us": 5.0}, {"impl": "b", "mean_us": 7.5}]
    ax = plots.results_bar(rows, label_key="impl", value_key="mean_us")
    assert [t.get_text() for t in ax.texts] == ["5 µs", "7.5 µs"]


@pytest.mark.parametrize("rows, kwargs, message", [
    ([], {}, "rows must be a non-empty list of dicts"),
    ([{"name": "a"}], {}, "has no value_key 'median_ms'"),
    ([{"median_ms": 1.0}], {}, "has no label_key 'name'"),
    (RESULTS, {"baseline": "cublas"}, "baseline 'cublas' names no row"),
    ([{"name": "a", "median_ms": float("nan")}], {}, "rows must hold finite"),
])
def test_results_bar_rejects_bad_rows(rows, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plots.results_bar(rows, **kwargs)


def test_no_function_calls_show(monkeypatch):
    def refuse():
        raise AssertionError("plots must never call plt.show()")

    monkeypatch.setattr(plt, "show", refuse)
    parents = random_parents(10, seed=11)
    start, end = dfs_times(parents)
    mask = tree_mask(parents)
    tree_figures.draw_tree(parents, start, end)
    tree_figures.draw_mask(mask)
    tree_figures.tree_and_mask(parents, start, end, mask)
    tree_figures.draw_times(start, end)
    attention_figures.draw_tiles(mask, 4, 4)
    tree_figures.memory_bars([("x", 8)])
    attention_figures.online_softmax_trace([1.0, 2.0, 3.0], 2)
    plots.results_bar(RESULTS)


def _sweep_rows():
    sweep = ((64, 0.09, 900.0), (576, 0.03, 300.0), (4160, 0.12, 1100.0))  # block, time, model
    rows = [{"name": "deft_flatten_sweep", "workload": "w", "block_tokens": block, "median_ms": ms,
             "modelled_time": model} for block, ms, model in sweep]
    return rows + [{"name": "deft_flatten", "workload": "w", "block_tokens": 576, "median_ms": 0.031}]


def test_block_sweep_draws_the_clock_the_scaled_model_and_the_choice():
    from course.topics.deft import figures as deft_figures

    ax = deft_figures.block_sweep(_sweep_rows(), "w")
    measured, model, chosen = ax.get_lines()
    assert list(measured.get_ydata()) == pytest.approx([90.0, 30.0, 120.0])
    assert list(model.get_ydata()) == pytest.approx([90.0, 30.0, 110.0])  # scaled to meet at 576 tokens
    assert list(chosen.get_xdata()) == [576]
    plt.close(ax.figure)


def test_block_sweep_names_a_workload_without_rows():
    from course.topics.deft import figures as deft_figures

    with pytest.raises(ValueError, match="for workload 'other'"):
        deft_figures.block_sweep(_sweep_rows(), "other")
