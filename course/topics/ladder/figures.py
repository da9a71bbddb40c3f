"""FlashSpecInfer §6 from our own measurements: the targets and the figures of a ladder.json document.

Pure functions of a results document (the shared schema of `course.measure.results`, written by
`python -m course bench ladder`): no GPU is needed, so a student without one plots the committed
measurements. Rows are picked by their `figure` field:

  ladder   every rung and both baselines at (B, H, N, d) = (10, 10, 1024, 64)   Figures 3 and 8
  dense    rung 8 with the interval test and with a dense mask, across N        Figure 5
  pytorch  rungs 8 and up against SDPA and FlexAttention, across N and B        Figures 6 and 7
  memory   the interval kernels at a size whose dense mask cannot be allocated  §6.1

`python -m course figures ladder` saves ladder_fig3.png, ladder_fig5.png, ladder_fig67.png and
ladder_fig8.png next to the committed ladder.json (`--results PATH` for another one).
A document that lacks the rows or fields a function needs gives a ValueError naming them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from course.measure import plots, results
from course.measure.plots import BLUE, GREEN, GREY, INK, ORANGE, SKY, VERMILLION, int_vector, new_ax, style_ax
from course.topics.ladder import rungs as ladder
from course.topics.ladder.bench import BASELINES, PAPER_SHAPE

SDPA, FLEX = "sdpa_dense_fp32", "flex_fp32"
DENSE = "k8_dense"  # rung 8 reading a dense mask: the ablation of Figure 5, not a step of the ladder
PAPER_LAST = "k8"  # FlashSpecInfer's ladder ends here; the rungs after it go beyond the paper
ROW_FIGURES = ("ladder", "dense", "pytorch", "memory")  # the rows' "figure" field
ROW_FIELDS = ("name", "figure", "B", "H", "N", "d", "order", "median_ms")
MEMORY_FIELDS = ("dense_mask_bytes", "dense_mask_allocated", "gpu_bytes")
INT32 = 4  # bytes of one DFS time

# The ladder's targets (benchmarks: met or not met, computed from the data, never asserted).
SPEEDUP_TARGET = 30.0  # rung 1 -> rung 8 at the paper's shape (the paper: about 200 ms -> 7 ms)
K8_VS_SDPA = 1.5  # rung 8 within this factor of SDPA's time (the paper: 1.4-1.75x of PyTorch)
BEYOND_VS_SDPA = 0.5  # the best rung beyond the paper: at most this fraction of SDPA's time
SMALL_N = 256  # at B = 1 and N up to this, rung 8 faster than both baselines

assert set(BASELINES) == {SDPA, FLEX} and DENSE in ladder.BY_NAME and PAPER_LAST in ladder.BY_NAME

# ----------------------------------------------------------------------------- rows


def paper_rungs() -> list[str]:
    """FlashSpecInfer's eight rungs, in ladder order (from course.topics.ladder.rungs.RUNGS)."""
    names = [rung.name for rung in ladder.RUNGS]
    return [name for name in names[:names.index(PAPER_LAST) + 1] if name != DENSE]


def beyond_rungs() -> list[str]:
    """The rungs after the paper's last one, except the dense-mask ablation (k9, k10, ...)."""
    names = [rung.name for rung in ladder.RUNGS]
    return [name for name in names[names.index(PAPER_LAST) + 1:] if name != DENSE]


def _check(document) -> dict:
    """The shared schema, plus the fields every row of this suite needs."""
    results.validate(document, "ladder document")
    for index, row in enumerate(document["rows"]):
        missing = [key for key in ROW_FIELDS if key not in row]
        if missing:
            raise ValueError(f"ladder document: rows[{index}] ({row.get('name')!r}) has no "
                             f"{', '.join(map(repr, missing))}")
        if row["figure"] not in ROW_FIGURES:
            raise ValueError(f"ladder document: rows[{index}].figure must be one of {ROW_FIGURES}, "
                             f"got {row['figure']!r}")
    return document


def _shape(row) -> tuple[int, int, int, int]:
    return row["B"], row["H"], row["N"], row["d"]


def _rows(document, figure: str, **match) -> list[dict]:
    return [row for row in _check(document)["rows"] if row["figure"] == figure
            and all(row[key] == value for key, value in match.items())]


def _one(document, figure: str, name: str, order: str = "bfs", **match) -> dict:
    found = _rows(document, figure, name=name, order=order, **match)
    if not found:
        where = ", ".join(f"{key}={value}" for key, value in match.items())
        raise ValueError(f"the ladder document has no {figure!r} row for {name!r} in {order} order"
                         + (f" at {where}" if where else ""))
    return found[0]


