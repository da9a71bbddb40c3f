"""pyspec_ref.sampling: worked examples, bad input, and the defining property of speculative
sampling -- the emitted token follows the target distribution, whatever the draft."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from course.measure.stats import chi_square_p_value
from course.topics.verification.siblings import acceptance, ordered_draws
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


@pytest.mark.parametrize("replacement", [True, False])
def test_tree_sampling_follows_the_target_distribution(replacement):
    rng = random.Random(11)
    v = 5
    q_root, p_root = _random_distribution(rng, v), _random_distribution(rng, v)
    leaf = [1.0 / v] * v
    counts = [0] * v
    for _ in range(SAMPLES):
        if replacement:  # three candidates, each drawn from q
            children = [_draw(rng, q_root) for _ in range(3)]
        else:  # three distinct candidates, drawn one after another from q without the earlier ones
            children = S.sample_without_replacement(q_root, 3, [rng.random() for _ in range(3)])
        tokens = [0, *children]
        path, token = S.tree_speculative_sampling([-1, 0, 0, 0], tokens, [q_root, leaf, leaf, leaf],
                                                  [p_root, leaf, leaf, leaf],
                                                  [0.0] + [rng.random() for _ in range(3)],
                                                  [rng.random() for _ in range(4)], replacement=replacement)
        counts[tokens[path[1]] if len(path) > 1 else token] += 1
    assert chi_square_p_value(counts, p_root) > 1e-4


# --------------------------------------------------------------------------- without replacement


def test_sample_without_replacement_draws_from_what_is_left():
    q = [0.5, 0.25, 0.125, 0.125]
    # u = 0.6: token 1 from q (0.5 < 0.6 * 1 <= 0.75); then q without 1 is [0.5, 0, 0.125, 0.125]:
    # 0.6 * 0.75 = 0.45 < 0.5 gives token 0; then [0, 0, 0.125, 0.125]: 0.6 * 0.25 = 0.15 > 0.125 gives 3.
    assert S.sample_without_replacement(q, 3, [0.6, 0.6, 0.6]) == [1, 0, 3]
    assert S.sample_without_replacement(q, 0, []) == []
    with pytest.raises(ValueError, match="k = 5 must lie in \\[0, 4\\]"):
        S.sample_without_replacement(q, 5, [0.5] * 5)
    with pytest.raises(ValueError, match="uniforms has 1 entries"):
        S.sample_without_replacement(q, 2, [0.5])


def test_gumbel_top_k_orders_by_the_perturbed_log_probabilities():
    q = [0.5, 0.25, 0.0, 0.25]
    # u = e^-1 gives the noise -log(-log u) = 0: the keys are log q, ties to the smaller id.
    assert S.gumbel_top_k(q, 3, [math.exp(-1.0)] * 4) == [0, 1, 3]
    assert S.gumbel_top_k(q, 1, [math.exp(-1.0), math.exp(-1.0), 0.999, math.exp(-0.01)]) == [3]
    with pytest.raises(ValueError, match="k = 4 must lie in \\[0, 3\\]"):  # token 2 has no mass
        S.gumbel_top_k(q, 4, [0.5] * 4)
    with pytest.raises(ValueError, match="uniforms\\[1\\] = 1.0 must lie in"):
        S.gumbel_top_k(q, 2, [0.5, 1.0, 0.5, 0.5])


def test_gumbel_top_k_equals_the_sequential_draws_in_distribution():
    rng = random.Random(5)
    q, k, samples = [0.4, 0.25, 0.2, 0.1, 0.05], 2, 20000
    exact = dict((tuple(d), w) for d, w in ordered_draws(q, k, replacement=False))
    counts = Counter(tuple(S.gumbel_top_k(q, k, [rng.random() for _ in q])) for _ in range(samples))
    cells = sorted(exact)
    assert set(counts) <= set(cells)
    assert chi_square_p_value([counts[c] for c in cells], [exact[c] for c in cells]) > 1e-4


def test_sibling_distributions_closed_form():
    """p_i = max(0, p - C q) / Z with C <- C + Z / S, S <- S - q(x) (solutions/tree_verification.py),
    and the rejected tokens at zero in the residual."""
    rng = random.Random(9)
    p, q = _random_distribution(rng, 7), _random_distribution(rng, 7)
    draws = S.sample_without_replacement(q, 4, [rng.random() for _ in range(4)])
    steps = S.sibling_distributions(p, q, draws)
    c, z, left = 0.0, 1.0, 1.0
    for i, (p_i, q_i) in enumerate(steps):
        closed = [max(0.0, a - c * b) / z for a, b in zip(p, q, strict=True)]
        assert max(abs(x - y) for x, y in zip(p_i, closed, strict=True)) < 1e-12
        assert all(p_i[x] == 0.0 and q_i[x] == 0.0 for x in draws[:i])  # drawn: gone from both
        if i < len(draws):
            c_next = c + z / left
            left = (math.fsum(q) if c == 0.0 else left) - q[draws[i]]  # the first: from q's total
            c = c_next
            z = math.fsum(max(0.0, a - c * b) for a, b in zip(p, q, strict=True))
    # with replacement S stays 1: C <- C + Z
    steps = S.sibling_distributions(p, q, [draws[0]] * 3, replacement=True)
    assert steps[1][1] == q and steps[3][1] == q


def test_no_draft_mass_left_rejects_and_keeps_the_state():
    q = [0.75, 0.25, 0.0, 0.0]
    p = [0.0, 0.0, 0.5, 0.5]
    steps = S.sibling_distributions(p, q, [0, 1, 2])
    assert steps[2] == (p, [0.0] * 4) and steps[3] == steps[2]  # S = 0 after tokens 0 and 1
    assert not S.sibling_accepts(0.0, *steps[2], 2)
    assert S.tree_speculative_sampling([-1, 0, 0, 0], [0, 0, 1, 2], [q] * 4, [p] * 4, [0.0] * 4,
                                       [0.9] * 4) == ([0], 3)


def test_duplicate_siblings_are_refused_without_replacement():
    p = q = [0.25] * 4
    with pytest.raises(ValueError, match=r"tokens\[1\] = tokens\[2\] = 3: siblings \(children of node 0\)"):
        S.tree_speculative_sampling([-1, 0, 0], [0, 3, 3], [q] * 3, [p] * 3, [0.0] * 3, [0.5] * 3)
    path, _ = S.tree_speculative_sampling([-1, 0, 0], [0, 3, 3], [q] * 3, [p] * 3, [0.0] * 3, [0.5] * 3,
                                          replacement=True)
    assert path == [0, 1]


# Exact enumeration on a tiny tree: the root has three children and its first child two, each
# node's (p, q) a function of its token (the root's given), V = 6. Every draw of the siblings is
# enumerated with its probability and every test with its acceptance probability min(1, p_i/q_i),
# so the distribution of the first two emitted tokens is computed exactly (a draw at a node ends
# the walk; the next token then comes from the next round, distributed as the target at it).
TREE = [-1, 0, 0, 0, 1, 1]
CHILDREN = [[1, 2, 3], [4, 5], [], [], [], []]
TEMPERATURES = (1.0, 0.6, 0.2)


def _softmax(logits: list[float], temperature: float) -> list[float]:
    top = max(logits)
    weights = [math.exp((x - top) / temperature) for x in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]


def _models(temperature: float, peaked: bool, seed: int = 2, v: int = 6):
    """(p, q): token -> target and draft distribution after it (None: the root), at a temperature.
    peaked: the draft puts 0.7 on the token the target likes least (a confidently wrong draft)."""
    rng = random.Random(seed)
    p, q = {}, {}
    for t in [None, *range(v)]:
        target = [2.0 * rng.gauss(0, 1) for _ in range(v)]
        draft = [x + rng.gauss(0, 1) for x in target]
        p[t], q[t] = _softmax(target, temperature), _softmax(draft, temperature)
        if peaked:
            wrong = p[t].index(min(p[t]))
            q[t] = [0.3 * x + (0.7 if i == wrong else 0.0) for i, x in enumerate(q[t])]
    return p, q


def _walk_exactly(node: int, token, p, q, length: int, replacement: bool):
    """({first `length` emitted tokens: probability}, expected accepted draft tokens) of the walk
    from `node`, whose token is `token`."""
    out: dict[tuple, float] = Counter()
    accepted = 0.0
    kids = CHILDREN[node]
    for draws, probability in ordered_draws(q[token], len(kids), replacement):
        steps = S.sibling_distributions(p[token], q[token], draws, replacement=replacement)
        reach = probability
        for i, (child, x) in enumerate(zip(kids, draws, strict=True)):
            move = reach * acceptance(*steps[i], x)
            rest, more = ({(): 1.0}, 0.0) if length == 1 else _walk_exactly(child, x, p, q, length - 1,
                                                                             replacement)
            for tail, share in rest.items():
                out[(x, *tail)] += move * share
            accepted += move * (1.0 + more)
            reach -= move
        for x, share in enumerate(steps[-1][0]):  # every sibling rejected: the draw
            nxt = {(y,): w for y, w in enumerate(p[x])} if length > 1 else {(): 1.0}
            for tail, w in nxt.items():
                out[(x, *tail)] += reach * share * w
    return out, accepted


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("peaked", [False, True], ids=["draft", "peaked-wrong-draft"])
@pytest.mark.parametrize("replacement", [False, True], ids=["without", "with"])
def test_the_walk_emits_the_target_distribution_exactly(temperature, peaked, replacement):
    p, q = _models(temperature, peaked)
    emitted, _ = _walk_exactly(0, None, p, q, 2, replacement)
    # Exact up to float64 rounding, amplified where S (the draft mass left) is tiny: q sums to 1
    # within ~1e-16, so S = 1 - sum q(x_j) is off by that much, relatively 1e-16 / S (S ~ 1e-7 at
    # T = 0.2, where the draft puts nearly all its mass on one token).
    for (a, b), share in emitted.items():
        assert abs(share - p[None][a] * p[a][b]) < 1e-8, (a, b)
    assert abs(math.fsum(emitted.values()) - 1.0) < 1e-8


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_without_replacement_accepts_more_from_a_peaked_wrong_draft(temperature):
    p, q = _models(temperature, peaked=True)
    _, with_replacement = _walk_exactly(0, None, p, q, 2, replacement=True)
    _, without = _walk_exactly(0, None, p, q, 2, replacement=False)
    assert without > with_replacement + 0.05, (without, with_replacement)


def _sampled_walk(rng: random.Random, p, q, replacement: bool) -> tuple[int, int]:
    """One walk on TREE with sibling tokens drawn as a draft model draws them: the first two
    emitted tokens (the second drawn from the target after the last emitted one if the walk
    emitted one token)."""
    tokens = [0] * len(TREE)
    for node, kids in enumerate(CHILDREN):
        if kids:
            dist = q[None if node == 0 else tokens[node]]
            draws = (S.sample_without_replacement(dist, len(kids), [rng.random() for _ in kids])
                     if not replacement else [_draw(rng, dist) for _ in kids])
            for child, x in zip(kids, draws, strict=True):
                tokens[child] = x
    rows = [None if i == 0 else tokens[i] for i in range(len(TREE))]
    path, nxt = S.tree_speculative_sampling(TREE, tokens, [q[t] for t in rows], [p[t] for t in rows],
                                            [rng.random() for _ in TREE], [rng.random() for _ in TREE],
                                            replacement=replacement)
    emitted = [tokens[i] for i in path[1:]] + [nxt]
    if len(emitted) == 1:
        emitted.append(_draw(rng, p[emitted[0]]))
    return emitted[0], emitted[1]


WALKS = 2500  # a few seconds of walks in pure Python per test; the exact tests above are the strong ones


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("replacement", [False, True], ids=["without", "with"])
def test_sampled_walks_pass_the_chi_square_test(temperature, replacement):
    """Seeded (deterministic) draws of the peaked wrong draft's trees: the first two emitted
    tokens against p(a) p(b | a), 36 cells (rare ones pooled)."""
    p, q = _models(temperature, peaked=True)
    rng = random.Random(int(temperature * 10) + replacement)
    counts = Counter(_sampled_walk(rng, p, q, replacement) for _ in range(WALKS))
    cells = list(itertools.product(range(6), repeat=2))
    target = [p[None][a] * p[a][b] for a, b in cells]
    assert chi_square_p_value([counts[c] for c in cells], target, pool_below=5.0) > 1e-4


def test_greedy_verification_takes_the_longest_matching_path():
    parents = [-1, 0, 0, 1, 1, 3]
    tokens = [9, 4, 5, 6, 7, 8]
    argmax = [5, 0, 7, 0, 0, 0]  # at the root the target wants 5 (node 2), then 7 (no child of 2)
    assert S.greedy_tree_verification(parents, tokens, argmax) == ([0, 2], 7)
    argmax = [4, 6, 0, 8, 0, 3]  # 4 (node 1), 6 (node 3), 8 (node 5), then 3
    assert S.greedy_tree_verification(parents, tokens, argmax) == ([0, 1, 3, 5], 3)
    with pytest.raises(ValueError, match="target_argmax has 2 entries"):
        S.greedy_tree_verification(parents, tokens, [1, 2])
