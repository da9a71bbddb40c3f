"""The course's figures: token trees, tree causal masks, DFS intervals, tiles, memory and timings.

Plotting only: nothing here computes DFS times or masks for you (those are exercises);
the functions draw what they are given. Conventions, shared with the rest of the course:

- a tree is a parent array: ``parents[i]`` is node i's parent, -1 for the root;
- DFS times are preorder: ``start[v]`` is v's preorder index (children visited in
  increasing id), ``end[v]`` the largest preorder index in v's subtree;
- ``mask[q][k]`` is True when query q may see key k (k is an ancestor-or-self of q).

Every argument may be a list, a NumPy array or a (CPU or GPU) torch tensor. Every
drawing function takes an optional ``ax`` (a new figure is made when it is None) and
returns the Axes, or the Figure for multi-panel plots; none calls ``plt.show()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import offset_copy

import pyspec_ref

__all__ = [
    "classify_tiles",
    "draw_mask",
    "draw_tiles",
    "draw_times",
    "draw_tree",
    "format_bits",
    "memory_bars",
    "online_softmax_trace",
    "results_bar",
    "tree_and_mask",
    "tree_layout",
]

# Okabe-Ito colours: distinguishable with every common colour-vision deficiency.
BLUE = "#0072B2"
SKY = "#56B4E9"
ORANGE = "#E69F00"
GREEN = "#009E73"
VERMILLION = "#D55E00"
GREY = "#9AA0A6"
INK = "#1F2933"
VISIBLE = "#1D3E5E"  # mask: a key the query may see (dark)
HIDDEN = "#EEF1F5"  # mask: a key the query must not see (light)
NODE = "#DCE8F3"  # tree: an ordinary node
HIGHLIGHT = ORANGE  # tree, mask, times: the chosen query and what it sees
WRONG = VERMILLION  # mask: an entry the student got wrong
SERIES = (BLUE, ORANGE, GREEN, VERMILLION, SKY, GREY, INK)  # one colour per measured method, in turn

LABEL_LIMIT = 40  # above this many nodes (or rows), per-item labels become unreadable
TILE_SKIP, TILE_PARTIAL, TILE_FULL = 0, 1, 2


# ----------------------------------------------------------------------------- inputs


def to_numpy(x) -> np.ndarray:
    """A NumPy copy of a list, array or torch tensor (torch is never imported here)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, on any device
        x = x.detach().cpu()
        try:
            return x.numpy()
        except TypeError:  # bfloat16 and friends have no NumPy dtype
            return x.float().numpy()
    return np.asarray(x)


def _int_vector(x, name: str) -> np.ndarray:
    arr = to_numpy(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer)
        or (np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0))
    ):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _as_parents(parents, name: str = "parents") -> np.ndarray:
    """A validated parent array (one root, no cycle, ids in range), checked by pyspec_ref."""
    arr = _int_vector(parents, name)
    if len(arr) == 0:
        raise ValueError(f"{name} must hold at least one node")
    pyspec_ref.validate_parents(arr.tolist(), name)
    return arr


def as_mask(mask, name: str = "mask", square: bool = True) -> np.ndarray:
    arr = to_numpy(mask)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (queries x keys), got shape {arr.shape}")
    if square and arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{name} must be square (N x N), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {arr.shape}")
    if arr.dtype != bool:
        # A 0/-inf bias or a float score matrix is not a mask: refuse rather than guess.
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError(f"{name} must be boolean (or 0/1), got dtype {arr.dtype}")
        arr = arr != 0
    return arr