def label(row) -> str:
    """A row's name, with its numbering when it is not the benchmark's default (BFS)."""
    return row["name"] if row["order"] == "bfs" else f"{row['name']} ({row['order'].upper()})"


def describe(document) -> str:
    """'NVIDIA H100 80GB HBM3, 2026-11-23': what a figure's title says the numbers come from."""
    _check(document)
    return f"{document['device']}, {document['date'][:10]}"


def ladder_rows(document) -> list[dict]:
    """Figure 3's rows at the paper's shape: the rungs in ladder order (each numbering measured),
    then the baselines; each with a "label". The paper's rungs and both baselines must be there;
    rungs beyond the paper are shown when measured."""
    batch, heads, n, d = PAPER_SHAPE
    at = dict(B=batch, H=heads, N=n, d=d)
    for name in paper_rungs() + list(BASELINES):
        _one(document, "ladder", name, **at)  # raises, naming the missing row
    rows = []
    for name in [rung.name for rung in ladder.RUNGS] + list(BASELINES):
        found = _rows(document, "ladder", name=name, **at)
        found.sort(key=lambda row: row["order"] != "bfs")  # BFS first
        rows += [dict(row, label=label(row)) for row in found]
    return rows


def steps(document) -> list[dict]:
    """The speed-up of each rung over the rung it edits (course.topics.ladder.rungs), at the paper's
    shape, BFS."""
    ms = {row["name"]: row["median_ms"] for row in ladder_rows(document) if row["order"] == "bfs"}
    out = []
    for rung in ladder.RUNGS:
        if rung.previous and rung.name in ms:
            previous = ladder.BY_MODULE[rung.previous].name
            out.append({"name": rung.name, "previous": previous, "change": rung.change,
                        "median_ms": ms[rung.name], "previous_ms": ms[previous],
                        "speedup": ms[previous] / ms[rung.name]})
    return out


# ----------------------------------------------------------------------------- targets


def targets(document) -> list[dict]:
    """The ladder's four targets, each {"target", "measured", "values", "met"}: benchmarks to
    report, computed from the data (never asserted as tests)."""
    batch, heads, n, d = PAPER_SHAPE
    at = dict(B=batch, H=heads, N=n, d=d)
    ms = {name: _one(document, "ladder", name, **at)["median_ms"]
          for name in ("k1", PAPER_LAST, SDPA, FLEX)}
    shape = f"(B, H, N, d) = {PAPER_SHAPE}"
    out = []

    speedup = ms["k1"] / ms[PAPER_LAST]
    out.append({"target": f"k1 -> {PAPER_LAST} speed-up >= {SPEEDUP_TARGET:g}x at {shape}",
                "measured": f"{speedup:.1f}x ({ms['k1']:.3g} ms -> {ms[PAPER_LAST]:.3g} ms)",
                "values": {"speedup": speedup, "k1_ms": ms["k1"], "k8_ms": ms[PAPER_LAST]},
                "met": speedup >= SPEEDUP_TARGET})

    ratio = ms[PAPER_LAST] / ms[SDPA]
    out.append({"target": f"{PAPER_LAST} within {K8_VS_SDPA:g}x of {SDPA}'s time at {shape}",
                "measured": f"{PAPER_LAST} takes {ratio:.2f}x {SDPA}'s time",
                "values": {"ratio": ratio, "k8_ms": ms[PAPER_LAST], "sdpa_ms": ms[SDPA]},
                "met": ratio <= K8_VS_SDPA})

    beyond = [row for name in beyond_rungs() for row in _rows(document, "ladder", name=name, **at)]
    if not beyond:
        raise ValueError(f"the ladder document has no 'ladder' row for any rung beyond the paper "
                         f"{beyond_rungs()} at {shape}")
    best = min(beyond, key=lambda row: row["median_ms"])
    vs_sdpa, vs_flex = best["median_ms"] / ms[SDPA], best["median_ms"] / ms[FLEX]
    unmeasured = [name for name in beyond_rungs() if name not in {row["name"] for row in beyond}]
    out.append({"target": f"best rung beyond the paper ({', '.join(beyond_rungs())}) at most "
                          f"{BEYOND_VS_SDPA:g}x {SDPA}'s time and faster than {FLEX}, at {shape}",
                "measured": f"{label(best)}: {vs_sdpa:.2f}x {SDPA}'s time, {vs_flex:.2f}x {FLEX}'s"
                            + (f" (no rows yet for {', '.join(unmeasured)})" if unmeasured else ""),
                "values": {"best": label(best), "best_ms": best["median_ms"], "vs_sdpa": vs_sdpa,
                           "vs_flex": vs_flex, "unmeasured": unmeasured},
                "met": vs_sdpa <= BEYOND_VS_SDPA and vs_flex < 1})

    small = sorted({row["N"] for row in _rows(document, "pytorch", name=PAPER_LAST, order="bfs", B=1)
                    if row["N"] <= SMALL_N})
    if not small:
        raise ValueError(f"the ladder document has no 'pytorch' row for {PAPER_LAST!r} at B=1, "
                         f"N <= {SMALL_N}")
    per_n = {}
    for size in small:
        k8 = _one(document, "pytorch", PAPER_LAST, B=1, N=size)["median_ms"]
        per_n[size] = {name: _one(document, "pytorch", name, B=1, N=size)["median_ms"] / k8
                       for name in BASELINES}
    out.append({"target": f"at B = 1 and N <= {SMALL_N}, {PAPER_LAST} faster than {SDPA} and {FLEX}",
                "measured": "; ".join(f"N={size}: " + ", ".join(f"{name} / {PAPER_LAST} = {r:.2f}"
                                                                for name, r in ratios.items())
                                      for size, ratios in per_n.items()),
                "values": {"baseline_over_k8": per_n},
                "met": all(r > 1 for ratios in per_n.values() for r in ratios.values())})
    return out


