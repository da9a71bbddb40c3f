"""Figures of notebook 01 (token trees): a tree and its DFS times, the dense tree mask, the
intervals, the bits each encoding stores, and the measured mask kernels against the torch
reference (`python -m course figures trees` writes trees.png beside trees.json). Later topics draw
their trees with `draw_tree` and their masks with `draw_mask`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

import pyspec_ref
from course.measure.plots import (
    BLUE,
    GREEN,
    GREY,
    HIDDEN,
    HIGHLIGHT,
    INK,
    LABEL_LIMIT,
    NODE,
    ORANGE,
    SKY,
    VERMILLION,
    VISIBLE,
    WRONG,
    as_index,
    as_mask,
    as_parents,
    as_times,
    cell_grid,
    format_bytes,
    index_ticks,
    legend_below,
    new_ax,
    results_bar,
    style_ax,
    to_numpy,
)

# ----------------------------------------------------------------------------- trees


def _preorder(parents: np.ndarray):
    """Nodes in preorder, children lists and depths, from the specification's tree functions."""
    as_list = parents.tolist()
    return pyspec_ref.dfs_order(as_list), pyspec_ref.children(as_list), pyspec_ref.depths(as_list)


def tree_layout(parents) -> dict[int, tuple[float, float]]:
    """Positions {node: (x, y)}: y = -depth, leaves 0, 1, 2, ... in DFS order, parents centred.

    A parent sits halfway between its first and last child, so nodes of one level keep
    at least one unit apart and edges never cross.
    """
    p = as_parents(parents)
    order, kids, depth = _preorder(p)
    x = np.zeros(len(p))
    next_leaf = 0
    for v in order:  # preorder meets leaves left to right
        if not kids[v]:
            x[v] = next_leaf
            next_leaf += 1
    for v in reversed(order):  # children before parents
        if kids[v]:
            x[v] = (x[kids[v][0]] + x[kids[v][-1]]) / 2
    return {v: (float(x[v]), float(-depth[v])) for v in range(len(p))}


def _tree_sizes(ax, n: int, width: float, height: float, has_times: bool) -> dict:
    """Marker diameter and label font sizes (points) that fit the axes at hand.

    Sizes are worked out from the space one layout unit gets on this axes, so a tree
    squeezed into a small subplot shrinks instead of overlapping; when even that would
    be unreadable (or above LABEL_LIMIT nodes), labels are dropped.
    """
    box = ax.get_window_extent()
    to_pt = 72.0 / ax.figure.dpi
    unit_x = box.width * to_pt / (width + 0.4)
    unit_y = box.height * to_pt / (height + 0.5)
    # A level holds a node plus, with times, a line of text under it.
    diameter = min(24.0, 0.8 * unit_x, (0.55 if has_times else 0.75) * unit_y)
    ids = min(9.5, 0.42 * diameter) if n <= LABEL_LIMIT and diameter >= 12 else 0.0
    # "[12,15]" is about 4.3 font sizes wide; it must fit in one unit of x.
    times = min(8.0, unit_x / 4.6) if ids and has_times else 0.0
    if times and times < 5.5:
        times = 0.0
    if not ids:
        diameter = max(2.5, min(diameter, 10.0))
    return {"diameter": diameter, "ids": ids, "times": times}


