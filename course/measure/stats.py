"""The distribution tests' statistic: Pearson's chi-square test of observed counts against
probabilities (notebooks 15, 16 and 19, their checks and tests)."""

from __future__ import annotations

import math


def _floats(values) -> list[float]:
    return [float(x) for x in (values.tolist() if hasattr(values, "tolist") else values)]


def chi_square_p_value(counts, probabilities, *, pool_below: float = 0.0) -> float:
    """Upper-tail p-value of Pearson's statistic for `counts` (observations per token) against
    `probabilities`, by Wilson-Hilferty's normal approximation of the chi-square distribution.

    Tokens expected fewer than `pool_below` times are pooled into one cell: the approximation
    wants about 5 expected observations per cell. A token observed although its probability is 0
    cannot happen under the hypothesis: the p-value is then 0. Lists or 1-D tensors.
    """
    observed, expected_share = _floats(counts), _floats(probabilities)
    if len(observed) != len(expected_share):
        raise ValueError(f"counts has {len(observed)} entries but probabilities {len(expected_share)}")
    total = sum(observed)
    pairs = list(zip(observed, expected_share, strict=True))
    if any(c > 0 and p <= 0 for c, p in pairs):
        return 0.0
    cells = [(c, p) for c, p in pairs if p > 0 and total * p >= pool_below]
    rare = [(c, p) for c, p in pairs if p > 0 and total * p < pool_below]
    if rare:
        cells.append((sum(c for c, _ in rare), sum(p for _, p in rare)))
    k = len(cells) - 1  # degrees of freedom
    if k < 1:
        return 1.0
    statistic = sum((c - total * p) ** 2 / (total * p) for c, p in cells)
    z = ((statistic / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))