# ----------------------------------------------------------------------------- tables


def dense_rows(document) -> list[dict]:
    """Figure 5's pairs: rung 8 with the interval test and with the dense mask, at each N."""
    rows = _rows(document, "dense")
    sizes = sorted({(row["B"], row["H"], row["N"], row["d"]) for row in rows})
    if not sizes:
        raise ValueError("the ladder document has no 'dense' rows (Figure 5)")
    out = []
    for batch, heads, n, d in sizes:
        at = dict(B=batch, H=heads, N=n, d=d)
        interval = _one(document, "dense", PAPER_LAST, **at)["median_ms"]
        dense = _one(document, "dense", DENSE, **at)["median_ms"]
        out.append({**at, "interval_ms": interval, "dense_ms": dense,
                    "dense_over_interval": dense / interval})
    return out


def series(document, panel: str) -> dict[str, list[tuple[int, float]]]:
    """Figures 6/7: {kernel label: [(x, median_ms), ...]} for one panel.

    panel "N": across N at the paper's B; "B": across B at the paper's N; "B1": across N at B = 1.
    """
    batch, _, n, _ = PAPER_SHAPE
    choose = {"N": ({"B": batch}, "N"), "B": ({"N": n}, "B"), "B1": ({"B": 1}, "N")}
    if panel not in choose:
        raise ValueError(f"panel must be one of {list(choose)}, got {panel!r}")
    match, x = choose[panel]
    out: dict[str, list[tuple[int, float]]] = {}
    for row in _rows(document, "pytorch", **match):
        out.setdefault(label(row), []).append((row[x], row["median_ms"]))
    if not out:
        where = ", ".join(f"{key}={value}" for key, value in match.items())
        raise ValueError(f"the ladder document has no 'pytorch' rows at {where} (Figures 6/7)")
    missing = [name for name in BASELINES if name not in out]
    if missing:
        raise ValueError(f"the ladder document's 'pytorch' rows for panel {panel!r} lack {missing}")
    order = {name: i for i, name in enumerate([r.name for r in ladder.RUNGS] + list(BASELINES))}
    return {key: sorted(out[key]) for key in sorted(out, key=lambda k: (order.get(k.split()[0], 99), k))}


def resource_rows(document) -> list[dict]:
    """Figure 8's points: each rung at the paper's shape (BFS) with its shared bytes per block,
    registers per thread, threads per block and runtime."""
    rows = [row for row in ladder_rows(document) if row["name"] in ladder.BY_NAME and row["order"] == "bfs"]
    for row in rows:
        missing = [key for key in ("shared_bytes", "registers", "threads") if key not in row]
        if missing:
            raise ValueError(f"the ladder document's 'ladder' row for {row['name']!r} has no "
                             f"{', '.join(map(repr, missing))} (Figure 8)")
    return [{key: row[key] for key in ("name", "shared_bytes", "registers", "threads", "median_ms")}
            for row in rows]