def draw_tree(parents, start=None, end=None, ax=None, highlight=None, title=None):
    """The tree, root on top; ids in the nodes, "[start,end]" under them; `highlight`'s path lit.

    Markers and fonts are sized to the axes; labels are dropped above 40 nodes or
    when they would not fit. The node markers are one scatter (gid "nodes")
    and the edges one LineCollection (gid "edges").
    """
    p = as_parents(parents)
    n = len(p)
    if (start is None) != (end is None):
        raise ValueError("start and end must be given together (or both left out)")
    times = as_times(start, end, n) if start is not None else None
    if highlight is not None:
        highlight = as_index(highlight, n, "highlight")
    lit = set(pyspec_ref.ancestors(p.tolist(), highlight)) if highlight is not None else set()
    pos = tree_layout(p)
    xy = np.array([pos[v] for v in range(n)])
    width, height = xy[:, 0].max() + 1, -xy[:, 1].min() + 1
    ax = new_ax(ax, (min(14, max(4.5, 0.8 * width + 1.5)), min(10, max(3, 1.1 * height + 1))))
    look = _tree_sizes(ax, n, width, height, times is not None)

    # Edges first so the nodes cover their ends; the query's path to the root is lit.
    child_ids = [v for v in range(n) if p[v] >= 0]
    segments = [(pos[int(p[v])], pos[v]) for v in child_ids]
    on_path = [v in lit and int(p[v]) in lit for v in child_ids]
    edges = LineCollection(segments, colors=[HIGHLIGHT if o else GREY for o in on_path],
                           linewidths=[2.6 if o else 1.2 for o in on_path], zorder=1, gid="edges")
    ax.add_collection(edges)

    faces = [HIGHLIGHT if v in lit else NODE for v in range(n)]
    rims = [INK if v == highlight else VISIBLE for v in range(n)]
    rim = 1.1 if look["ids"] else 0.6
    ax.scatter(xy[:, 0], xy[:, 1], s=look["diameter"] ** 2, c=faces, edgecolors=rims, zorder=2,
               linewidths=[2.2 * rim if v == highlight else rim for v in range(n)], gid="nodes")

    if look["ids"]:
        for v in range(n):
            ax.text(*pos[v], str(v), ha="center", va="center", fontsize=look["ids"], color=INK,
                    fontweight="bold", zorder=3)
    if look["times"]:
        for v in range(n):
            # Offset in points, not data units, so it sits just under the node at any scale.
            ax.annotate(f"[{times[0][v]},{times[1][v]}]", pos[v],
                        xytext=(0, -look["diameter"] / 2 - 2), textcoords="offset points",
                        ha="center", va="top", fontsize=look["times"], color=INK, zorder=3,
                        bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85))
    labelled = bool(look["ids"])

    ax.set_xlim(xy[:, 0].min() - 0.7, xy[:, 0].max() + 0.7)
    ax.set_ylim(xy[:, 1].min() - (0.75 if look["times"] else 0.5),
                xy[:, 1].max() + 0.5)
    ax.set_axis_off()
    if title is None:
        title = f"token tree ({n} nodes)"
        if look["times"]:
            title += ": id, [start,end]"
        elif labelled:
            title += ": id"
    if highlight is not None:
        title += f"\nquery {highlight} sees its ancestors-or-self"
    style_ax(ax, title)
    return ax


# ----------------------------------------------------------------------------- masks


def draw_mask(mask, ax=None, title=None, highlight_row=None, wrong=None):
    """The boolean mask as an image: visible keys dark, hidden light; query down, key across.

    `highlight_row` outlines one query's row; `wrong` (same shape) marks a student's
    wrong entries in vermillion with a cross, and the title counts them.
    """
    m = as_mask(mask)
    rows, cols = m.shape
    w = None
    if wrong is not None:
        w = as_mask(wrong, "wrong")
        if w.shape != m.shape:
            raise ValueError(f"wrong must have the mask's shape {m.shape}, got {w.shape}")
    row = as_index(highlight_row, rows, "highlight_row") if highlight_row is not None else None
    side = min(7.0, max(3.5, 0.28 * rows + 1.5))
    ax = new_ax(ax, (side + 0.3, side + 0.6))

    ax.imshow(m, cmap=ListedColormap([HIDDEN, VISIBLE]), vmin=0, vmax=1,
              interpolation="nearest", origin="upper", zorder=1)
    cell_grid(ax, rows, cols)
    handles = [Patch(fc=VISIBLE, label="visible"),
               Patch(fc=HIDDEN, ec=GREY, lw=0.5, label="hidden")]
    count = None
    if w is not None:
        count = int(w.sum())
        overlay = np.zeros((rows, cols, 4))
        overlay[w] = to_rgba(WRONG)
        ax.imshow(overlay, interpolation="nearest", origin="upper", zorder=2)
        if rows <= LABEL_LIMIT:  # a shape cue as well as a colour one
            qs, ks = np.nonzero(w)
            ax.scatter(ks, qs, marker="x", s=22, c="white", linewidths=1.2, zorder=3)
        handles.append(Patch(fc=WRONG, label="wrong"))
    if row is not None:
        ax.add_patch(Rectangle((-0.5, row - 0.5), cols, 1, fill=False, ec=HIGHLIGHT, lw=2.8,
                               zorder=4, clip_on=False, gid="highlight_row"))
        handles.append(Patch(fc="none", ec=HIGHLIGHT, lw=2, label=f"query {row}"))

    index_ticks(ax, rows, cols)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    legend_below(ax, handles)
    title = "tree causal mask" if title is None else title
    if count is not None:
        title += f"  ({count} wrong)" if count else "  (all correct)"
    style_ax(ax, title)
    for spine in ax.spines.values():  # an image needs its whole frame
        spine.set_visible(True)
        spine.set_color(GREY)
    return ax


