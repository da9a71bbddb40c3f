"""Figures of notebook 02 (attention): the online softmax's running state, a mask's tiles (skipped,
partial, full; later notebooks draw theirs with `draw_tiles`), and the measured tiled attention
against SDPA (`python -m course figures attention` writes attention.png beside attention.json)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.patches import Patch

from course.measure.plots import (
    BLUE,
    GREY,
    INK,
    ORANGE,
    VISIBLE,
    as_mask,
    cell_grid,
    index_ticks,
    legend_below,
    new_ax,
    positive_int,
    results_bar,
    style_ax,
    to_numpy,
)

TILE_SKIP, TILE_PARTIAL, TILE_FULL = 0, 1, 2


# ----------------------------------------------------------------------------- tiles


def classify_tiles(mask, block_q, block_k) -> np.ndarray:
    """Class of each (block_q x block_k) tile: 0 all hidden (skip), 1 partial, 2 all visible.

    Ragged last tiles are classified on the cells they hold.
    """
    m = as_mask(mask, square=False)
    bq, bk = positive_int(block_q, "block_q"), positive_int(block_k, "block_k")
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
    # Each swatch is the colour the reader sees: a full tile is covered by the visible ink, so its
    # swatch is that ink over the tile's tint; a partial tile shows both, hidden cells in its tint.
    seen = {c: tints[c] for c in (TILE_SKIP, TILE_PARTIAL)}
    ink_rgba = np.array(to_rgba(VISIBLE, 0.85))
    seen[TILE_FULL] = tuple(ink_rgba[:3] * ink_rgba[3] + np.array(to_rgba(tints[TILE_FULL]))[:3]
                            * (1 - ink_rgba[3]))
    handles = [Patch(fc=seen[c], ec=GREY, lw=0.5, label=f"{names[c]} ({counts[c]})")
               for c in (TILE_SKIP, TILE_PARTIAL, TILE_FULL)]
    legend_below(ax, handles)
    index_ticks(ax, rows, cols)
    # On a large mask, ticks on tile edges (the first index of a tile), at most about 8 per axis.
    for axis, count, block in ((ax.xaxis, cols, bk), (ax.yaxis, rows, bq)):
        if count > 24:
            step = block * max(1, math.ceil(math.ceil(count / block) / 8))
            axis.set_ticks(range(0, count, step))
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    if title is None:
        title = f"{bq}x{bk} tiles: {counts[TILE_SKIP]} of {classes.size} skipped"
    style_ax(ax, title)
    for spine in ax.spines.values():
        spine.set_visible(True)
        spine.set_color(INK)
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
    b = positive_int(block, "block")
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
    ax.set_ylabel("score s and running max m (logits)", color=BLUE)
    ax.set_xlim(0, len(r))

    right = ax.twinx()
    right.step(edges[:-1][shown].tolist() + [edges[-1]], ls[shown].tolist() + [ls[-1]],
               where="post", color=ORANGE, linewidth=2.2, zorder=3, label="running sum l",
               gid="running_sum")
    right.axhline(l_exact, color=ORANGE, linestyle="--", linewidth=1.2,
                  label=f"sum exp(s - max) = {l_exact:.3g}")
    right.set_ylim(0, max(ls.max(), l_exact) * 1.15)
    right.set_ylabel("running sum l = Σ exp(s − m) (no unit)", color=ORANGE)
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


# ----------------------------------------------------------------------------- measurements

MEASURED_AT = {"B": 10, "H": 10, "N": 1024, "d": 64}  # FlashSpecInfer's shape, as in the ladder


def measured_figure(document: dict):
    """attention.png: flash_attention's time at MEASURED_AT against SDPA's."""
    rows = [row for row in document["rows"] if all(row[key] == value for key, value in MEASURED_AT.items())]
    fig, ax = plt.subplots(figsize=(8, 2.4))
    shape = ", ".join(str(value) for value in MEASURED_AT.values())
    results_bar(rows, ax=ax, baseline="sdpa", title=f"notebook 02 at (B, H, N, d) = ({shape}) on "
                                                          f"{document['device']}")
    return fig


FIGURES = {"attention": measured_figure}
