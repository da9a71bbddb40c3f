"""Figures of notebook 15 (speculative sampling): the residual and its inverse-CDF draw, the draw by
tiles, the emitted tokens against the target distribution, the sigmoid approximation's quality and
the measured times of `course.topics.sampling.bench`.

Plotting only: the algorithm's values come from `pyspec_ref.sampling` (the specification) or are
passed in. Colours are course.measure.plots' Okabe-Ito palette. Every function returns its Figure; none
calls ``plt.show()``. Arguments may be lists, NumPy arrays or (CPU or GPU) torch tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from course.measure.plots import BLUE, GREEN, GREY, INK, ORANGE, SERIES, SKY, VERMILLION, to_numpy
from course.topics.sampling.bench import HEADLINE
from pyspec_ref import sampling as spec

__all__ = [
    "emitted_figure",
    "residual_figure",
    "sigmoid_quality_figure",
    "tiled_draw_figure",
    "timing_figure",
]

# Timing lines of `course.topics.sampling.bench`'s implementations: (colour, matplotlib format).
TIMING_STYLES = {
    "baseline_torch": (GREY, "o-"),
    "exact_probs": (BLUE, "s-"),
    "exact_logits": (BLUE, "s-"),
    "sigmoid_logits": (VERMILLION, "^-"),
    "read_once_floor": (INK, ":"),
}


# ----------------------------------------------------------------------------- inputs


def _vector(x, name: str) -> np.ndarray:
    """A non-empty 1-D float64 array of finite values >= 0 (probabilities or weights)."""
    arr = np.asarray(to_numpy(x), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite values >= 0")
    return arr


def _unit(u, name: str) -> float:
    value = float(u)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {value}")
    return value


def _rows(rows, keys: Sequence[str], what: str) -> list[dict]:
    """rows as a non-empty list of dicts, each holding `keys`."""
    if isinstance(rows, dict) or not isinstance(rows, Sequence):
        raise ValueError(f"rows must be a list of dicts ({what}), got {type(rows).__name__}")
    if not rows:
        raise ValueError(f"rows is empty: no {what} to draw")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"rows[{i}] must be a dict, got {type(r).__name__}")
        missing = [k for k in keys if k not in r]
        if missing:
            raise ValueError(f"rows[{i}] lacks {missing}: each row of {what} needs {list(keys)}")
    return list(rows)


# ----------------------------------------------------------------------------- the algorithm


def residual_figure(p, q, u, position: int = 0, note: str | None = None):
    """One rejected position of speculative sampling (Leviathan et al. Algorithm 1; Chen et al.
    Algorithm 2): target p against draft q (left); the residual a = max(0, p - q)
    (`pyspec_ref.sampling.residual`), its CDF and the threshold u * sum(a), whose first crossing
    is the drawn token (`pyspec_ref.sampling.inverse_cdf`) (right)."""
    p_, q_ = _vector(p, "p"), _vector(q, "q")
    if p_.shape != q_.shape:
        raise ValueError(f"p and q must have the same length (the vocabulary), got {p_.size} and {q_.size}")
    u_ = _unit(u, "u")
    weights = spec.residual(p_.tolist(), q_.tolist())
    if sum(weights) <= 0:
        raise ValueError("the residual max(0, p - q) is empty (p == q): nothing is drawn from it")
    cdf = np.cumsum(weights)
    tokens = np.arange(p_.size)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2))
    left.bar(tokens - 0.2, p_, width=0.4, color=BLUE, label=f"target $p_{position}$")
    left.bar(tokens + 0.2, q_, width=0.4, color=ORANGE, label=f"draft $q_{position}$")
    left.set_title(f"position {position}" + (f": {note}" if note else ""), fontsize=10)
    left.legend(frameon=False)
    right.bar(tokens, weights, color=GREEN, label="residual $a = \\max(0, p - q)$")
    right.step(tokens + 0.5, cdf, where="pre", color=INK, label="its CDF")
    right.axhline(u_ * cdf[-1], color=VERMILLION, linestyle="--", label="$u \\cdot \\sum a$")
    right.set_title(f"the draw: the first token whose CDF passes $u \\sum a$ (token "
                    f"{spec.inverse_cdf(weights, u_)})", fontsize=10)
    right.legend(frameon=False, fontsize=8)
    for ax in (left, right):
        ax.set_xticks(list(tokens))
        ax.set_xlabel("token")
    fig.tight_layout()
    return fig


def tiled_draw_figure(weights, tile: int, u):
    """The seed paper's two-level inverse CDF (Wagner et al. §3, Figure 2) on one row: the weights
    in tiles of `tile` tokens, each tile labelled with its partial sum b_k, the crossing tile
    highlighted; the cumulative weight, the threshold u * sum and the drawn token
    (`pyspec_ref.sampling.inverse_cdf`) on the right axis."""
    w = _vector(weights, "weights")
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or tile < 1:
        raise ValueError(f"tile must be an int >= 1, got {tile!r}")
    u_ = _unit(u, "u")
    if w.sum() <= 0:
        raise ValueError("weights are all 0: nothing can be drawn")
    n = w.size
    tiles = -(-n // tile)
    partial = [float(w[k * tile:(k + 1) * tile].sum()) for k in range(tiles)]
    threshold = u_ * sum(partial)
    crossing = next((k for k in range(tiles) if sum(partial[:k + 1]) > threshold), tiles - 1)
    token = spec.inverse_cdf(w.tolist(), u_)
    cdf = np.cumsum(w)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    colours = [BLUE, SKY, GREEN]
    for k in range(tiles):
        span = np.arange(k * tile, min((k + 1) * tile, n))
        ax.bar(span, w[span], color=colours[k % 3], alpha=1.0 if k == crossing else 0.45,
               label=f"tile {k}: b_{k} = {partial[k]:.3f}")
        ax.axvline(k * tile - 0.5, color=GREY, linewidth=0.8)
    twin = ax.twinx()
    twin.step(range(n), cdf, where="mid", color=INK, linewidth=1)
    twin.axhline(threshold, color=VERMILLION, linestyle="--")
    twin.plot([token], [cdf[token]], "o", color=VERMILLION)
    twin.set_ylabel("cumulative residual")
    ax.set_xlabel("token")
    ax.set_ylabel("residual a = max(0, p - q)")
    ax.set_title(f"inverse CDF by tiles: tile {crossing} from the partial sums, then token {token} in it",
                 fontsize=10)
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- results


def emitted_figure(emitted, p, q=None, sampler: str | None = None):
    """Emitted tokens against the target distribution, one panel per position c.

    ``emitted``: (samples, positions) token ids, `pyspec_ref.sampling.PAD` after a sample's last
    emitted token; ``p``: (positions, V) target probabilities; ``q``: optionally (positions - 1,
    V) draft probabilities (no draft at the bonus position). Each panel: p_c against the
    frequency of the tokens emitted at c by the samples that got that far, titled with their
    number and the largest |frequency - p_c|.
    """
    e = np.asarray(to_numpy(emitted))
    p_ = np.asarray(to_numpy(p), dtype=np.float64)
    if e.ndim != 2 or e.size == 0:
        raise ValueError(f"emitted must be a non-empty 2-D (samples, positions) array, got shape {e.shape}")
    if not np.issubdtype(e.dtype, np.integer):
        raise ValueError(f"emitted must hold integer token ids, got dtype {e.dtype}")
    if p_.ndim != 2 or p_.shape[0] != e.shape[1]:
        raise ValueError(f"p must be 2-D (positions, V) with {e.shape[1]} positions (the columns of "
                         f"emitted), got shape {p_.shape}")
    positions, vocabulary = p_.shape
    q_ = None
    if q is not None:
        q_ = np.asarray(to_numpy(q), dtype=np.float64)
        if q_.shape != (positions - 1, vocabulary):
            raise ValueError(f"q must have shape {(positions - 1, vocabulary)} (no draft at the bonus "
                             f"position), got {q_.shape}")
    if np.any(e >= vocabulary) or np.any((e < 0) & (e != spec.PAD)):
        raise ValueError(f"emitted holds a token outside [0, {vocabulary}) that is not PAD = {spec.PAD}")
    fig, axes = plt.subplots(1, positions, figsize=(4 * positions, 3), sharey=True, squeeze=False)
    tokens = np.arange(vocabulary)
    for c, ax in enumerate(axes[0]):
        reached = e[:, c][e[:, c] >= 0]
        frequency = np.bincount(reached, minlength=vocabulary) / max(len(reached), 1)
        ax.bar(tokens - 0.2, p_[c], width=0.4, color=BLUE, label="target $p_c$")
        ax.bar(tokens + 0.2, frequency, width=0.4, color=ORANGE, label="emitted")
        if q_ is not None and c < positions - 1:
            ax.plot(tokens, q_[c], "x", color=GREY, label="draft $q_c$")
        worst = float(np.abs(frequency - p_[c]).max())
        ax.set_title(f"position {c}: {len(reached)} samples, max |diff| {worst:.4f}", fontsize=9)
        ax.set_xlabel("token")
    axes[0][0].legend(frameon=False, fontsize=8)
    fig.suptitle(f"{e.shape[0]} samples" + (f" drawn by {sampler}" if sampler else ""), fontsize=10)
    fig.tight_layout()
    return fig


def sigmoid_quality_figure(rows):
    """The sigmoid approximation against the exact test (`course.topics.sampling.bench.sigmoid_quality`
    rows): acceptance rate of both (left) and the TV distance of the emitted token from p (right),
    against the draft's mismatch s."""
    rows = sorted(_rows(rows, ("mismatch", "acceptance_exact", "acceptance_sigmoid", "tv_distance"),
                        "sigmoid_quality"), key=lambda r: r["mismatch"])
    s = [r["mismatch"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2))
    left.plot(s, [r["acceptance_exact"] for r in rows], "o-", color=BLUE, label="exact")
    left.plot(s, [r["acceptance_sigmoid"] for r in rows], "s--", color=VERMILLION, label="sigmoid")
    left.set(xlabel="draft mismatch s", ylabel="acceptance rate")
    left.legend(frameon=False)
    right.plot(s, [r["tv_distance"] for r in rows], "s--", color=VERMILLION)
    right.set(xlabel="draft mismatch s", ylabel="TV distance of the emitted token from p")
    fig.tight_layout()
    return fig


