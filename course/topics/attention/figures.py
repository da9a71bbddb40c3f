"""Figures of notebook 02 (attention): the tiled algorithm in PyTorch against SDPA
(`python -m course figures attention` writes attention.png beside attention.json)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from course.measure import plots

MEASURED_AT = {"B": 10, "H": 10, "N": 1024, "d": 64}  # FlashSpecInfer's shape, as in the ladder


def measured_figure(document: dict):
    """attention.png: flash_attention's time at MEASURED_AT against SDPA's."""
    rows = [row for row in document["rows"] if all(row[key] == value for key, value in MEASURED_AT.items())]
    fig, ax = plt.subplots(figsize=(8, 2.4))
    shape = ", ".join(str(value) for value in MEASURED_AT.values())
    plots.results_bar(rows, ax=ax, baseline="sdpa", title=f"notebook 02 at (B, H, N, d) = ({shape}) on "
                                                          f"{document['device']}")
    return fig


FIGURES = {"attention": measured_figure}
