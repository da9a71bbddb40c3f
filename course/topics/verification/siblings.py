"""Siblings drawn with and without replacement, computed exactly on a small vocabulary (notebook 16,
tests/test_pyspec_sampling.py).

At one node with k children, every ordered k-tuple of sibling tokens is enumerated with the
probability that the draft draws it (independent draws from q, or Sequoia's draws without
replacement, Chen et al., 2024, §3.2), and every test with its acceptance probability
min(1, p_i(x) / q_i(x)) from `pyspec_ref.sampling.sibling_distributions`. That gives, exactly:
the distribution of the token the node emits (which must be p), the probability that one of
its children is accepted, and the expected number of distinct sibling tokens.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from pyspec_ref import sampling as spec


def ordered_draws(q: list[float], k: int, replacement: bool) -> Iterator[tuple[list[int], float]]:
    """Every ordered k-tuple of sibling tokens with its probability: independent draws from q, or
    draws without replacement (each from q without the earlier draws, renormalised)."""
    for draws in itertools.product(range(len(q)), repeat=k):
        if not replacement and len(set(draws)) < k:
            continue
        probability, drawn = 1.0, []
        for x in draws:
            probability *= q[x] / math.fsum(w for v, w in enumerate(q) if v not in drawn)
            if not replacement:
                drawn.append(x)
        if probability > 0.0:
            yield list(draws), probability


def acceptance(p_i: list[float], q_i: list[float], x: int) -> float:
    """P(r q_i(x) < p_i(x)) for r uniform in [0, 1): min(1, p_i(x) / q_i(x)); 0 with no draft mass
    left (`pyspec_ref.sampling.sibling_accepts`)."""
    if not any(q_i):
        return 0.0
    return 1.0 if q_i[x] <= p_i[x] else p_i[x] / q_i[x]


def node_outcome(p: list[float], q: list[float], k: int, replacement: bool) -> tuple[list[float], float]:
    """(distribution of the token the node emits, probability that one of its k children is
    accepted), exactly: the emitted token is the accepted child's, or the draw from p_{k+1}."""
    emitted = [0.0] * len(p)
    accepted = 0.0
    for draws, probability in ordered_draws(q, k, replacement):
        steps = spec.sibling_distributions(p, q, draws, replacement=replacement)
        reach = probability  # P(these draws, and every earlier sibling rejected)
        for i, x in enumerate(draws):
            move = reach * acceptance(*steps[i], x)
            emitted[x] += move
            accepted += move
            reach -= move
        for x, share in enumerate(steps[-1][0]):
            emitted[x] += reach * share
    return emitted, accepted


def expected_distinct(q: list[float], k: int, replacement: bool) -> float:
    """The expected number of distinct tokens among k siblings drawn from q."""
    return math.fsum(probability * len(set(draws)) for draws, probability in ordered_draws(q, k, replacement))