def timing_figure(rows, note: str | None = None):
    """Median time against the batch B of `course.topics.sampling.bench` timing rows at one size (gamma,
    V): from logits (left) and from probabilities (right), one line per implementation, log-log.
    Refused: rows without name / input / B / gamma / V / median_ms, rows mixing sizes."""
    rows = _rows(rows, ("name", "input", "B", "gamma", "V", "median_ms"), "sampling timings")
    sizes = sorted({(r["gamma"], r["V"]) for r in rows})
    if len(sizes) != 1:
        raise ValueError(f"rows mix sizes (gamma, V) = {sizes}: pass the rows of one size")
    (gamma, vocabulary), = sizes
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), sharey=True)
    for ax, source in zip(axes, ("logits", "probs"), strict=True):
        names = [n for n in TIMING_STYLES if any(r["name"] == n for r in rows)]
        names += sorted({r["name"] for r in rows} - set(names))
        for name in names:
            colour, style = TIMING_STYLES.get(name, (ORANGE, "d-"))
            points = sorted((r["B"], r["median_ms"] * 1e3) for r in rows
                            if r["name"] == name and r["input"] == source and r["median_ms"] is not None)
            if points:
                ax.plot(*zip(*points, strict=True), style, color=colour, label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch B")
        ax.set_title(f"from {source}, gamma = {gamma}, V = {vocabulary}", fontsize=10)
        if ax.lines:
            ax.legend(frameon=False, fontsize=8)
    axes[0].set_ylabel("median time (us)")
    if note:
        fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    return fig


def measured_figure(document: dict):
    """sampling.png: median time per implementation against B at the headline size, eager (left)
    and as CUDA graphs (right)."""
    rows, device = document["rows"], document["device"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, section in zip(axes, ("timing", "graphs"), strict=True):
        mine = [r for r in rows if r.get("section", "timing") == section
                and r.get("gamma") == HEADLINE["gamma"] and r.get("V") == HEADLINE["V"]]
        lines = sorted({(r["name"], r["input"]) for r in mine})
        for colour, (name, source) in zip(SERIES * 2, lines, strict=False):
            points = sorted((r["B"], 1e3 * r["median_ms"]) for r in mine
                            if (r["name"], r["input"]) == (name, source))
            style = "--" if name == "read_once_floor" else "-"
            ax.plot(*zip(*points, strict=True), style, marker="o", color=colour, label=f"{name} ({source})")
        ax.set(xscale="log", yscale="log", xlabel="batch B", ylabel="median time (µs)",
               title=f"speculative sampling, γ = {HEADLINE['gamma']}, V = {HEADLINE['V']}: "
                     + ("launched eagerly" if section == "timing" else "as CUDA graphs"))
        ax.legend(fontsize=7)
    fig.suptitle(f"measured on {device}", fontsize=9)
    fig.tight_layout()
    return fig


FIGURES = {"sampling": measured_figure}