def tree_and_mask(parents, start, end, mask, highlight=None, title=None):
    """One figure: the tree with its DFS times beside its mask, the highlighted query's row lit."""
    p = as_parents(parents)
    n = len(p)
    m = as_mask(mask)
    if m.shape[0] != n:
        raise ValueError(f"mask must be {n} x {n} to match parents, got {m.shape}")
    if highlight is not None:
        highlight = as_index(highlight, n, "highlight")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5.6), layout="constrained",
                                      gridspec_kw={"width_ratios": [1.25, 1]})
    draw_tree(p, start, end, ax=left, highlight=highlight)
    draw_mask(m, ax=right, highlight_row=highlight,
              title=None if highlight is None else
              f"tree causal mask\nrow {highlight}: keys query {highlight} may see")
    if title:
        fig.suptitle(title, fontsize=12, fontweight="bold", color=INK)
    return fig


def draw_times(start, end, ax=None, highlight=None):
    """DFS intervals as bars, one row per node sorted by start: a subtree is one contiguous range.

    With `highlight` = q, a dashed line marks start[q]: the bars it crosses are exactly
    q's ancestors-or-self (k is an ancestor of q exactly when start[q] lies in
    [start[k], end[k]]).
    """
    s, e = as_times(start, end)
    n = len(s)
    q = as_index(highlight, n, "highlight") if highlight is not None else None
    order = np.argsort(s, kind="stable")
    ax = new_ax(ax, (7.5, min(9.0, max(2.8, 0.3 * n + 1.2))))

    lit = (s <= s[q]) & (s[q] <= e) if q is not None else np.zeros(n, dtype=bool)
    colors = [HIGHLIGHT if lit[v] else (SKY if s[v] == e[v] else BLUE) for v in order]
    # Each preorder slot is a unit cell centred on its index, so a leaf is a unit block.
    ax.barh(np.arange(n), e[order] - s[order] + 0.9, left=s[order] - 0.45, height=0.7,
            color=colors, edgecolor="white", linewidth=0.5, zorder=2, gid="intervals")
    if n <= LABEL_LIMIT:
        for row, v in enumerate(order):
            ax.text(e[v] + 0.6, row, f"[{s[v]},{e[v]}]", va="center", fontsize=7.5, color=INK)
        ax.set_yticks(np.arange(n), [f"node {v}" for v in order])
    else:
        ax.set_yticks([])
    if q is not None:
        ax.axvline(s[q], color=INK, linestyle="--", linewidth=1.2, zorder=3)
    ax.set_ylim(n - 0.5, -0.5)  # first in preorder on top, like the tree
    ax.set_xlim(min(s.min(), 0) - 0.8, e.max() + (3.2 if n <= LABEL_LIMIT else 0.8))
    ax.set_xlabel("preorder index (DFS time)")
    handles = [Patch(fc=BLUE, label="internal node"), Patch(fc=SKY, label="leaf")]
    if q is not None:
        handles.append(Patch(fc=HIGHLIGHT, label=f"interval holds start[{q}]={s[q]}"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend_below(ax, handles)
    style_ax(ax, "DFS intervals [start, end]: each subtree is one contiguous range", grid_axis="x")
    return ax


# ----------------------------------------------------------------------------- memory


_BIT_UNITS = ("bit", "Kbit", "Mbit", "Gbit", "Tbit", "Pbit", "Ebit")


def format_bits(bits) -> str:
    """A bit count in binary units: 2**31 -> "2.0 Gbit", 2**25 -> "32.0 Mbit", 12 -> "12 bit"."""
    value = float(to_numpy(bits))
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"bits must be a finite non-negative number, got {bits!r}")
    if value < 1024:
        return f"{value:.0f} bit" if value == int(value) else f"{value:.1f} bit"
    unit = 0
    # Move up while the rounded value would read 1024.0 or more (e.g. 2**20 - 1 bits).
    while unit < len(_BIT_UNITS) - 1 and round(value / 1024 ** unit, 1) >= 1024:
        unit += 1
    return f"{value / 1024 ** unit:.1f} {_BIT_UNITS[unit]}"


def _pairs(rows, name: str) -> tuple[list[str], np.ndarray]:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError(f"{name} must be a non-empty list of (label, value) pairs")
    labels, values = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise ValueError(f"{name}[{i}] must be a (label, value) pair, got {row!r}")
        labels.append(str(row[0]))
        values.append(float(to_numpy(row[1])))
    return labels, np.array(values)


def memory_bars(rows, ax=None, title=None, unit="bit"):
    """Sizes as horizontal bars on a log axis, each labelled in binary units at its end.

    `unit` says what the numbers count: "bit" (labels in bit, Kbit, Mbit, ...) or "byte" (B,
    KiB, MiB, ...), so that a figure reads in the unit its notebook prints.
    """
    if unit not in ("bit", "byte"):
        raise ValueError(f'unit must be "bit" or "byte", got {unit!r}')
    fmt = format_bits if unit == "bit" else format_bytes
    labels, bits = _pairs(rows, "rows")
    if not np.all(np.isfinite(bits)) or np.any(bits <= 0):
        raise ValueError(f"rows must hold positive finite {unit} counts (the axis is logarithmic)")
    n = len(bits)
    ax = new_ax(ax, (7.5, max(2.2, 0.5 * n + 1.2)))
    y = np.arange(n)
    palette = [BLUE, ORANGE, GREEN, SKY, VERMILLION, "#CC79A7"]
    ax.barh(y, bits, color=[palette[i % len(palette)] for i in range(n)], height=0.6, zorder=2)
    ax.set_xscale("log")
    for i, b in enumerate(bits):
        ax.text(b * 1.25, i, fmt(b), va="center", fontsize=9, color=INK)
    ax.set_yticks(y, labels)
    ax.set_ylim(n - 0.5, -0.5)  # first row on top, as listed
    left, right = bits.min() / 4, bits.max() * 30  # room on the right for the labels
    # Ticks at powers of 1024 read as units, not as 10^k; where fewer than three fall in the drawn
    # range, powers of 32, 4 or 2. Only ticks inside the range: set_xticks would widen the axis.
    for base in (1024, 32, 4, 2):
        first = max(math.ceil(math.log(left, base) - 1e-9), 0)
        ticks = [float(base) ** k for k in range(first, math.floor(math.log(right, base) + 1e-9) + 1)]
        if len(ticks) >= 3:
            break
    ax.set_xticks(ticks, [fmt(t).replace(".0 ", " ") for t in ticks])
    ax.set_xlim(left, right)
    ax.minorticks_off()
    ax.set_xlabel(f"size ({'bits' if unit == 'bit' else 'bytes'}, binary units, log scale)")
    style_ax(ax, title or "memory", grid_axis="x")
    return ax


# ----------------------------------------------------------------------------- measurements

MEASURED_AT = {"B": 64, "N": 1024}  # the size of the figure: the largest of the bench's batches


def measured_figure(document: dict):
    """trees.png: each launcher's time at MEASURED_AT, against the torch dense mask."""
    rows = [row for row in document["rows"] if all(row[key] == value for key, value in MEASURED_AT.items())]
    fig, ax = plt.subplots(figsize=(8, 3))
    title = f"notebook 01 at B = {MEASURED_AT['B']}, N = {MEASURED_AT['N']} on {document['device']}"
    results_bar(rows, ax=ax, baseline="torch_dense_mask", title=title)
    return fig


FIGURES = {"trees": measured_figure}
