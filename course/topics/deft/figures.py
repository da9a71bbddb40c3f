"""Figures for DeFT (notebooks 13 and 14): KV trees, flattened blocks and their bitmasks, loads, IO.

Plotting only: the groupings, bitmasks and byte counts come from `pyspec_ref.deft`; the
functions here draw what that specification computes. Conventions as in `course.measure.plots`: every
function takes an optional ``ax`` (or makes a figure), returns the Axes (or Figure) and never
calls ``plt.show()``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

import pyspec_ref.deft as spec
from course.measure.plots import (
    BLUE,
    GREEN,
    GREY,
    HIDDEN,
    INK,
    ORANGE,
    SERIES,
    SKY,
    VERMILLION,
    VISIBLE,
    legend_below,
    new_ax,
    style_ax,
)
from course.topics.trees.figures import tree_layout

__all__ = ["block_sweep", "draw_flatten", "draw_kv_tree", "group_loads", "io_bars"]

NODE_COLORS = ["#DCE8F3", "#FBE3B5", "#CDEBDD", "#F6D3C2", "#E3DDF1", "#D6EEF7", "#F3E1EC", "#E8E8D0"]
IO_PARTS = (("kv", BLUE, "KV cache"), ("queries", SKY, "queries and output"),
            ("masks", ORANGE, "masks and index lists"), ("partials", VERMILLION, "partial results"))


def _tree(parents, lengths, query_nodes):
    return spec.validate_kv_tree(list(parents), list(lengths), list(query_nodes))


def draw_kv_tree(parents, lengths, query_nodes, ax=None, title=None):
    """The KV tree, root on top: each node with its id and token count, each query under its node."""
    p, sizes, queries = _tree(parents, lengths, query_nodes)
    pos = tree_layout(p)
    xy = np.array([pos[v] for v in range(len(p))])
    width, height = xy[:, 0].max() + 1, -xy[:, 1].min() + 1
    ax = new_ax(ax, (min(13, max(4.5, 1.1 * width + 1.5)), min(9, max(2.6, 1.3 * height + 1.2))))
    for v in range(1, len(p)):
        (x0, y0), (x1, y1) = pos[p[v]], pos[v]
        ax.plot([x0, x1], [y0, y1], color=GREY, linewidth=1.2, zorder=1)
    for v in range(len(p)):
        x, y = pos[v]
        ax.add_patch(Rectangle((x - 0.42, y - 0.2), 0.84, 0.4, facecolor=NODE_COLORS[v % len(NODE_COLORS)],
                               edgecolor=VISIBLE, linewidth=1.0, zorder=2))
        ax.text(x, y, f"{v}: {sizes[v]} tok", ha="center", va="center", fontsize=8.5, color=INK, zorder=3)
    below: dict[int, list[int]] = {}
    for i, v in enumerate(queries):
        below.setdefault(v, []).append(i)
    for v, ids in below.items():
        x, y = pos[v]
        label = ", ".join(f"q{i}" for i in ids[:4]) + (", ..." if len(ids) > 4 else "")
        ax.annotate(label, (x, y - 0.2), xytext=(0, -9), textcoords="offset points", ha="center", va="top",
                    fontsize=8, color=VERMILLION, fontweight="bold")
    ax.set_xlim(xy[:, 0].min() - 0.7, xy[:, 0].max() + 0.7)
    ax.set_ylim(xy[:, 1].min() - 0.75, xy[:, 1].max() + 0.4)
    ax.set_axis_off()
    style_ax(ax, title or f"KV tree: {len(p)} nodes, {sum(sizes)} tokens, {len(queries)} queries (red)")
    return ax


def draw_flatten(parents, lengths, query_nodes, block_tokens, ax=None, title=None):
    """DeFT-Flatten on a small tree: the DFS-flattened tokens coloured by node, the block
    boundaries, which tokens each query sees, and each segment's bitmask over its block's queries.

    Top strip: token t, coloured by its node, node ids on the segments. Rows below: query i's
    visible tokens (dark). Under each block: for each segment, its mask bits written for the
    block's queries in order (first query leftmost), from `pyspec_ref.deft.flatten_blocks`.
    """
    p, sizes, queries = _tree(parents, lengths, query_nodes)
    blocks = spec.flatten_blocks(p, sizes, queries, block_tokens)
    visible = spec.visible_tokens(p, sizes, queries)
    total, n_q = sum(sizes), len(queries)
    ax = new_ax(ax, (min(14, max(6.0, 0.32 * total + 2)), 1.9 + 0.32 * n_q))
    for b in blocks:
        for v, s, e, _ in b["segments"]:
            ax.add_patch(Rectangle((s, -1.4), e - s, 1, facecolor=NODE_COLORS[v % len(NODE_COLORS)],
                                   edgecolor=VISIBLE, linewidth=0.6))
            ax.text((s + e) / 2, -0.9, str(v), ha="center", va="center", fontsize=8, color=INK)
    grid = np.zeros((n_q, total), dtype=bool)
    for i, seen in enumerate(visible):
        grid[i, seen] = True
    for i in range(n_q):
        for t in range(total):
            ax.add_patch(Rectangle((t, i), 1, 0.9, facecolor=VISIBLE if grid[i, t] else HIDDEN, linewidth=0))
        ax.text(-0.4, i + 0.45, f"q{i}", ha="right", va="center", fontsize=8, color=INK)
    for n, b in enumerate(blocks):
        s0, e0 = b["token_start"], b["token_end"]
        ax.plot([s0, s0], [-1.6, n_q + 0.2], color=VERMILLION, linewidth=1.6)
        ax.text((s0 + e0) / 2, -1.7, f"block {n}: queries {b['queries']}", ha="center", va="bottom",
                fontsize=8, color=VERMILLION)
        for _, s, e, words in b["segments"]:
            bits = "".join(str(words[j // 64] >> (j % 64) & 1) for j in range(len(b["queries"])))
            ax.text((s + e) / 2, n_q + 0.35, bits or "-", ha="center", va="top", fontsize=7.5, color=INK,
                    rotation=90 if e - s < max(2, len(bits) * 0.45) else 0, family="monospace")
    ax.plot([total, total], [-1.6, n_q + 0.2], color=VERMILLION, linewidth=1.6)
    ax.set_xlim(-2.2, total + 0.5)
    ax.set_ylim(n_q + 1.6, -2.6)
    ax.set_axis_off()
    style_ax(ax, title or f"DeFT-Flatten: {total} tokens in DFS order, blocks of {block_tokens}")
    return ax


def group_loads(loads: dict[str, list[int]], ax=None, title=None, unit="tokens streamed", items="programs"):
    """The work of each program (one bar each, largest first) for several groupings side by side.

    `loads` maps a grouping's name to its programs' work (e.g. the tokens each streams). The
    longest bar bounds the phase's time when all run in parallel; each panel's title gives
    max / mean, the imbalance.
    """
    if not loads:
        raise ValueError("loads must map at least one grouping to its groups' work")
    fig = ax.figure if ax is not None else None
    if ax is None:
        fig, axes = plt.subplots(1, len(loads), figsize=(4.6 * len(loads), 3.2), layout="constrained",
                                 squeeze=False)
        axes = list(axes[0])
    else:
        axes = [ax] * len(loads)
    for axis, (name, work), color in zip(axes, loads.items(), (BLUE, GREEN, ORANGE, SKY), strict=False):
        values = np.array(sorted(work, reverse=True), dtype=float)
        axis.bar(np.arange(len(values)), values, color=color, width=0.8)
        ratio = values.max() / values.mean()
        axis.set_xlabel(f"{len(values)} {items}, largest first")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        style_ax(axis, f"{name}: max / mean = {ratio:.1f}", grid_axis="y")
    for axis in axes:
        axis.set_ylabel(unit)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11, fontweight="bold", color=INK)
    return fig


def io_bars(io_by_method: dict[str, dict], ax=None, title=None, scale=1e6, unit="MB"):
    """Stacked horizontal bars of modelled bytes per method (`pyspec_ref.deft.io_bytes` dicts)."""
    if not io_by_method:
        raise ValueError("io_by_method must hold at least one method's io_bytes dict")
    names = list(io_by_method)
    ax = new_ax(ax, (9, 0.55 * len(names) + 1.6))
    left = np.zeros(len(names))
    for key, color, label in IO_PARTS:
        values = np.array([io_by_method[n][key] for n in names], dtype=float) / scale
        ax.barh(np.arange(len(names)), values, left=left, color=color, height=0.6, label=label, zorder=2)
        left += values
    for i, total in enumerate(left):
        ax.text(total + left.max() * 0.01, i, f"{total:.3g} {unit}", va="center", fontsize=9, color=INK)
    ax.set_yticks(np.arange(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, left.max() * 1.18)
    ax.set_xlabel(f"modelled bytes moved ({unit})")
    style_ax(ax, title or "IO model", grid_axis="x")
    legend_below(ax, [Patch(color=c, label=label) for _, c, label in IO_PARTS])
    return ax


def block_sweep(rows, workload: str, ax=None, title=None):
    """DeFT-Flatten's time against its block length on one workload: measured, and the model.

    rows: `course.topics.deft.bench` rows. The deft_flatten_sweep rows give the measured median per
    block length and the model's time (`modelled_time`, in streamed tokens), drawn scaled to
    meet the measurement at the chosen block (the deft_flatten row's block_tokens), marked.
    """
    sweep = sorted((r for r in rows if r.get("name") == "deft_flatten_sweep" and r.get("workload") == workload
                    and r.get("median_ms") and "modelled_time" in r), key=lambda r: r["block_tokens"])
    chosen = next((r for r in rows if r.get("name") == "deft_flatten" and r.get("workload") == workload
                   and r.get("median_ms")), None)
    if not sweep or chosen is None:
        raise ValueError(f"rows hold no deft_flatten_sweep rows with modelled_time, or no deft_flatten row, "
                         f"for workload {workload!r}")
    ax = new_ax(ax, (6.4, 3.2))
    blocks = [r["block_tokens"] for r in sweep]
    measured = [r["median_ms"] * 1e3 for r in sweep]
    at_chosen = {r["block_tokens"]: r for r in sweep}.get(chosen["block_tokens"])
    scale = (at_chosen["median_ms"] * 1e3 / at_chosen["modelled_time"]) if at_chosen else \
        min(measured) / min(r["modelled_time"] for r in sweep)
    ax.plot(blocks, measured, "o-", color=BLUE, markersize=3, linewidth=1, label="measured")
    ax.plot(blocks, [r["modelled_time"] * scale for r in sweep], "-", color=ORANGE, linewidth=1.2,
            label="model (scaled)")
    ax.plot([chosen["block_tokens"]], [chosen["median_ms"] * 1e3], "*", color=VERMILLION, markersize=12,
            label=f"chosen: {chosen['block_tokens']} tokens")
    ax.set(xscale="log", xlabel="block length (tokens)", ylabel="time (µs)")
    ax.legend(fontsize=7)
    style_ax(ax, title or workload, grid_axis="y")
    return ax


def measured_figure(document: dict):
    """deft.png, per workload: each method's time relative to the read-once floor (log scale), and the
    compute floor (the attention's FLOPs at the measured matmul rate) as a black tick."""
    rows, device = document["rows"], document["device"]
    left_out = ("copy", "matmul", "deft_flatten_sweep", "deft_flatten_tiles")  # not methods of a workload
    timed = [r for r in rows if r["name"] not in left_out and r.get("median_ms")]
    names = list(dict.fromkeys(r["workload"] for r in timed))
    methods = [m for m in dict.fromkeys(r["name"] for r in timed) if m not in ("read_once", "compute_floor")]
    fig, ax = plt.subplots(figsize=(max(10, 1.1 * len(names)), 4.5))
    width = 0.8 / len(methods)
    for i, (colour, method) in enumerate(zip(SERIES * 2, methods, strict=False)):
        values = []
        for w in names:
            at = {r["name"]: r["median_ms"] for r in timed if r["workload"] == w}
            floor, mine = at.get("read_once"), at.get(method)
            values.append(mine / floor if mine and floor else 0.0)
        ax.bar([j + i * width for j in range(len(names))], values, width, color=colour, label=method)
    for j, w in enumerate(names):
        at = {r["name"]: r["median_ms"] for r in timed if r["workload"] == w}
        if at.get("compute_floor") and at.get("read_once"):
            ax.hlines(at["compute_floor"] / at["read_once"], j - width / 2, j + 0.8 - width / 2,
                      color=INK, linewidth=2, label="compute floor" if j == 0 else None)
    ax.axhline(1.0, color=INK, linewidth=0.8)
    ax.set(xticks=[j + 0.4 - width / 2 for j in range(len(names))], yscale="log",
           ylabel="time / KV read-once floor",
           title=f"DeFT workloads (fp16, 32/8 heads, d = 128) on {device}")
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    fig.tight_layout()
    return fig


FIGURES = {"deft": measured_figure}


def summary(document: dict) -> str:
    """DeFT's targets, met or not, from the rows of deft.json."""
    from course.topics.deft.bench import format_targets, targets

    return format_targets(targets(document["rows"]))
