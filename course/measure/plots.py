"""The course's one figure style: the palette, the look of an Axes, the coercion of arguments, the
cell grid of masks and tiles, and the bars of measured times (`results_bar`). Each topic's
drawings live in its `course/topics/<topic>/figures.py` and use these.

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
from pathlib import Path
from types import ModuleType

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import offset_copy

import pyspec_ref

__all__ = [
    "as_index",
    "as_mask",
    "as_parents",
    "as_times",
    "cell_grid",
    "index_ticks",
    "int_vector",
    "legend_below",
    "new_ax",
    "positive_int",
    "results_bar",
    "style_ax",
    "to_numpy",
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


def format_bytes(count) -> str:
    """A byte count in binary units, for labels and printouts: 2**31 -> "2.0 GiB", 1536 -> "1.5 KiB"."""
    value = float(to_numpy(count))
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"count must be a finite non-negative number of bytes, got {count!r}")
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    unit = 0
    while unit < len(units) - 1 and round(value / 1024 ** unit, 1) >= 1024:
        unit += 1
    if unit == 0:
        return f"{value:.0f} B" if value == int(value) else f"{value:.1f} B"
    return f"{value / 1024 ** unit:.1f} {units[unit]}"


def int_vector(x, name: str) -> np.ndarray:
    arr = to_numpy(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer)
        or (np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0))
    ):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def as_parents(parents, name: str = "parents") -> np.ndarray:
    """A validated parent array (one root, no cycle, ids in range), checked by pyspec_ref."""
    arr = int_vector(parents, name)
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


def as_index(value, n: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        value = to_numpy(value)
        if value.ndim != 0 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(f"{name} must be an int node id, got {value!r}")
    value = int(value)
    if not 0 <= value < n:
        raise ValueError(f"{name} must be in [0, {n}), got {value}")
    return value


def as_times(start, end, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    s, e = int_vector(start, "start"), int_vector(end, "end")
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


def positive_int(value, name: str) -> int:
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


# ----------------------------------------------------------------------------- grids


def index_ticks(ax, rows: int, cols: int):
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


def save_figures(figures: ModuleType, document: dict, directory: Path, dpi: int = 120) -> list[Path]:
    """Draw each of `figures.FIGURES` from `document` as directory/<name>.png; the paths written."""
    written = []
    for name, draw in figures.FIGURES.items():
        fig = draw(document)
        path = directory / f"{name}.png"
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
