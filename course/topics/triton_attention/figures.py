"""Figures of notebook 12 (Triton tree attention): the kernel at FlashSpecInfer's shape against
SDPA, FlexAttention and rung 11 (`python -m course figures triton_attention` writes
triton_attention.png)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from course.measure import plots


def measured_figure(document: dict):
    """triton_attention.png: the "paper" rows of triton_attention.json as bars, relative to SDPA."""
    paper = [r for r in document["rows"] if r.get("figure") == "paper"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    title = f"notebook 12 at (B, H, N, d) = (10, 10, 1024, 64) on {document['device']}"
    plots.results_bar(paper, title=title, baseline="sdpa_dense_fp16", ax=ax)
    fig.tight_layout()
    return fig


FIGURES = {"triton_attention": measured_figure}
