"""pyspec_ref.sampling: worked examples, bad input, and the defining property of speculative
sampling -- the emitted token follows the target distribution, whatever the draft."""

from __future__ import annotations

import random

import pytest

from course.measure.stats import chi_square_p_value
from pyspec_ref import sampling as S

P1 = [0.5, 0.25, 0.125, 0.125]
Q1 = [0.25, 0.5, 0.125, 0.125]


def test_inverse_cdf_is_exact_at_the_boundaries():
    weights = [0.25, 0.0, 0.5, 0.25]
    assert S.inverse_cdf(weights, 0.0) == 0
    assert S.inverse_cdf(weights, 0.2499) == 0
    assert S.inverse_cdf(weights, 0.25) == 2  # cumulative 0.25 is not > 0.25; token 1 has no weight
    assert S.inverse_cdf(weights, 0.75) == 3
    assert S.inverse_cdf([0.0, 3.0], 0.999) == 1  # unnormalised weights work too


def test_all_accepted_emits_the_bonus_token():
    accepted, emitted = S.speculative_sampling([0, 2], [Q1, Q1], [P1, P1, P1], [0.0, 0.0], [0.9, 0.9, 0.6])
    assert accepted == 2 and emitted == [0, 2, 1]  # bonus from P1 by u = 0.6: 0.5 < 0.6 <= 0.75


def test_first_rejected_resamples_from_the_residual():
    # Token 1: p/q = 0.5, r = 0.9 rejects; residual max(0, P1 - Q1) = [0.25, 0, 0, 0] -> token 0.
    accepted, emitted = S.speculative_sampling([1, 2], [Q1, Q1], [P1, P1, P1], [0.9, 0.0], [0.99, 0, 0])
    assert accepted == 0 and emitted == [0, S.PAD, S.PAD]


def test_gamma_one_and_zero_draft_probability():
    q = [0.0, 1.0, 0.0, 0.0]
    accepted, emitted = S.speculative_sampling([0], [q], [P1, P1], [0.999], [0.0, 0.0])
    assert accepted == 1 and emitted == [0, 0]  # q(x) = 0 < p(x): r * 0 < p(x) accepts


def test_equal_distributions_always_accept():
    for r in (0.0, 0.5, 0.999):
        assert S.speculative_sampling([3], [P1], [P1, P1], [r], [0.0, 0.0])[0] == 1


@pytest.mark.parametrize("change, message", [
    (dict(p=[[0.5, float("nan"), 0.25, 0.25]] * 2), "p\\[0\\]\\[1\\]"),
    (dict(p=[[0.5, -0.25, 0.5, 0.25]] * 2), "negative"),
    (dict(q=[[0.5, 0.5, 0.5, 0.5]]), "sums to 2"),
    (dict(draft_tokens=[4]), "draft_tokens\\[0\\] = 4 is not a token id"),
    (dict(p=[P1]), "p has 1 rows, expected 2"),
    (dict(accept_uniforms=[1.0]), "accept_uniforms\\[0\\] = 1.0 must lie in \\[0, 1\\)"),
    (dict(sample_uniforms=[0.5]), "sample_uniforms has 1 entries"),
    (dict(q=[[0.5, 0.5]]), "q\\[0\\] has 2 entries"),
])
def test_bad_input_is_named(change, message):
    arguments = dict(draft_tokens=[0], q=[Q1], p=[P1, P1], accept_uniforms=[0.5], sample_uniforms=[0.5, 0.5])
    arguments.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        S.speculative_sampling(**arguments)


def _random_distribution(rng, v):
    weights = [rng.random() ** 3 for _ in range(v)]
    total = sum(weights)
    return [w / total for w in weights]


def _draw(rng, distribution):
    return S.inverse_cdf(distribution, rng.random())


SAMPLES = 20000  # at V = 5 this detects a shift of 0.01 in one probability with high power


def test_each_emitted_position_follows_the_target_distribution():
    rng = random.Random(7)
    v, gamma = 5, 2
    q = [_random_distribution(rng, v) for _ in range(gamma)]
    p = [_random_distribution(rng, v) for _ in range(gamma + 1)]
    first = [0] * v
    for _ in range(SAMPLES):
        draft = [_draw(rng, q[c]) for c in range(gamma)]  # the draft model samples from q
        _, emitted = S.speculative_sampling(draft, q, p, [rng.random() for _ in range(gamma)],
                                            [rng.random() for _ in range(gamma + 1)])
        first[emitted[0]] += 1
    assert chi_square_p_value(first, p[0]) > 1e-4  # fixed significance: fails 1 in 10^4 by chance


def test_a_chain_tree_equals_chain_speculative_sampling():
    rng = random.Random(3)
    v, gamma = 6, 3
    for _ in range(50):
        q = [_random_distribution(rng, v) for _ in range(gamma + 1)]
        p = [_random_distribution(rng, v) for _ in range(gamma + 1)]
        draft = [_draw(rng, q[c]) for c in range(gamma)]
        r = [rng.random() for _ in range(gamma)]
        u = [rng.random() for _ in range(gamma + 1)]
        accepted, emitted = S.speculative_sampling(draft, q[:gamma], p, r, u)
        # Node c + 1 holds draft token c; its test uses r[c]; node c draws with u[c].
        path, token = S.tree_speculative_sampling(list(range(-1, gamma)), [0, *draft], q, p, [0.0, *r], u)
        assert path == list(range(accepted + 1)) and token == emitted[accepted]


def test_tree_sampling_follows_the_target_distribution():
    rng = random.Random(11)
    v = 5
    q_root, p_root = _random_distribution(rng, v), _random_distribution(rng, v)
    leaf = [1.0 / v] * v
    counts = [0] * v
    for _ in range(SAMPLES):
        children = [_draw(rng, q_root) for _ in range(3)]  # three candidates, each drawn from q
        tokens = [0, *children]
        path, token = S.tree_speculative_sampling([-1, 0, 0, 0], tokens, [q_root, leaf, leaf, leaf],
                                                  [p_root, leaf, leaf, leaf],
                                                  [0.0] + [rng.random() for _ in range(3)],
                                                  [rng.random() for _ in range(4)])
        counts[tokens[path[1]] if len(path) > 1 else token] += 1
    assert chi_square_p_value(counts, p_root) > 1e-4


def test_greedy_verification_takes_the_longest_matching_path():
    parents = [-1, 0, 0, 1, 1, 3]
    tokens = [9, 4, 5, 6, 7, 8]
    argmax = [5, 0, 7, 0, 0, 0]  # at the root the target wants 5 (node 2), then 7 (no child of 2)
    assert S.greedy_tree_verification(parents, tokens, argmax) == ([0, 2], 7)
    argmax = [4, 6, 0, 8, 0, 3]  # 4 (node 1), 6 (node 3), 8 (node 5), then 3
    assert S.greedy_tree_verification(parents, tokens, argmax) == ([0, 1, 3, 5], 3)
    with pytest.raises(ValueError, match="target_argmax has 2 entries"):
        S.greedy_tree_verification(parents, tokens, [1, 2])
