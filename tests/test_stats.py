"""course.measure.stats: the chi-square test the distribution tests share."""

import random

from course.measure.stats import chi_square_p_value


def _counts(probabilities, n, seed):
    rng = random.Random(seed)
    tokens = rng.choices(range(len(probabilities)), weights=probabilities, k=n)
    return [tokens.count(i) for i in range(len(probabilities))]


def test_draws_from_the_distribution_pass_and_a_shifted_one_fails():
    p = [0.4, 0.3, 0.2, 0.1]
    counts = _counts(p, 20000, 1)
    assert chi_square_p_value(counts, p) > 1e-4
    assert chi_square_p_value(counts, [0.38, 0.3, 0.2, 0.12]) < 1e-4  # two points of mass moved


def test_rare_cells_are_pooled_and_impossible_tokens_reject():
    p = [0.5, 0.49] + [0.0005] * 20  # 20 tokens expected once each in 2000 draws
    counts = _counts(p, 2000, 2)
    assert chi_square_p_value(counts, p, pool_below=5) > 1e-4
    assert chi_square_p_value([3, 0, 1], [0.5, 0.5, 0.0]) == 0.0  # a token of probability 0 was seen
    assert chi_square_p_value([7], [1.0]) == 1.0  # one cell: nothing to test
