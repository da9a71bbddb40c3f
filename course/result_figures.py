"""Figures of the committed measurements, as PNGs next to their JSON: `python -m course.result_figures`.

The ladder has its own (`course.topics.ladder.figures`), SwiftSpec's and the capstone's benches draw theirs
when they run; this module draws those of the other suites from `results/<device>/*.json`, so
that every committed measurement has its picture (the notebooks draw the same data in their cells):

* sampling.json: notebook 15's kernels against the PyTorch baseline and the read-once floor at the
  headline size (gamma = 5, V = 128256), launched eagerly and as CUDA graphs; notebook 16's tree
  against chain verification;
* deft.json: every DeFT workload's attention time per method, against the read-once floor;
* triton.json: notebook 12's kernel at FlashSpecInfer's shape against SDPA, FlexAttention and rung 11;
* kvcache.json (EMS-SD study): padded against unpadded attention as the batch grows (time and KV
  bytes), in the manner of EMS-SD's Figure 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display
import matplotlib.pyplot as plt  # noqa: E402

from course.measure import benchcli, plots, results  # noqa: E402
from course.topics.kvcache import figures as kv_plots
from course.topics.sampling.bench import HEADLINE  # noqa: E402

COLOURS = [plots.BLUE, plots.ORANGE, plots.GREEN, plots.VERMILLION, plots.SKY, plots.GREY, plots.INK]


def _us(row: dict) -> float:
    return 1e3 * row["median_ms"]


def sampling_figure(rows: list[dict], device: str):
    """Median time per implementation against B, eager (left) and as CUDA graphs (right)."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for ax, section in zip(axes[:2], ("timing", "graphs"), strict=True):
        mine = [r for r in rows if r.get("section", "timing") == section
                and r.get("gamma") == HEADLINE["gamma"] and r.get("V") == HEADLINE["V"]]
        lines = sorted({(r["name"], r["input"]) for r in mine})
        for colour, (name, source) in zip(COLOURS * 2, lines, strict=False):
            points = sorted((r["B"], _us(r)) for r in mine if (r["name"], r["input"]) == (name, source))
            style = "--" if name == "read_once_floor" else "-"
            ax.plot(*zip(*points, strict=True), style, marker="o", color=colour, label=f"{name} ({source})")
        ax.set(xscale="log", yscale="log", xlabel="batch B", ylabel="median time (µs)",
               title=f"speculative sampling, γ = {HEADLINE['gamma']}, V = {HEADLINE['V']}: "
                     + ("launched eagerly" if section == "timing" else "as CUDA graphs"))
        ax.legend(fontsize=7)
    tree = [r for r in rows if r.get("section") == "verification"]
    names = sorted({r["name"] for r in tree})
    batches = sorted({r["B"] for r in tree})
    width = 0.8 / max(len(names), 1)
    for i, (colour, name) in enumerate(zip(COLOURS * 2, names, strict=False)):
        values = [next((_us(r) for r in tree if r["name"] == name and r["B"] == b), 0.0) for b in batches]
        axes[2].bar([j + i * width for j in range(len(batches))], values, width, color=colour, label=name)
    axes[2].set(xticks=[j + 0.4 - width / 2 for j in range(len(batches))],
                xticklabels=[f"B = {b}" for b in batches], yscale="log", ylabel="median time (µs)",
                title="notebook 16: a 64-node tree vs a chain of γ = 8")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"measured on {device}", fontsize=9)
    fig.tight_layout()
    return fig


def deft_figure(rows: list[dict], device: str):
    """Per workload, each method's time relative to the read-once floor (log scale), and the
    compute floor (the attention's FLOPs at the measured matmul rate) as a black tick."""
    left_out = ("copy", "matmul", "deft_flatten_sweep", "deft_flatten_tiles")  # not methods of a workload
    timed = [r for r in rows if r["name"] not in left_out and r.get("median_ms")]
    workloads = list(dict.fromkeys(r["workload"] for r in timed))
    methods = [m for m in dict.fromkeys(r["name"] for r in timed) if m not in ("read_once", "compute_floor")]
    fig, ax = plt.subplots(figsize=(max(10, 1.1 * len(workloads)), 4.5))
    width = 0.8 / len(methods)
    for i, (colour, method) in enumerate(zip(COLOURS * 2, methods, strict=False)):
        values = []
        for w in workloads:
            at = {r["name"]: r["median_ms"] for r in timed if r["workload"] == w}
            floor, mine = at.get("read_once"), at.get(method)
            values.append(mine / floor if mine and floor else 0.0)
        ax.bar([j + i * width for j in range(len(workloads))], values, width, color=colour, label=method)
    for j, w in enumerate(workloads):
        at = {r["name"]: r["median_ms"] for r in timed if r["workload"] == w}
        if at.get("compute_floor") and at.get("read_once"):
            ax.hlines(at["compute_floor"] / at["read_once"], j - width / 2, j + 0.8 - width / 2,
                      color=plots.INK, linewidth=2, label="compute floor" if j == 0 else None)
    ax.axhline(1.0, color=plots.INK, linewidth=0.8)
    ax.set(xticks=[j + 0.4 - width / 2 for j in range(len(workloads))], yscale="log",
           ylabel="time / KV read-once floor",
           title=f"DeFT workloads (fp16, 32/8 heads, d = 128) on {device}")
    ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not over them
    fig.tight_layout()
    return fig


def triton_figure(rows: list[dict], device: str):
    paper = [r for r in rows if r.get("figure") == "paper"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    plots.results_bar(paper, title=f"notebook 12 at (B, H, N, d) = (10, 10, 1024, 64) on {device}",
                      baseline="sdpa_dense_fp16", ax=ax)
    fig.tight_layout()
    return fig


def emssd_figure(rows: list[dict], device: str):
    """EMS-SD's Figure 1, our way: `course.topics.kvcache.figures.emssd_figure` (notebook 17 draws the
    same)."""
    return kv_plots.emssd_figure(rows, note=f"measured on {device}")


FIGURES = {
    "sampling": (sampling_figure, "sampling.png"),
    "deft": (deft_figure, "deft.png"),
    "triton": (triton_figure, "triton.png"),
    "kvcache": (emssd_figure, "emssd.png"),
}


def write(suite: str) -> Path:
    """Draw `suite`'s figure from its committed results; returns the PNG's path."""
    draw, file_name = FIGURES[suite]
    document = results.load_measured(suite)
    path = results.RESULTS / results.device_folder(document["device"]) / file_name
    fig = draw(document["rows"], document["device"])
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchcli.add_sections(parser, FIGURES)
    args = parser.parse_args(argv)
    for suite in benchcli.chosen_sections(parser, args, FIGURES):
        print("wrote", write(suite))
    return 0


if __name__ == "__main__":
    sys.exit(main())
