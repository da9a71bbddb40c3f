"""Notebook 15: the speculative-sampling kernels, their PyTorch reference, the checks and the bench.

The exercises' checks (exactness against pyspec_ref on the checks' edge cases) run in
tests/test_checks.py; here: the references, the edge cases themselves, the sigmoid variant, bad
input, the distribution of the emitted tokens, and that the checks catch realistic bugs.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from course.core import runtime
from course.measure.stats import chi_square_p_value
from course.oracle import sampling as sampling_oracle
from course.topics.sampling import bench, launch
from course.topics.sampling import check as cs
from pyspec_ref import sampling as spec
from solutions import spec_sampling as kernels

DEVICE = runtime.torch_device()


def _spec(case):
    return cs.reference(case)


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("form", ["probs", "logits"])
def test_float64_torch_reference_equals_pyspec(form):
    case = cs.random_case("", 3, 40, 3, 23, form=form, noise=0.7)
    accepted, emitted = sampling_oracle.speculative_sampling(*case.on("cpu"), form=form, dtype=torch.float64)
    assert (accepted.tolist(), emitted.tolist()) == _spec(case)


def test_float32_baseline_is_pyspec_within_rounding():
    case = cs.random_case("", 4, 60, 4, 50, form="logits", noise=0.5)
    tally = cs.classify(case, *bench.baseline_torch(*case.on("cpu"), from_logits=True))
    assert not tally.problems and tally.exact >= 58, str(tally)


# --------------------------------------------------------------------------- the edge cases


def test_edge_cases_exercise_what_their_names_say():
    cases = {case.name.split(":")[0].split(" (")[0]: case for case in cs.edge_cases(0)}
    gamma = {name: case.q.shape[1] for name, case in cases.items()}
    accepted = {name: _spec(case)[0] for name, case in cases.items()}
    assert set(accepted["all accepted"]) == {gamma["all accepted"]}
    assert set(accepted["first rejected"]) == {0}
    # q(x) = 0 < p(x) accepts; in sample 0 p(x) = 0 too, and 0 < 0 rejects (the test is strict)
    zero_q = accepted["q(x) = 0 for the draft tokens"]
    assert zero_q[0] == 0 and set(zero_q[1:]) == {gamma["q(x) = 0 for the draft tokens"]}
    assert set(accepted["p = q"]) == {gamma["p = q"]}
    assert set(accepted["from logits, p = q"]) == {gamma["from logits, p = q"]}
    empty = cases["empty residual"]
    assert set(accepted["empty residual"]) == {0}
    assert not bool(((empty.p[:, :-1].double() - empty.q.double()) > 0).any())  # nothing to renormalise
    assert cases["V = 37 in tiles of 16, mass in the ragged last tile"].tile == 16


def test_ties_case_lands_exactly_on_its_thresholds():
    case = cs.ties_case()
    assert _spec(case) == ([1, 2, 0, 1, 0],
                           [[20, 36, -1], [3, 33, 20], [3, -1, -1], [3, 36, -1], [3, -1, -1]])
    # r * q(x) == p(x) exactly at (2, 0) (rejected: the test is strict), r = 0 with p(x) = 0 at (4, 0)
    # (rejected), u * total == the CDF at token 3 at (0, 1) and (1, 2).
    assert 0.75 * float(case.q[2, 0, 20]) == float(case.p[2, 0, 20])
    assert float(case.accept_uniforms[4, 0]) == 0.0 and float(case.p[4, 0, 5]) == 0.0
    assert spec.inverse_cdf(spec.residual(case.p[0, 1].tolist(), case.q[0, 1].tolist()), 0.5) == 36


def test_resolution_case_needs_the_float64_test():
    case = cs.resolution_case()
    x = case.draft_tokens[:, 0].long()
    rows = torch.arange(x.shape[0])
    r, q_x, p_x = case.accept_uniforms[:, 0], case.q[rows, 0, x], case.p[rows, 0, x]
    assert not bool((r * q_x < p_x).any())  # float32 products round up to p(x): all would be rejected
    assert set(_spec(case)[0]) == {1}  # exactly, every one is accepted
    accepted, _ = kernels.speculative_sampling(*case.on(DEVICE))
    assert set(accepted.tolist()) == {1}


# --------------------------------------------------------------------------- the sigmoid variant


@pytest.mark.parametrize("alpha, beta", [(1.0, -3.0), (0.7, 0.5)])
def test_sigmoid_kernel_equals_its_float64_reference(alpha, beta):
    case = cs.random_case("", 5, 4, 3, 70, form="sigmoid", alpha=alpha, beta=beta, noise=0.5)
    accepted, emitted = launch.sigmoid_speculative_sampling(kernels, *case.on(DEVICE), alpha=alpha, beta=beta)
    tally = cs.classify(case, accepted, emitted, tile=kernels.TILE)
    assert not tally.problems, tally.problems


def test_first_token_distribution_is_p_when_exact_and_matches_sampling_when_not():
    q_logits, p_logits = bench.synthetic_logits(8, 1, 40, noise=1.0, device="cpu")
    q_logits, p_logits = q_logits[:, 0], p_logits[:, 0]
    rate, emitted = bench.first_token_distribution(q_logits, p_logits, "logits")
    assert torch.allclose(emitted, torch.softmax(p_logits.double(), -1), atol=1e-12)  # the theorem
    exact_rate = torch.minimum(torch.softmax(p_logits.double(), -1), torch.softmax(q_logits.double(), -1))
    assert torch.allclose(rate, exact_rate.sum(-1), atol=1e-12)
    # The sigmoid's formula against the float64 reference run on many samples of one row.
    beta = bench.calibrated_beta(p_logits)
    rate, emitted = bench.first_token_distribution(q_logits[:1], p_logits[:1], "sigmoid", 1.0, beta)
    samples = 40000
    g = torch.Generator().manual_seed(9)
    q = torch.softmax(q_logits[:1].double(), -1).expand(samples, -1)
    draft = torch.multinomial(q, 1, replacement=True, generator=g)
    accepted, tokens = sampling_oracle.speculative_sampling(
        draft, q_logits[:1, None].expand(samples, 1, -1), p_logits[:1, None].expand(samples, 2, -1),
        torch.rand((samples, 1), generator=g), torch.rand((samples, 2), generator=g), form="sigmoid",
        beta=beta, dtype=torch.float64)
    acceptance = float(accepted.double().mean())
    assert abs(acceptance - float(rate[0])) < 4 * math.sqrt(rate[0] * (1 - rate[0]) / samples)
    counts = torch.bincount(tokens[:, 0], minlength=40).double()
    assert chi_square_p_value(counts.tolist(), emitted[0].tolist(), pool_below=5) > 1e-4


def test_sigmoid_quality_grows_with_the_mismatch():
    rows = bench.sigmoid_quality((0.0, 1.0), rows=8, vocabulary=2000)
    assert rows[0]["tv_pq"] == 0.0 and rows[1]["tv_pq"] > 0.1
    assert rows[0]["acceptance_exact"] == pytest.approx(1.0)
    assert rows[0]["acceptance_sigmoid"] == pytest.approx(1.0)  # the same logits: every draft accepted
    assert rows[1]["tv_distance"] > 0 and rows[1]["acceptance_sigmoid"] < 1


# --------------------------------------------------------------------------- bad input


def _inputs(batch=2, gamma=2, vocabulary=37):
    case = cs.random_case("", 6, batch, gamma, vocabulary)
    return dict(zip(("draft_tokens", "q", "p", "accept_uniforms", "sample_uniforms"), case.on(DEVICE),
                    strict=True))


def _nan(t):
    t = t.clone()
    t[0, 1, 3] = float("nan")
    return t


def _negative(t):
    t = t.clone()
    t[1, 0, 2] = -0.25
    t[1, 0, 3] += 0.25
    return t


@pytest.mark.parametrize("change, error, message", [
    (lambda a: dict(p=_nan(a["p"])), ValueError, "p contains NaN"),
    (lambda a: dict(q=_negative(a["q"])), ValueError, r"q\[1, 0, 2\] = -0.25 is negative"),
    (lambda a: dict(q=a["q"] * 2), ValueError, r"q\[0, 0\] sums to 2, not 1"),
    (lambda a: dict(draft_tokens=a["draft_tokens"] + 37), ValueError,
     r"draft_tokens\[0, 0\] = \d+ is not a token id"),
    (lambda a: dict(p=a["p"][:, :2].contiguous()), ValueError, r"p must have shape \(B, gamma \+ 1, V\)"),
    (lambda a: dict(q=a["q"][:, :, :30].contiguous()), ValueError, r"p must have shape .* q \(2, 2, 30\)"),
    (lambda a: dict(accept_uniforms=a["accept_uniforms"] + 1), ValueError,
     r"accept_uniforms\[0, 0\] = .* \[0, 1\)"),
    (lambda a: dict(sample_uniforms=a["sample_uniforms"][:, :2].contiguous()), ValueError,
     r"sample_uniforms must have shape \(2, 3\)"),
    (lambda a: dict(q=a["q"].double()), TypeError, "q must have dtype float32"),
    (lambda a: dict(draft_tokens=a["draft_tokens"].float()), TypeError, "draft_tokens must have dtype int32"),
    (lambda a: dict(p=a["p"].transpose(0, 1)), ValueError, "p must be contiguous|p must have shape"),
])
def test_bad_input_gets_a_clear_error(change, error, message):
    arguments = _inputs()
    arguments.update(change(arguments))
    with pytest.raises(error, match=message):
        kernels.speculative_sampling(**arguments)


def test_bad_options_and_logits_get_clear_errors():
    arguments = _inputs()
    with pytest.raises(ValueError, match="tile must be a power of two >= 16, got 24"):
        kernels.speculative_sampling(**arguments, tile=24)
    with pytest.raises(TypeError, match="from_logits must be a bool"):
        kernels.speculative_sampling(**arguments, from_logits=1)
    logits = dict(arguments, p=arguments["p"].log())
    logits["p"][0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="p contains NaN or infinite values"):
        kernels.speculative_sampling(**logits, from_logits=True)
    with pytest.raises(ValueError, match="beta must be a finite number"):
        launch.sigmoid_speculative_sampling(kernels, *arguments.values(), beta=float("nan"))
    with pytest.raises(ValueError, match="form must be one of"):
        launch.prepare_sampling(kernels, **arguments, form="softmax")
    with pytest.raises(ValueError, match=r"V = 70000 needs 4375 tiles of 16"):
        big = _inputs(1, 1, 70000)
        kernels.speculative_sampling(**big, tile=16)


def test_logits_passed_as_probabilities_are_refused():
    arguments = _inputs()
    logits = dict(arguments, q=arguments["q"].log(), p=arguments["p"].log())
    with pytest.raises(ValueError, match=r"is negative: .*pass from_logits=True"):
        kernels.speculative_sampling(**logits)
    positive = dict(arguments, q=logits["q"] + 30, p=logits["p"] + 30)
    with pytest.raises(ValueError, match="pass probabilities, or logits with from_logits=True"):
        kernels.speculative_sampling(**positive)


# --------------------------------------------------------------------------- distributions


SIGNIFICANCE = 1e-4  # a correct sampler fails one position in 10^4 runs by chance
V_DIST, GAMMA_DIST = 5, 2


def _distribution_problem(sampler, samples: int, seed: int):
    """Draft tokens drawn from q, fresh uniforms per sample: at each position c, the emitted tokens of
    the samples that reach c must follow p_c. Returns (p-values, sensitivity p-values): the second
    tests the same counts against p_c with 0.01 moved between its two largest tokens, which a test
    able to see a 1% error must reject."""
    g = torch.Generator().manual_seed(seed)
    p_logits = torch.randn((1, GAMMA_DIST + 1, V_DIST), generator=g, dtype=torch.float64)
    noise = torch.randn((1, GAMMA_DIST, V_DIST), generator=g, dtype=torch.float64)
    q_logits = p_logits[:, :GAMMA_DIST] + noise
    p, q = torch.softmax(p_logits, -1).float(), torch.softmax(q_logits, -1).float()
    draft = torch.stack([torch.multinomial(q[0, c].double(), samples, replacement=True, generator=g)
                         for c in range(GAMMA_DIST)], dim=1).to(torch.int32)
    r = torch.rand((samples, GAMMA_DIST), generator=g)
    u = torch.rand((samples, GAMMA_DIST + 1), generator=g)
    accepted, emitted = sampler(draft.to(DEVICE), q.expand(samples, -1, -1).contiguous().to(DEVICE),
                                p.expand(samples, -1, -1).contiguous().to(DEVICE), r.to(DEVICE), u.to(DEVICE))
    emitted = emitted.cpu()
    values, shifted = [], []
    for c in range(GAMMA_DIST + 1):
        reached = emitted[:, c][emitted[:, c] >= 0]
        counts = torch.bincount(reached.long(), minlength=V_DIST).tolist()
        target = p[0, c].double()
        values.append(chi_square_p_value(counts, target.tolist(), pool_below=5))
        top, second = torch.topk(target, 2).indices.tolist()
        wrong = target.clone()
        wrong[top] -= 0.01
        wrong[second] += 0.01
        shifted.append(chi_square_p_value(counts, wrong.tolist(), pool_below=5))
    return values, shifted


def test_the_reference_emits_the_target_distribution_and_the_test_sees_a_1_percent_error():
    def sampler(*arguments):
        return sampling_oracle.speculative_sampling(*arguments, dtype=torch.float64)

    values, shifted = _distribution_problem(sampler, 200_000, seed=21)
    assert min(values) > SIGNIFICANCE, values
    assert max(shifted) < SIGNIFICANCE, shifted  # enough samples at every position to see 1%


@pytest.mark.skipif(runtime.SIMULATOR, reason="200k samples are 600k programs: minutes in the interpreter; "
                    "there the kernel equals pyspec_ref and the reference on the same random numbers")
def test_the_kernel_emits_the_target_distribution():
    values, shifted = _distribution_problem(kernels.speculative_sampling, 200_000, seed=21)
    assert min(values) > SIGNIFICANCE, values
    assert max(shifted) < SIGNIFICANCE, shifted


# --------------------------------------------------------------------------- the checks catch bugs


def _buggy_sampler(bug: str):
    """A float64 sampler with one realistic defect."""
    def sampler(draft_tokens, q, p, accept_uniforms, sample_uniforms):
        batch, gamma = draft_tokens.shape
        x = draft_tokens.long().unsqueeze(-1)
        q_x, p_x = q.gather(-1, x).squeeze(-1), p[:, :gamma].gather(-1, x).squeeze(-1)
        if bug == "float32 test":
            test = accept_uniforms * q_x < p_x
        else:
            test = accept_uniforms.double() * q_x.double() < p_x.double()
        accepted = test.int().cumprod(1).sum(1)
        rows = torch.arange(batch)
        p_row = p[rows, accepted].double()
        q_row = q[rows, accepted.clamp(max=gamma - 1)].double() * (accepted < gamma).unsqueeze(-1)
        w = (p_row - q_row).clamp(min=0)
        if bug != "no fallback to p":
            w = torch.where((w > 0).any(-1, keepdim=True), w, p_row)
        cdf = w.cumsum(-1)
        threshold = (sample_uniforms[rows, accepted].double() * cdf[:, -1]).unsqueeze(-1)
        token = torch.searchsorted(cdf, threshold, right=bug != ">= in the search").squeeze(-1)
        token = token.clamp(max=q.shape[-1] - 1)
        emitted = torch.full((batch, gamma + 1), -1, dtype=torch.long)
        for b in range(batch):
            a = int(accepted[b])
            emitted[b, :a] = draft_tokens[b, :a]
            emitted[b, a] = token[b]
        return accepted.int(), emitted
    return sampler


@pytest.mark.parametrize("bug, case, message", [
    ("float32 test", cs.resolution_case(), "bit-exact acceptance is required"),
    (">= in the search", cs.ties_case(), "dyadic inputs, every sum exact"),
    ("no fallback to p", next(c for c in cs.edge_cases(0) if c.name.startswith("empty residual")),
     "drew token"),
])
def test_the_check_catches_realistic_bugs(bug, case, message):
    tally = cs.classify(case, *_buggy_sampler(bug)(*case.on("cpu")))
    assert tally.wrong and message in tally.wrong[0], tally.wrong
    assert not cs.classify(case, *_buggy_sampler("none")(*case.on("cpu"))).wrong


def test_a_draw_one_token_off_is_within_rounding_only_at_a_boundary():
    case = cs.random_case("", 8, 1, 1, 10)
    (a,), (row,) = _spec(case)
    accepted = torch.tensor([a])
    moved = torch.tensor([row])
    moved[0, a] = (row[a] + 3) % 10
    assert cs.classify(case, accepted, moved).wrong  # far from any boundary: wrong
    # u * total on the boundary between two tokens of positive weight: drawing the other one of the
    # two is within rounding.
    q64, p64 = cs.weights64(case)
    w = (p64[0, a] - (q64[0, a] if a < 1 else 0)).clamp(min=0)
    w = w if bool((w > 0).any()) else p64[0, a]
    positive = [i for i in range(10) if w[i] > 0]
    below, above = positive[0], positive[1]
    u = case.sample_uniforms.clone()
    u[0, a] = float(w[:below + 1].sum() / w.sum())
    on_boundary = dataclasses.replace(case, sample_uniforms=u)
    (a2,), (row2,) = _spec(on_boundary)
    assert a2 == a and row2[a] in (below, above)
    got = torch.tensor([row2])
    got[0, a] = above if row2[a] == below else below
    tally = cs.classify(on_boundary, accepted, got)
    assert not tally.wrong and tally.within_rounding == 1, tally.wrong


# --------------------------------------------------------------------------- the bench


def test_targets_and_runtimes_without_measurements():
    rows = []
    measured = [("baseline_torch", "logits", 1, 0.36), ("exact_logits", "logits", 1, 0.03),
                ("read_once_floor", "logits", 64, 0.12), ("exact_logits", "logits", 64, 0.3),
                ("sigmoid_logits", "logits", 64, 0.15)]
    for name, source, batch, ms in measured:
        rows.append({"name": name, "input": source, "section": "timing", "B": batch, "gamma": 5, "V": 128256,
                     "median_ms": ms})
    found = {t["target"]: t for t in bench.targets(rows)}
    assert found["exact_logits >= 10x faster than baseline_torch (logits), B = 1"]["met"] is True
    assert found["exact_logits within 2x of the read-once floor, B = 64"]["met"] is False
    assert found["sigmoid_logits >= 1.3x faster than exact_logits, B = 64"]["value"] == pytest.approx(2.0)
    assert found["exact_probs within 2x of the read-once floor, B = 64"]["value"] is None
    if runtime.SIMULATOR:
        measured, source = bench.runtimes(1)
        document, _ = bench.committed()
        assert (measured == [] and "not measured yet" in source) or document is not None


def test_byte_model():
    assert bench.read_once_bytes(64, 5, 128256) == 64 * 11 * 128256 * 4
    steps = bench.baseline_bytes(64, 5, 128256, from_logits=True)
    assert sum(steps.values()) > 2 * bench.read_once_bytes(64, 5, 128256)