def memory_table(document) -> list[dict]:
    """§6.1's table, extended: for every measured size, the dense mask's B * N^2 bytes against the
    interval times' 2 * B * N * 4, whether the dense mask was allocated, and the runtimes there.

    Figure 5's sizes allocated the mask (rung 8's dense variant ran on it); the memory rows record
    an attempt to allocate it on the GPU, and the interval kernels that ran without it.
    """
    table = []
    for row in dense_rows(document):
        batch, n = row["B"], row["N"]
        table.append({"B": batch, "H": row["H"], "N": n, "dense_mask_bytes": batch * n * n,
                      "interval_bytes": 2 * batch * n * INT32, "dense_allocated": True, "gpu_bytes": None,
                      "runtimes_ms": {PAPER_LAST: row["interval_ms"], DENSE: row["dense_ms"]}})
    memory = _rows(document, "memory")
    if not memory:
        raise ValueError("the ladder document has no 'memory' rows (§6.1)")
    for row in memory:
        missing = [key for key in MEMORY_FIELDS if key not in row]
        if missing:
            raise ValueError(f"the ladder document's 'memory' row for {row['name']!r} has no "
                             f"{', '.join(map(repr, missing))}")
    for shape in sorted({_shape(row) for row in memory}):
        rows = [row for row in memory if _shape(row) == shape]
        batch, heads, n, _ = shape
        table.append({"B": batch, "H": heads, "N": n, "dense_mask_bytes": rows[0]["dense_mask_bytes"],
                      "interval_bytes": 2 * batch * n * INT32,
                      "dense_allocated": bool(rows[0]["dense_mask_allocated"]),
                      "gpu_bytes": rows[0]["gpu_bytes"],
                      "runtimes_ms": {label(row): row["median_ms"] for row in rows}})
    return table


# ----------------------------------------------------------------------------- figures


def _title(document, text: str) -> str:
    return f"{text}\n{describe(document)}"


def fig3(document, ax=None):
    """Figure 3: every rung and both baselines at the paper's shape, speed-ups over rung 1."""
    batch, heads, n, d = PAPER_SHAPE
    return plots.results_bar(ladder_rows(document), ax=ax, label_key="label", baseline="k1",
                             title=_title(document, f"the ladder at B={batch}, H={heads}, N={n}, d={d}"))


def fig5(document):
    """Figure 5: rung 8 with the interval test and with a dense N x N mask, across N."""
    rows = dense_rows(document)
    n = [row["N"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    left.plot(n, [row["interval_ms"] for row in rows], "o-", color=BLUE, label=f"{PAPER_LAST}: 2N DFS times")
    left.plot(n, [row["dense_ms"] for row in rows], "s--", color=VERMILLION, label=f"{DENSE}: N x N mask")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xticks(n, [str(x) for x in n])
    left.minorticks_off()
    left.set_xlabel("tree size N")
    left.set_ylabel("median ms (log)")
    left.legend(frameon=False, fontsize=8.5)
    style_ax(left, _title(document, f"interval test vs dense mask, B={rows[0]['B']}, H={rows[0]['H']}"),
           grid_axis="y")
    ratios = [row["dense_over_interval"] for row in rows]
    right.bar(range(len(n)), ratios, color=VERMILLION, width=0.6, zorder=2)
    right.axhline(1, color=INK, linewidth=1)
    for i, r in enumerate(ratios):
        right.text(i, r, f"{r:.2f}x", ha="center", va="bottom", fontsize=9, color=INK)
    right.set_xticks(range(len(n)), [str(x) for x in n])
    right.set_ylim(0, max(ratios) * 1.2)
    right.set_xlabel("tree size N")
    right.set_ylabel("dense time / interval time")
    style_ax(right, "what the dense mask costs", grid_axis="y")
    return fig


_LOOK = {SDPA: (GREY, "s", "-"), FLEX: (ORANGE, "D", "-")}
_RUNG_COLORS = (BLUE, GREEN, SKY, VERMILLION, "#CC79A7", INK)


def _look(key: str, rungs: list[str]):
    name = key.split()[0]
    if name in _LOOK:
        return _LOOK[name]
    color = _RUNG_COLORS[rungs.index(name) % len(_RUNG_COLORS)]
    return color, "o", "--" if "(DFS)" in key else "-"


def fig67(document):
    """Figures 6 and 7: the kernels against PyTorch across N (B = 10), across B (N = 1024) and,
    for small trees, across N at B = 1."""
    batch, heads, n, d = PAPER_SHAPE
    panels = {"N": f"across N (B={batch})", "B": f"across B (N={n})", "B1": "across N at B=1"}
    data = {panel: series(document, panel) for panel in panels}
    rungs = sorted({key.split()[0] for lines in data.values() for key in lines if key.split()[0]
                    in ladder.BY_NAME}, key=[r.name for r in ladder.RUNGS].index)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4), layout="constrained")
    handles = {}
    for ax, (panel, title) in zip(axes, panels.items(), strict=True):
        xs = set()
        for key, points in data[panel].items():
            color, marker, style = _look(key, rungs)
            x, y = zip(*points, strict=True)
            xs.update(x)
            (line,) = ax.plot(x, y, marker=marker, linestyle=style, color=color, markersize=4.5,
                              linewidth=1.6, label=key)
            handles.setdefault(key, line)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted(xs)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("batch size B" if panel == "B" else "tree size N")
        ax.set_ylabel("median ms (log)")
        style_ax(ax, title, grid_axis="y")
    fig.suptitle(f"tree attention vs PyTorch, H={heads}, d={d}: {describe(document)}", x=0.01,
                 ha="left", fontsize=11, fontweight="bold", color=INK)
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=len(handles),
               frameon=False, fontsize=8.5)
    return fig


