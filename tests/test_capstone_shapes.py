"""The capstone's tree shapes (`course.capstone.shapes`, notebook 21) on the CPU: Sequoia's tree as
the decoder grows it, the acceptance vector of the tiny pair, greedy output unchanged by the shape,
sampling exact with siblings drawn without replacement, and bad input refused by name."""

from __future__ import annotations

import math

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import decoder, shapes
from course.capstone.text import encode
from course.capstone.tree import check_bias
from course.capstone.weights import load_pair
from course.core import runtime
from course.measure.stats import chi_square_p_value
from pyspec_ref.tree_shape import best_tree

RATES = [0.8, 0.1, 0.05, 0.02]


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


@pytest.mark.parametrize("rates", [RATES, [0.5, 0.2, 0.1, 0.05], [0.95, 0.03, 0.0, 0.0]])
@pytest.mark.parametrize("budget, depth", [(8, 4), (16, 8), (32, 6)])
def test_the_decoder_grows_an_optimal_tree(rates, budget, depth):
    """The GPU's best-first rule with key "static" (run here on the CPU) verifies a tree worth what
    Sequoia's program promises, within the settings it derives."""
    tree = shapes.sequoia(rates, budget, depth)
    grown = shapes.grown_paths(tree["tree_size"], tree["width"], tree["branch"], tree["steps"], tree["bias"])
    assert math.isclose(shapes._expected(grown, rates), best_tree(rates, budget, depth)[2], rel_tol=1e-9)
    assert tree["steps"] <= depth and tree["tree_size"] <= budget and len(grown) == tree["tree_size"]
    for path in grown:  # siblings are a prefix of the draw order
        assert all(path[:-1] + (k,) in grown for k in range(path[-1])) if path else True


def test_a_chain_is_the_degenerate_case():
    tree = shapes.sequoia([0.9, 0.0, 0.0, 0.0], 6, 8)
    assert (tree["tree_size"], tree["width"], tree["branch"], tree["steps"]) == (6, 1, 1, 5)
    dynamic = shapes.settings_for("dynamic", RATES, "sample", tree_size=6, width=1, branch=1, steps=5)
    assert dynamic["bias"] == [[math.log(0.8)]] * 5


def test_the_prior_never_ranks_a_younger_sibling_above_an_elder():
    row = shapes.log_prior([0.5, 0.1, 0.3, 0.0], 2, 4)[0]
    assert row[:3] == [math.log(0.5), math.log(0.1), math.log(0.1)] and row[3] == -math.inf


@pytest.mark.parametrize("mode, temperature", [("greedy", 1.0), ("sample", 1.0), ("sample", 0.6)])
def test_the_tiny_pairs_acceptance_vector(pair, mode, temperature):
    rates = shapes.acceptance(pair, mode, temperature, windows=4, seq_len=64)
    assert len(rates) == shapes.RANKS and all(0 <= r <= 1 for r in rates) and sum(rates) <= 1
    assert rates[0] > 0.3 and rates[0] > rates[-1]  # a trained draft: its first guess is the best


@pytest.mark.parametrize("kind", shapes.TREES)
def test_greedy_output_does_not_depend_on_the_shape(pair, kind):
    prompts = [encode("The old fox "), encode("12 + 7 = ")]
    tree = shapes.settings_for(kind, RATES, "greedy", default=shapes.SMALL)
    tree.pop("predicted_tokens_per_call", None)
    plain = decoder.autoregressive(pair.target, prompts, 16, backend="reference")
    for backend in ("reference", "kernels"):
        got = decoder.speculative(pair.target, pair.draft, prompts, 16 if backend == "reference" else 6,
                                  backend=backend, impl="solutions", **tree)
        assert got.tokens == [t[:len(got.tokens[0])] for t in plain.tokens], (kind, backend)


@pytest.mark.parametrize("options", [
    dict(),  # siblings without replacement (Sequoia), ranked by the parent's confidence
    dict(replacement=True),  # SpecInfer's independent siblings
    dict(key="static", bias=shapes.log_prior(RATES, 2, 3)),  # Sequoia's static prior
    dict(temperature=0.6, bias=shapes.log_prior(RATES, 2, 3)),
])
def test_sampling_follows_the_target_with_every_shape(pair, options):
    """Many runs on one prompt (a batch of copies, each with its own uniforms): the first and second
    emitted tokens follow the target's distributions at the temperature (SpecInfer §4.3; Sequoia
    §3.2 for siblings drawn without replacement)."""
    prompt = encode("The old ")
    runs, temperature = 400, options.get("temperature", 1.0)
    got = decoder.speculative(pair.target, pair.draft, [prompt] * runs, 2, tree_size=6, width=2, branch=3,
                              steps=2, mode="sample", seed=13, backend="reference", **options)
    assert got.accepted_per_call > 0.2
    vocab = pair.target.config.vocab_size
    with torch.no_grad():
        device = pair.target.device
        last = pair.target(torch.tensor([prompt], device=device))[0, -1].double()
        p1 = torch.softmax(last / temperature, -1)
        seqs = torch.tensor([prompt + [x] for x in range(vocab)], device=device)
        p2 = p1.cpu() @ torch.softmax(pair.target(seqs)[:, -1].double() / temperature, -1).cpu()
    first = torch.tensor([t[0] for t in got.tokens])
    second = torch.tensor([t[1] for t in got.tokens])
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), p1.cpu(), pool_below=5) > 1e-3
    assert chi_square_p_value(torch.bincount(second, minlength=vocab), p2, pool_below=5) > 1e-3


