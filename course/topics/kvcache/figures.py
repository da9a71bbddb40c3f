"""Figures of notebooks 17 and 18 (KV-cache management): EMS-SD's padded vs unpadded batch as
measured by `python -m course bench kvcache emssd` (notebook 17); SwiftSpec's [prefix | tree] cache
before and after re-rooting, the non-square w x (P + N) mask, and the measured times of its
sections "compaction" and "attention" (notebook 18). `python -m course figures kvcache` writes
emssd.png, swiftspec_compaction.png and swiftspec_attention.png beside kvcache.json.

Plotting only: the moves and masks are computed by `pyspec_ref.kvcache` and passed in. Colours
are course.measure.plots' Okabe-Ito palette. Every function takes an optional ``ax`` and returns it
(or the Figure for several panels); none calls ``plt.show()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

import pyspec_ref
import pyspec_ref.kvcache as spec
from course.measure.plots import (
    BLUE,
    GREEN,
    GREY,
    HIDDEN,
    INK,
    ORANGE,
    SKY,
    VERMILLION,
    VISIBLE,
    as_mask,
    cell_grid,
    new_ax,
)

__all__ = [
    "attention_figure",
    "compaction_figure",
    "draw_cache_reroot",
    "draw_nonsquare_mask",
    "emssd_figure",
]

PREFIX, COMMITTED, KEPT, DISCARDED, FREE = SKY, ORANGE, GREEN, "#E4E7EB", "white"


def draw_cache_reroot(prefix_len: int, parents, verified_path, ax=None, title=None):
    """Two rows of cache slots, before (top) and after (bottom) SwiftSpec's re-rooting (§3.2).

    Before: the prefix, then the tree's nodes at prefix_len + start[v] (DFS preorder); coloured
    prefix / committed (the verified path but its last node) / kept (the new root's subtree) /
    discarded. After: the new prefix (old prefix + committed) and the kept subtree, compacted.
    An arrow per move of `pyspec_ref.kvcache.compact_plan` (src -> dst); rows that stay put
    have none. Node ids are written in the cells while they fit.
    """
    parents, path = list(parents), list(verified_path)
    r = spec.reroot(parents, path)
    start, _ = pyspec_ref.dfs_times(parents)
    n = len(parents)
    used = prefix_len + n
    node_at = {prefix_len + start[v]: v for v in range(n)}
    committed, kept = set(r["prefix_nodes"]), set(r["kept"])
    moves = spec.compact_plan(prefix_len, parents, path)
    new_used = prefix_len + len(committed) + len(kept)
    ax = new_ax(ax, (min(16, max(6, 0.42 * used + 1.5)), 3.4))
    label = used <= 40

    def colour(slot):
        if slot < prefix_len:
            return PREFIX
        v = node_at[slot]
        return COMMITTED if v in committed else KEPT if v in kept else DISCARDED

    sources = spec.apply_moves(list(range(used)), moves)
    for slot in range(used):
        ax.add_patch(Rectangle((slot, 1.6), 1, 0.8, fc=colour(slot), ec="white", lw=1.2))
        if slot < new_used:
            src = sources[slot]
            ax.add_patch(Rectangle((slot, 0), 1, 0.8, fc=colour(src), ec="white", lw=1.2))
        else:
            ax.add_patch(Rectangle((slot, 0), 1, 0.8, fc=FREE, ec=GREY, lw=0.6, ls=":"))
        if label:
            if slot >= prefix_len:
                ax.text(slot + 0.5, 2.0, str(node_at[slot]), ha="center", va="center", fontsize=8, color=INK)
            if prefix_len <= slot < new_used and sources[slot] >= prefix_len:
                ax.text(slot + 0.5, 0.4, str(node_at[sources[slot]]), ha="center", va="center", fontsize=8,
                        color=INK)
    for src, dst in moves:
        ax.add_patch(FancyArrowPatch((src + 0.5, 1.58), (dst + 0.5, 0.82), arrowstyle="-|>", mutation_scale=8,
                                     color=INK, lw=0.8, alpha=0.75))
    ax.axvline(prefix_len, color=INK, lw=1.2, ymin=0.5, ymax=1.0)
    ax.axvline(new_used - len(kept), color=INK, lw=1.2, ymin=0.0, ymax=0.45)
    ax.set_xlim(-0.3, used + 0.3)
    ax.set_ylim(-0.6, 3.0)
    ax.set_yticks([0.4, 2.0], ["after", "before"])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("cache slot")
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    handles = [Patch(fc=PREFIX, label="prefix"), Patch(fc=COMMITTED, label="committed (verified path)"),
               Patch(fc=KEPT, label="kept subtree (new root first)"), Patch(fc=DISCARDED, label="discarded"),
               Patch(fc=FREE, ec=GREY, ls=":", label="free")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=5, frameon=False,
              fontsize=8)
    ax.set_title(title or f"[prefix | tree] before and after re-rooting: {len(moves)} rows move, "
                 f"{n - len(committed) - len(kept)} discarded", fontsize=10)
    return ax


def draw_nonsquare_mask(mask, prefix_len: int, query_labels: Sequence | None = None, ax=None, title=None):
    """A w x (P + N) mask (`pyspec_ref.kvcache.nonsquare_tree_mask`): visible dark, hidden light,
    the prefix columns tinted and separated from the tree columns by a line."""
    m = as_mask(mask, square=False)
    rows, cols = m.shape
    ax = new_ax(ax, (min(16, max(5, 0.3 * cols + 1.5)), max(2.2, 0.35 * rows + 1.4)))
    image = m.astype(int) + 2 * ((np.arange(cols) < prefix_len)[None, :] & m)
    ax.imshow(image, cmap=ListedColormap([HIDDEN, VISIBLE, SKY, BLUE]), vmin=0, vmax=3,
              interpolation="nearest", aspect="auto")
    cell_grid(ax, rows, cols)
    ax.axvline(prefix_len - 0.5, color=VERMILLION, lw=1.5)
    if query_labels is not None:
        ax.set_yticks(range(rows), [str(x) for x in query_labels])
    ax.set_xlabel(f"key: prefix slots 0..{prefix_len - 1} | tree slots (DFS order)")
    ax.set_ylabel("query node")
    ax.set_title(title or f"non-square mask: {rows} queries x {cols} keys", fontsize=10)
    ax.legend(handles=[Patch(fc=BLUE, label="prefix (always visible)"), Patch(fc=VISIBLE, label="ancestor"),
                       Patch(fc=HIDDEN, ec=GREY, lw=0.5, label="hidden")],
              loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, frameon=False, fontsize=8)
    return ax


def _titled(fig, title: str, note: str | None):
    """The figure with its title (and the note, say where it was measured) above its panels."""
    fig.suptitle(f"{title} ({note})" if note else title, fontsize=11)
    fig.tight_layout()
    return fig


def _rows(rows, figure: str) -> list[dict]:
    if isinstance(rows, dict) or not isinstance(rows, Sequence):
        raise ValueError("rows must be a list of dicts (a results JSON's rows)")
    return [r for r in rows if isinstance(r, dict) and r.get("figure") == figure and r.get("median_ms")]


def compaction_figure(rows, title: str | None = None, note: str | None = None):
    """Compaction kernel vs gather-and-copy from `course.topics.kvcache.bench` rows (figure "compaction"):
    time against the number of moved rows, one panel per model, one line per (method, cache size C)."""
    chosen = _rows(rows, "compaction")
    if not chosen:
        raise ValueError("rows hold no measured 'compaction' row")
    models = sorted({r["model"] for r in chosen})
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [r for r in chosen if r["model"] == model]
        for name, colour in (("compact", BLUE), ("naive", GREY)):
            for c, style in zip(sorted({r["C"] for r in mine}), ("o-", "s--", "^:"), strict=False):
                pts = sorted((r["moves"], r["median_ms"] * 1e3) for r in mine
                             if r["name"] == name and r["C"] == c)
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, color=colour, label=f"{name}, C = {c}")
        ax.set(xlabel="rows moved per stacked row (sum over samples)", ylabel="time (µs)", title=model)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _titled(fig, title or "SwiftSpec compaction: in-place kernel vs gather-and-copy", note)


def attention_figure(rows, title: str | None = None, note: str | None = None):
    """Non-square attention vs dense-mask SDPA (and the square notebook-12 kernel) from
    `course.topics.kvcache.bench` rows (figure "attention"): one group of bars per workload."""
    chosen = _rows(rows, "attention")
    if not chosen:
        raise ValueError("rows hold no measured 'attention' row")
    workloads = list(dict.fromkeys(r["workload"] for r in chosen))
    names = list(dict.fromkeys(r["name"] for r in chosen))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(workloads) + 2), 3.8))
    width = 0.8 / len(names)
    colours = [BLUE, GREY, ORANGE, GREEN]
    for i, name in enumerate(names):
        values = [next((r["median_ms"] * 1e3 for r in chosen if r["workload"] == w and r["name"] == name),
                       np.nan) for w in workloads]
        ax.bar(np.arange(len(workloads)) + (i - (len(names) - 1) / 2) * width, values, width,
               color=colours[i % len(colours)], label=name)
    ax.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("time (µs)")
    ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _titled(fig, title or "w queries against [prefix | tree]: non-square kernel vs alternatives", note)


EMSSD_KEYS = ("name", "B", "median_ms", "kv_bytes")


def _emssd_rows(rows) -> dict[tuple[str, int], dict]:
    """{(name, B): row} of the measured EMS-SD rows ("padded" / "unpadded"), checked."""
    if isinstance(rows, dict) or not isinstance(rows, Sequence):
        raise ValueError("rows must be a list of dicts (a results JSON's rows)")
    by: dict[tuple[str, int], dict] = {}
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"rows[{i}] must be a dict, got {type(r).__name__}")
        if r.get("study") != "emssd" or r.get("error") or r.get("median_ms") is None:
            continue  # another study's row, or a failed measurement
        missing = [k for k in EMSSD_KEYS if k not in r]
        if missing:
            raise ValueError(f"rows[{i}] (an EMS-SD row) lacks {missing}: each needs {list(EMSSD_KEYS)}")
        if r["name"] in ("padded", "unpadded"):
            by[r["name"], int(r["B"])] = r
    return by


def emssd_figure(rows, title: str | None = None, note: str | None = None):
    """EMS-SD's padded vs unpadded batch from `course.topics.kvcache.bench` rows (study "emssd"), in the
    manner of the paper's Figure 1: against the batch size B, the attention step's median time
    both ways (left), the speed-up padded / unpadded (middle) and the KV cache held (right).

    Rows of other studies and rows with an "error" are skipped; only batch sizes measured both
    ways are drawn. Refused (ValueError): rows that are not a list of dicts, an EMS-SD row without
    name / B / median_ms / kv_bytes, and rows with no B measured both ways.
    """
    by = _emssd_rows(rows)
    batches = sorted({b for _, b in by if ("padded", b) in by and ("unpadded", b) in by})
    if not batches:
        raise ValueError("rows hold no batch size measured both padded and unpadded (study 'emssd')")
    fig, (times, speedup, memory) = plt.subplots(1, 3, figsize=(14, 3.6))
    for name, colour in (("padded", VERMILLION), ("unpadded", BLUE)):
        times.plot(batches, [by[name, b]["median_ms"] * 1e3 for b in batches], "o-", color=colour, label=name)
        memory.plot(batches, [by[name, b]["kv_bytes"] / 2**20 for b in batches], "o-", color=colour,
                    label=name)
    speedup.plot(batches, [by["padded", b]["median_ms"] / by["unpadded", b]["median_ms"] for b in batches],
                 "o-", color=INK)
    speedup.axhline(1.0, color=GREY, lw=0.8, ls="--")
    times.set(ylabel="median time (µs)", title="attention step")
    speedup.set(ylabel="padded time / unpadded time", title="speed-up of unpadding")
    memory.set(ylabel="KV cache (MiB)", title="KV cache held")
    for ax in (times, speedup, memory):
        ax.set(xscale="log", xlabel="batch size B")
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(alpha=0.3)
    times.legend(fontsize=8)
    memory.legend(fontsize=8)
    return _titled(fig, title or "EMS-SD: padded vs unpadded multi-sample batches", note)


def _measured(draw):
    """`draw(rows, note=...)` as a function of a kvcache.json document, labelled with its device."""
    def drawn(document: dict):
        return draw(document["rows"], note=f"measured on {document['device']}, {document['date'][:10]}")
    return drawn


FIGURES = {"emssd": _measured(emssd_figure), "swiftspec_compaction": _measured(compaction_figure),
           "swiftspec_attention": _measured(attention_figure)}