def _label_points(ax, xs, ys, texts):
    """Each point's text beside it, at the first of a few offsets that overlaps no text placed
    before it and no other point (close rungs otherwise print over each other)."""
    renderer = ax.figure.canvas.get_renderer()
    to_display = ax.transData.transform
    dots = [to_display((x, y)) for x, y in zip(xs, ys, strict=True)]
    taken = []
    offsets = [(5, 2, "left"), (5, -11, "left"), (-5, 2, "right"), (-5, -11, "right"), (5, 12, "left"),
               (-5, 12, "right"), (5, -21, "left"), (-5, -21, "right")]
    for i in sorted(range(len(texts)), key=lambda i: -ys[i]):
        for dx, dy, align in offsets:
            text = ax.annotate(texts[i], (xs[i], ys[i]), xytext=(dx, dy), textcoords="offset points",
                               ha=align, fontsize=8.5, color=INK)
            box = text.get_window_extent(renderer).expanded(1.05, 1.1)
            clear = not any(box.overlaps(other) for other in taken) and not any(
                box.contains(px, py) for j, (px, py) in enumerate(dots) if j != i)
            if clear or (dx, dy, align) == offsets[-1]:
                taken.append(box)
                break
            text.remove()


def fig8(document):
    """Figure 8: shared memory per block (left) and registers per thread (right) against runtime,
    one point per rung at the paper's shape."""
    rows = resource_rows(document)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    y = [row["median_ms"] for row in rows]
    names = [row["name"] for row in rows]
    for ax, key, scale, xlabel in ((axes[0], "shared_bytes", 1024, "static shared memory per block (KiB)"),
                                   (axes[1], "registers", 1, "registers per thread")):
        x = np.array([row[key] for row in rows]) / scale
        ax.scatter(x, y, s=36, color=BLUE, zorder=3)
        ax.set_yscale("log")
        pad = max(0.05 * x.max(), (x.max() - x.min()) * 0.12)
        ax.set_xlim(x.min() - pad, x.max() + pad)
        ax.set_ylim(min(y) / 1.4, max(y) * 1.4)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("median ms (log)")
        style_ax(ax, None, grid_axis="y")
        _label_points(ax, list(x), y, names)
    batch, heads, n, d = PAPER_SHAPE
    style_ax(axes[0], _title(document, f"shared memory per block vs runtime, B={batch}, H={heads}, N={n}, "
                                     f"d={d}"))
    style_ax(axes[1], "registers per thread vs runtime")
    return fig


def _as_figure(draw):
    """`draw` (a function of the document returning a Figure or an Axes) as one returning a Figure."""
    def drawn(document) -> plt.Figure:
        found = draw(_check(document))
        return found if isinstance(found, plt.Figure) else found.figure
    return drawn


FIGURES = {"ladder_fig3": _as_figure(fig3), "ladder_fig5": _as_figure(fig5),
           "ladder_fig67": _as_figure(fig67), "ladder_fig8": _as_figure(fig8)}


def summary(document) -> str:
    """Each target of the ladder, met or not, with what was measured."""
    return "\n".join(f"{'met    ' if target['met'] else 'NOT met'}  {target['target']}: {target['measured']}"
                     for target in targets(document))


# ----------------------------------------------------------------------------- shared memory


def draw_bank_access(word_addresses, ax=None, title=None):
    """One warp's shared-memory access: which bank each thread's word falls in, pass by pass.

    Columns are the 32 banks; each row of cells is one pass the hardware needs. A cell
    shows the thread number(s) served; threads reading the same word share a cell (a
    broadcast). One row means no bank conflict; k rows mean a k-way conflict.
    """
    words = [int(w) for w in int_vector(word_addresses, "word_addresses")]
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
