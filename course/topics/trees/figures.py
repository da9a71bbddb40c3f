"""Figures of notebook 01 (token trees): the measured mask kernels against the torch reference
(`python -m course figures trees` writes trees.png beside trees.json)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from course.measure import plots

MEASURED_AT = {"B": 64, "N": 1024}  # the size of the figure: the largest of the bench's batches


def measured_figure(document: dict):
    """trees.png: each launcher's time at MEASURED_AT, against the torch dense mask."""
    rows = [row for row in document["rows"] if all(row[key] == value for key, value in MEASURED_AT.items())]
    fig, ax = plt.subplots(figsize=(8, 3))
    title = f"notebook 01 at B = {MEASURED_AT['B']}, N = {MEASURED_AT['N']} on {document['device']}"
    plots.results_bar(rows, ax=ax, baseline="torch_dense_mask", title=title)
    return fig


FIGURES = {"trees": measured_figure}