def _as_index(value, n: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        value = to_numpy(value)
        if value.ndim != 0 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(f"{name} must be an int node id, got {value!r}")
    value = int(value)
    if not 0 <= value < n:
        raise ValueError(f"{name} must be in [0, {n}), got {value}")
    return value


def _as_times(start, end, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    s, e = _int_vector(start, "start"), _int_vector(end, "end")
    if len(s) != len(e):
        raise ValueError(f"start and end must have the same length, got {len(s)} and {len(e)}")
    if n is not None and len(s) != n:
        raise ValueError(f"start and end must have one entry per node of parents ({n}), "
                         f"got {len(s)}")
    if len(s) == 0:
        raise ValueError("start must hold at least one node")
    if np.any(s > e):
        v = int(np.flatnonzero(s > e)[0])
        raise ValueError(f"start must not exceed end, got start[{v}]={s[v]} > end[{v}]={e[v]}")
    return s, e


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------- style


def new_ax(ax, figsize):
    """`ax`, or the Axes of a new figure of `figsize` when it is None."""
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def style_ax(ax, title=None, grid_axis=None):
    """The shared look: no top/right frame, quiet ticks, a left-aligned bold title."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(GREY)
    ax.tick_params(colors=INK, labelsize=9, color=GREY)
    ax.xaxis.label.set_color(INK)
    ax.yaxis.label.set_color(INK)
    if grid_axis:
        ax.grid(axis=grid_axis, color="#D5DAE0", linewidth=0.7, zorder=0)
        ax.set_axisbelow(True)
    if title:
        ax.set_title(title, loc="left", fontsize=11, fontweight="bold", color=INK)


def legend_below(ax, handles, ncol=None, gap_pt=30):
    """A frameless legend a fixed distance under the axes, clear of the tick and axis labels.

    The gap is in points, not axes fractions, so it is right for short and tall axes alike.
    """
    anchor = offset_copy(ax.transAxes, fig=ax.figure, y=-gap_pt, units="points")
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=anchor,
              ncol=ncol or len(handles), frameon=False, fontsize=8.5, handlelength=1.2,
              columnspacing=1.2)


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
    p = _as_parents(parents)
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
    p = _as_parents(parents)
    n = len(p)
    if (start is None) != (end is None):
        raise ValueError("start and end must be given together (or both left out)")
    times = _as_times(start, end, n) if start is not None else None
    if highlight is not None:
        highlight = _as_index(highlight, n, "highlight")
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


def _index_ticks(ax, rows: int, cols: int):
    """Every index as a tick while readable, otherwise a few integer ticks."""
    for axis, count in ((ax.xaxis, cols), (ax.yaxis, rows)):
        if count <= 24:
            axis.set_ticks(range(count))
        else:
            axis.set_major_locator(MaxNLocator(nbins=8, integer=True))


def cell_grid(ax, rows: int, cols: int, color="white", width=0.6):
    """Thin lines between cells, so single cells of a small mask can be counted."""
    if max(rows, cols) <= 64:
        ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
        ax.grid(which="minor", color=color, linewidth=width)
        ax.tick_params(which="minor", length=0)


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
    row = _as_index(highlight_row, rows, "highlight_row") if highlight_row is not None else None
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

    _index_ticks(ax, rows, cols)
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
    p = _as_parents(parents)
    n = len(p)
    m = as_mask(mask)
    if m.shape[0] != n:
        raise ValueError(f"mask must be {n} x {n} to match parents, got {m.shape}")
    if highlight is not None:
        highlight = _as_index(highlight, n, "highlight")
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
    s, e = _as_times(start, end)
    n = len(s)
    q = _as_index(highlight, n, "highlight") if highlight is not None else None
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


# ----------------------------------------------------------------------------- tiles


def classify_tiles(mask, block_q, block_k) -> np.ndarray:
    """Class of each (block_q x block_k) tile: 0 all hidden (skip), 1 partial, 2 all visible.

    Ragged last tiles are classified on the cells they hold.
    """
    m = as_mask(mask, square=False)
    bq, bk = _positive_int(block_q, "block_q"), _positive_int(block_k, "block_k")
    tq, tk = math.ceil(m.shape[0] / bq), math.ceil(m.shape[1] / bk)
    classes = np.empty((tq, tk), dtype=np.int64)
    for i in range(tq):
        for j in range(tk):
            tile = m[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
            classes[i, j] = TILE_FULL if tile.all() else TILE_PARTIAL if tile.any() else TILE_SKIP
    return classes


def draw_tiles(mask, block_q, block_k, ax=None, title=None):
    """The mask under its tile grid, each tile tinted by class; the legend counts each class."""
    m = as_mask(mask, square=False)
    classes = classify_tiles(m, block_q, block_k)
    bq, bk = int(block_q), int(block_k)
    rows, cols = m.shape
    side = min(7.0, max(3.8, 0.2 * max(rows, cols) + 2))
    ax = new_ax(ax, (side + 0.3, side + 0.8))

    tints = {TILE_SKIP: "#F4F5F7", TILE_PARTIAL: "#F6D58E", TILE_FULL: "#9CC7E6"}
    cell_class = np.repeat(np.repeat(classes, bq, axis=0), bk, axis=1)[:rows, :cols]
    ax.imshow(cell_class, cmap=ListedColormap([tints[c] for c in range(3)]), vmin=-0.5,
              vmax=2.5, interpolation="nearest", zorder=1)
    # The mask on top, dark where visible and see-through where hidden, so the tint shows.
    ink = np.zeros((rows, cols, 4))
    ink[m] = to_rgba(VISIBLE, 0.85)
    ax.imshow(ink, interpolation="nearest", zorder=2)
    cell_grid(ax, rows, cols, color="white", width=0.4)
    for r in range(0, rows + 1, bq):
        ax.axhline(r - 0.5, color=INK, linewidth=1.4, zorder=3)
    for c in range(0, cols + 1, bk):
        ax.axvline(c - 0.5, color=INK, linewidth=1.4, zorder=3)
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)

    counts = {c: int((classes == c).sum()) for c in (TILE_SKIP, TILE_PARTIAL, TILE_FULL)}
    names = {TILE_SKIP: "all hidden: skip", TILE_PARTIAL: "partial: needs mask",
             TILE_FULL: "all visible: no mask"}
    handles = [Patch(fc=tints[c], ec=GREY, lw=0.5, label=f"{names[c]} ({counts[c]})")
               for c in (TILE_SKIP, TILE_PARTIAL, TILE_FULL)]
    legend_below(ax, handles)
    _index_ticks(ax, rows, cols)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    if title is None:
        title = f"{bq}x{bk} tiles: {counts[TILE_SKIP]} of {classes.size} skipped"
    style_ax(ax, title)
    for spine in ax.spines.values():
        spine.set_visible(True)
        spine.set_color(INK)
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


def memory_bars(rows, ax=None, title=None):
    """Sizes as horizontal bars on a log axis, each labelled in binary units at its end."""
    labels, bits = _pairs(rows, "rows")
    if not np.all(np.isfinite(bits)) or np.any(bits <= 0):
        raise ValueError("rows must hold positive finite bit counts (the axis is logarithmic)")
    n = len(bits)
    ax = new_ax(ax, (7.5, max(2.2, 0.5 * n + 1.2)))
    y = np.arange(n)
    palette = [BLUE, ORANGE, GREEN, SKY, VERMILLION, "#CC79A7"]
    ax.barh(y, bits, color=[palette[i % len(palette)] for i in range(n)], height=0.6, zorder=2)
    ax.set_xscale("log")
    for i, b in enumerate(bits):
        ax.text(b * 1.25, i, format_bits(b), va="center", fontsize=9, color=INK)
    ax.set_yticks(y, labels)
    ax.set_ylim(n - 0.5, -0.5)  # first row on top, as listed
    ax.set_xlim(bits.min() / 4, bits.max() * 30)  # room on the right for the labels
    # Ticks at powers of 1024 read as units, not as 10^k.
    lo, hi = math.floor(math.log(bits.min() / 4, 1024)), math.ceil(math.log(bits.max() * 30, 1024))
    ticks = [1024.0 ** k for k in range(max(lo, 0), hi + 1)]
    ax.set_xticks(ticks, [format_bits(t).replace(".0 ", " ") for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("size (log scale)")
    style_ax(ax, title or "memory", grid_axis="x")
    return ax


# ----------------------------------------------------------------------------- softmax


def _online_softmax_states(row: np.ndarray, block: int):
    """(m, l) after each block, as a flash-attention kernel keeps them."""
    m, l = -math.inf, 0.0
    ms, ls = [], []
    for b0 in range(0, len(row), block):
        chunk = row[b0:b0 + block]
        m_new = max(m, float(chunk.max()))
        if m_new > -math.inf:  # an all-hidden prefix leaves l at 0 (and avoids inf - inf)
            l = l * math.exp(m - m_new) + float(np.exp(chunk - m_new).sum())
        m = m_new
        ms.append(m)
        ls.append(l)
    return np.array(ms), np.array(ls)


def online_softmax_trace(row, block, ax=None):
    """Running max m (left axis) and normaliser l (right axis) after each block of scores.

    The scores are grey dots; dashed lines are the exact max(row) and sum(exp(row - max)),
    which the last block reaches. l drops whenever m grows: that is the rescale.
    """
    r = to_numpy(row).astype(np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"row must be a non-empty 1-D array of scores, got shape {r.shape}")
    if np.any(np.isnan(r)) or np.any(r == np.inf):
        raise ValueError("row must not hold NaN or +inf (-inf marks a hidden key)")
    if not np.any(np.isfinite(r)):
        raise ValueError("row must hold at least one finite score (a fully hidden row has no "
                         "softmax)")
    b = _positive_int(block, "block")
    ms, ls = _online_softmax_states(r, b)
    m_exact = float(r.max())
    l_exact = float(np.exp(r - m_exact).sum())
    ax = new_ax(ax, (8, 4))

    edges = np.minimum(np.arange(len(ms) + 1) * b, len(r))
    seen = np.isfinite(r)
    ax.scatter(np.flatnonzero(seen) + 0.5, r[seen], s=10, color=GREY, zorder=2, label="scores")
    for x in edges[1:-1]:
        ax.axvline(x, color="#D5DAE0", linewidth=0.8, zorder=1)
    shown = np.isfinite(ms)  # before the first visible key, m is -inf and cannot be drawn
    ax.step(edges[:-1][shown].tolist() + [edges[-1]], ms[shown].tolist() + [ms[-1]], where="post",
            color=BLUE, linewidth=2.2, zorder=3, label="running max m", gid="running_max")
    ax.axhline(m_exact, color=BLUE, linestyle="--", linewidth=1.2, label=f"max = {m_exact:.3g}")
    ax.set_xlabel(f"scores seen (blocks of {b})")
    ax.set_ylabel("score / m", color=BLUE)
    ax.set_xlim(0, len(r))

    right = ax.twinx()
    right.step(edges[:-1][shown].tolist() + [edges[-1]], ls[shown].tolist() + [ls[-1]],
               where="post", color=ORANGE, linewidth=2.2, zorder=3, label="running sum l",
               gid="running_sum")
    right.axhline(l_exact, color=ORANGE, linestyle="--", linewidth=1.2,
                  label=f"sum exp(s - max) = {l_exact:.3g}")
    right.set_ylim(0, max(ls.max(), l_exact) * 1.15)
    right.set_ylabel("l", color=ORANGE)
    right.spines["top"].set_visible(False)
    right.spines["right"].set_color(GREY)
    right.tick_params(labelsize=9, color=GREY, labelcolor=ORANGE)

    scores, m_step, m_line = ax.get_legend_handles_labels()[0]
    l_step, l_line = right.get_legend_handles_labels()[0]
    # Legends fill column by column: this order reads "m | max | scores" over "l | sum".
    handles = [m_step, l_step, m_line, l_line, scores]
    legend_below(ax, handles, ncol=3)
    style_ax(ax, "online softmax: what each block leaves behind")
    ax.tick_params(axis="y", labelcolor=BLUE)  # after style_ax, which inks all ticks
    return ax


# ----------------------------------------------------------------------------- timings


def _unit_of(value_key: str) -> str:
    for suffix, unit in (("_ms", " ms"), ("_us", " µs"), ("_ns", " ns"), ("_s", " s")):
        if value_key.endswith(suffix):
            return unit
    return ""


def _ratio(r: float) -> str:
    """12.3 for a speed-up, but 0.25 (not 0.2) for a slow-down: one decimal says too little."""
    return f"{r:.1f}" if r >= 1 else f"{r:.2g}"


def results_bar(rows, ax=None, title=None, label_key="name", value_key="median_ms",
                baseline=None):
    """Measured times as horizontal bars, each with its value and, given `baseline`,
    the speed-up over that row ("12.3x vs sdpa" = 12.3 times faster than sdpa).

    Put the device and date into `title` (e.g. from the results JSON) so a screenshot
    can never be mistaken for another machine's numbers.
    """
    if isinstance(rows, dict) or not isinstance(rows, Sequence) or not rows:
        raise ValueError("rows must be a non-empty list of dicts (a results JSON's rows)")
    labels, values = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"rows[{i}] must be a dict, got {type(row).__name__}")
        for key, what in ((label_key, "label_key"), (value_key, "value_key")):
            if key not in row:
                raise ValueError(f"rows[{i}] has no {what} {key!r} (keys: {sorted(row)})")
        labels.append(str(row[label_key]))
        values.append(float(row[value_key]))
    v = np.array(values)
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError(f"rows must hold finite non-negative {value_key!r} values")
    base = None
    if baseline is not None:
        if str(baseline) not in labels:
            raise ValueError(f"baseline {baseline!r} names no row (labels: {labels})")
        base = v[labels.index(str(baseline))]
        if base <= 0:
            raise ValueError(f"baseline {baseline!r} must have a positive {value_key!r}")

    n = len(v)
    ax = new_ax(ax, (8, max(2.2, 0.5 * n + 1.3)))
    colors = [GREY if labels[i] == str(baseline) else BLUE for i in range(n)]
    ax.barh(np.arange(n), v, color=colors, height=0.6, zorder=2, gid="results")
    unit = _unit_of(value_key)
    for i, value in enumerate(v):
        text = f"{value:.3g}{unit}"
        if base is not None:
            text += "  (baseline)" if labels[i] == str(baseline) else \
                f"  ({_ratio(base / value)}× vs {baseline})" if value > 0 else ""
        ax.text(value + v.max() * 0.015, i, text, va="center", fontsize=9, color=INK)
    ax.set_yticks(np.arange(n), labels)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, v.max() * 1.45 if v.max() > 0 else 1)
    ax.set_xlabel(value_key.replace("_", " ") + " (lower is faster)")
    style_ax(ax, title or "measured times", grid_axis="x")
    return ax


def draw_bank_access(word_addresses, ax=None, title=None):
    """One warp's shared-memory access: which bank each thread's word falls in, pass by pass.

    Columns are the 32 banks; each row of cells is one pass the hardware needs. A cell
    shows the thread number(s) served; threads reading the same word share a cell (a
    broadcast). One row means no bank conflict; k rows mean a k-way conflict.
    """
    words = [int(w) for w in _int_vector(word_addresses, "word_addresses")]
    if not words or min(words) < 0:
        raise ValueError("word_addresses must be non-negative word indices, one per thread")
    passes: dict[int, list[int]] = {}  # bank -> distinct words, in order of first use
    for word in words:
        distinct = passes.setdefault(word % 32, [])
        if word not in distinct:
            distinct.append(word)
    depth = max(len(distinct) for distinct in passes.values())
    ax = new_ax(ax, (9, 0.25 * depth + 1.2))
    for bank in range(32):
        for level, word in enumerate(passes.get(bank, [])):
            threads = [t for t, w in enumerate(words) if w == word]
            color = SKY if depth == 1 else (VERMILLION if level else ORANGE)
            ax.add_patch(Rectangle((bank, level), 0.92, 0.88, color=color, zorder=2))
            label = str(threads[0]) if len(threads) == 1 else f"{threads[0]}+"
            ax.text(bank + 0.46, level + 0.44, label, ha="center", va="center", fontsize=7, color=INK)
    ax.set_xlim(0, 32)
    ax.set_ylim(depth, 0)
    ax.set_xlabel("bank")
    ax.set_ylabel("pass")
    ax.set_yticks([i + 0.44 for i in range(depth)], [str(i + 1) for i in range(depth)])
    style_ax(ax, title or (f"{depth}-way bank conflict" if depth > 1 else "one pass: no bank conflict"))
    return ax
