"""Figures of notebook 16 (token-tree verification): the measured tree against chain verification
(`python -m course figures verification` writes verification.png beside verification.json)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from course.measure.plots import SERIES
from course.topics.verification.bench import TARGET_RATIO, targets


def verification_rows(rows: list[dict]) -> list[dict]:
    """Notebook 16's rows of verification.json."""
    return [row for row in rows if row.get("section") == "verification"]


def draw_tree_vs_chain(ax, rows: list[dict]):
    """Bars per B: each verification method's median time, a 64-node tree against chains."""
    tree = verification_rows(rows)
    names = sorted({r["name"] for r in tree})
    batches = sorted({r["B"] for r in tree})
    width = 0.8 / max(len(names), 1)
    for i, (colour, name) in enumerate(zip(SERIES * 2, names, strict=False)):
        values = [next((1e3 * r["median_ms"] for r in tree if r["name"] == name and r["B"] == b), 0.0)
                  for b in batches]
        ax.bar([j + i * width for j in range(len(batches))], values, width, color=colour, label=name)
    ax.set(xticks=[j + 0.4 - width / 2 for j in range(len(batches))],
           xticklabels=[f"B = {b}" for b in batches], yscale="log", ylabel="median time (µs)",
           title="notebook 16: a 64-node tree vs a chain of γ = 8")
    ax.legend(fontsize=7)
    return ax


def measured_figure(document: dict):
    """verification.png: `draw_tree_vs_chain` of a verification.json document."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    draw_tree_vs_chain(ax, document["rows"])
    fig.suptitle(f"measured on {document['device']}", fontsize=9)
    fig.tight_layout()
    return fig


FIGURES = {"verification": measured_figure}


def summary(document: dict) -> str:
    """Per B and comparison: tree time against chain time, and whether it is within TARGET_RATIO."""
    lines = []
    for target in targets(verification_rows(document["rows"])):
        state = "met" if target["met"] else "NOT met"
        lines.append(f"{target['method']:24s} B={target['B']:3d}: tree {target['tree_ms'] * 1e3:8.1f} us, "
                     f"chain {target['chain_ms'] * 1e3:8.1f} us, ratio {target['ratio']:.2f} (target <= "
                     f"{TARGET_RATIO}: {state})")
    return "\n".join(lines)