def test_siblings_drawn_without_replacement_are_distinct(pair):
    built = decoder.SpeculativeDecoder(pair.target, pair.draft, batch=3, max_len=40, tree_size=8, width=2,
                                       branch=4, steps=3, mode="sample", backend="reference", temperature=0.2)
    prompts = [encode("The old fox "), encode("12 + 7 = "), encode("On 3 May")]
    trace = []
    built.generate(prompts, 8, seed=2, trace=trace)
    for entry in trace:
        children = {}
        for node, parent in enumerate(entry["parents"]):
            if parent >= 0 and entry["run"][parent]:
                children.setdefault(parent, []).append(entry["tokens"][node])
        assert all(len(set(c)) == len(c) for c in children.values())


@pytest.mark.parametrize("options, message", [
    (dict(mode="sample", temperature=0.0), "temperature must be a finite number > 0"),
    (dict(mode="sample", temperature=-1.0), "temperature must be a finite number > 0"),
    (dict(mode="greedy", temperature=0.5), "means nothing in greedy mode"),
    (dict(mode="sample", key="cum"), "ranks a node by its own draw"),
    (dict(bias=[[float("nan")] * 4] * 2), "no NaN"),
    (dict(bias=[[0.5] * 4] * 2), "none above 0"),
    (dict(bias=[[-1.0] * 3] * 2), r"shape \(steps, branch\) = \(2, 4\)"),
    (dict(key="sideways"), "key must be one of"),
])
def test_bad_tree_settings_are_refused_by_name(pair, options, message):
    with pytest.raises(ValueError, match=message):
        decoder.SpeculativeDecoder(pair.target, pair.draft, batch=1, max_len=30, tree_size=6, width=2,
                                   branch=4, steps=2, backend="reference", **options)


@pytest.mark.parametrize("rates, budget, depth, message", [
    ([0.5, float("nan")], 8, 4, r"acceptance\[0\]\[1\]"),
    ([0.5, -0.2], 8, 4, r"acceptance\[0\]\[1\] = -0.2"),
    ([1.5], 8, 4, r"acceptance\[0\]\[0\] = 1.5"),
    (RATES, 10 ** 6, 4, r"budget \(tree_size\) must be an int in \[1, 128\]"),
    (RATES, 8, 10 ** 6, r"max_depth \(steps\) must be an int in \[1, 16\]"),
    ([0.0, 0.0], 8, 4, "no child is ever accepted"),
])
def test_bad_acceptance_or_budget_is_refused_by_name(rates, budget, depth, message):
    with pytest.raises(ValueError, match=message):
        shapes.sequoia(rates, budget, depth)


def test_check_bias_keeps_the_callers_tensor():
    bias = torch.full((2, 3), -0.5)
    before = bias.clone()
    check_bias(bias, 2, 3)
    assert torch.equal(bias, before)
    with pytest.raises(ValueError, match="tree must be one of"):
        shapes.settings_for("bushy", RATES, "greedy")


@pytest.mark.parametrize("kind", shapes.TREES)
def test_generate_takes_each_tree(capsys, kind):
    from course.__main__ import main

    assert main(["generate", "--prompt", "The old ", "--pair", "tiny", "--max-new-tokens", "4", "--backend",
                 "reference", "--no-progress", "--tree", kind]) == 0
    out = capsys.readouterr().out
    assert f"{kind} tree (bs " in out and "greedy outputs identical: True" in out


def test_generate_refuses_an_unknown_tree(capsys):
    from course.__main__ import main

    with pytest.raises(SystemExit) as stopped:
        main(["generate", "--prompt", "a", "--pair", "tiny", "--tree", "bushy"])
    assert stopped.value.code == 2 and "invalid choice: 'bushy'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--mode", "sample", "--temperature", "0"], "temperature must be a finite number > 0"),
    (["--tree", "sequoia", "--tree-size", "100000"], "budget (tree_size) must be an int in [1, 128]"),
])
def test_generate_refuses_bad_tree_arguments(capsys, argv, message):
    from course.__main__ import main

    assert main(["generate", "--prompt", "a", "--pair", "tiny", "--backend", "reference", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_schedule_too_deep_for_int32_intervals_names_the_deepest_that_fits():
    from course.capstone.tree import MAX_INTERVAL, schedule

    assert schedule(10, 4, 8).spans[0] <= MAX_INTERVAL
    with pytest.raises(ValueError, match=r"branch = 8, use at most 10 steps") as refused:
        schedule(100, 4, 8)
    assert len(str(refused.value)) < 300  # no number of 90 digits
