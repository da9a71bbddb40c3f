"""The capstone decoder (notebook 19) with the tiny pair on the CPU: greedy equality with the target's
own greedy decoding, the sampled tokens' distribution, kernels against reference, bad input."""

from __future__ import annotations

import random

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import decoder
from course.capstone.text import encode
from course.capstone.tree import DraftTree
from course.capstone.weights import load_pair
from course.core import runtime
from course.measure.stats import chi_square_p_value

PROMPTS = ["The old fox ", "12 + 7 = ", "On 3 May 1950, the"]


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy continuation: plain full-sequence forward passes, no cache, no kernels."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq], device=model.device))[0, -1].argmax()))
    return seq[len(prompt):]


def test_greedy_kernels_equal_target_greedy(pair):
    prompts = [encode(PROMPTS[0]), encode(PROMPTS[1])]
    got = decoder.speculative(pair.target, pair.draft, prompts, 5, tree_size=4, width=2, backend="kernels",
                              impl="solutions")
    assert got.tokens == [greedy_reference(pair.target, p, 5) for p in prompts]
    assert got.target_calls <= 5


# (8, 8, 4): a step offers fewer candidates than w (a fresh root has 4), so more steps are needed.
@pytest.mark.parametrize("tree_size, width, branch", [(6, 2, 4), (3, 1, 2), (8, 4, 3), (8, 8, 4)])
def test_greedy_reference_equals_target_greedy(pair, tree_size, width, branch):
    prompts = [encode(p) for p in PROMPTS]
    n = 24
    got = decoder.speculative(pair.target, pair.draft, prompts, n, tree_size=tree_size, width=width,
                              branch=branch, backend="reference")
    want = [greedy_reference(pair.target, p, n) for p in prompts]
    assert got.tokens == want
    plain = decoder.autoregressive(pair.target, prompts, n, backend="reference")
    assert plain.tokens == want and plain.target_calls == n
    assert got.target_calls < n  # the draft does get tokens accepted
    assert got.accepted_per_call > 0


def test_eos_and_lengths(pair):
    prompts = [encode("The"), encode("12 + 7 = ")]
    free = decoder.speculative(pair.target, pair.draft, prompts, 10, backend="reference")
    eos = free.tokens[0][3]
    stopped = decoder.speculative(pair.target, pair.draft, prompts, 10, backend="reference", eos=eos)
    for full, cut in zip(free.tokens, stopped.tokens, strict=True):
        end = full.index(eos) + 1 if eos in full else len(full)
        assert cut == full[:end]


def test_sampling_matches_target_distribution(pair):
    """Many runs of sampling mode on one prompt (a batch of copies, each with its own uniforms): the
    first and second emitted tokens follow the target's distributions (SpecInfer §4.3)."""
    prompt = encode("The old ")
    runs = 400
    got = decoder.speculative(pair.target, pair.draft, [prompt] * runs, 2, tree_size=4, width=2, branch=2,
                              mode="sample", seed=11, backend="reference")
    assert got.accepted_per_call > 0.2  # drafts are accepted: the test exercises the tree walk
    first = torch.tensor([t[0] for t in got.tokens])
    second = torch.tensor([t[1] for t in got.tokens])
    vocab = pair.target.config.vocab_size
    with torch.no_grad():
        device = pair.target.device
        p1 = torch.softmax(pair.target(torch.tensor([prompt], device=device))[0, -1].double(), -1).cpu()
        seqs = torch.tensor([prompt + [x] for x in range(vocab)], device=device)
        p2_given = torch.softmax(pair.target(seqs)[:, -1].double(), -1).cpu()
    p2 = p1 @ p2_given
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), p1, pool_below=5) > 1e-3
    assert chi_square_p_value(torch.bincount(second, minlength=vocab), p2, pool_below=5) > 1e-3
    # and a wrong distribution is rejected: the test has power
    assert chi_square_p_value(torch.bincount(second, minlength=vocab), p1, pool_below=5) < 1e-3


def test_sampling_kernels_agree_with_reference(pair):
    prompts = [encode(PROMPTS[0]), encode(PROMPTS[2])]
    runs = {backend: decoder.speculative(pair.target, pair.draft, prompts, 4, tree_size=4, width=2,
                                         mode="sample", seed=5, backend=backend, impl="solutions")
            for backend in ("reference", "kernels")}
    assert runs["kernels"].tokens == runs["reference"].tokens
    assert runs["kernels"].accepted == runs["reference"].accepted


def test_reroot_moves_shift_left_and_keep_every_survivor():
    rng = random.Random(0)
    for trial in range(50):
        tree = DraftTree.fresh(1, "greedy" if trial % 2 else "sample")
        tree.push(0, [2, 3, 4], [-0.1, -1.0, -2.0])
        for _ in range(rng.randint(1, 6)):
            for v in tree.pop(2):
                k = rng.randint(1, 3)
                tree.push(v, [rng.randrange(10) for _ in range(k)], sorted(-rng.random() for _ in range(k)))
        kids = tree.children()
        path = [0]
        while kids[path[-1]] and rng.random() < 0.7:
            path.append(rng.choice(kids[path[-1]]))
        survivor = rng.choice(kids[path[-1]]) if kids[path[-1]] and rng.random() < 0.7 else None
        new, moves = tree.reroot(path, survivor, 7)
        assert all(dst < src for src, dst in moves)
        assert len({dst for _, dst in moves}) == len(moves)
        # replaying the moves on row labels puts the path first, then the survivors in id order
        rows = list(range(len(tree)))
        after = list(rows)
        for src, dst in moves:
            after[dst] = rows[src]
        assert after[:len(path)] == path
        if survivor is None:
            assert len(new) == 1 and new.tokens == [7] and not new.run[0]
        else:
            kept = after[len(path):len(path) + len(new)]
            assert [tree.tokens[v] for v in kept] == new.tokens
            assert kept[0] == survivor and kept == sorted(kept)
            start, end = new.dfs_times()
            assert start[0] == 0 and end[0] == len(new) - 1


def test_bad_input(pair):
    t, d = pair.target, pair.draft
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        decoder.generate_text(t, d, ["ok", ""], 4, backend="reference")
    with pytest.raises(ValueError, match=r"prompts\[0\] is empty"):
        decoder.speculative(t, d, [[]], 4, backend="reference")
    with pytest.raises(ValueError, match="not in the capstone's alphabet"):
        decoder.generate_text(t, d, "caf\u00e9", 4, backend="reference")
    with pytest.raises(ValueError, match="tree_size must be a positive int"):
        decoder.speculative(t, d, [encode("a")], 4, tree_size=0, backend="reference")
    with pytest.raises(ValueError, match="width = 5 must be <= tree_size = 4"):
        decoder.speculative(t, d, [encode("a")], 4, tree_size=4, width=5, backend="reference")
    with pytest.raises(ValueError, match="mode must be one of"):
        decoder.speculative(t, d, [encode("a")], 4, mode="beam", backend="reference")
    with pytest.raises(ValueError, match="backend must be one of"):
        decoder.speculative(t, d, [encode("a")], 4, backend="cuda")
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        decoder.autoregressive(t, [encode("a")], 0, backend="reference")
    with pytest.raises(ValueError, match=r"prompts\[0\]\[1\] = 999 is not a token id"):
        decoder.speculative(t, d, [[1, 999]], 4, backend="reference")
    with pytest.raises(ValueError, match="max_positions"):
        decoder.speculative(t, d, [encode("a" * 100)], 40, backend="reference")


def test_generate_command(capsys):
    from course.__main__ import main

    assert main(["generate", "--prompt", "The old ", "--pair", "tiny", "--max-new-tokens", "4", "--backend",
                 "reference", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "accepted per target call" in out and "greedy outputs identical: True" in out
    assert main(["generate", "--prompt", "caf\u00e9", "--pair", "tiny", "--backend", "reference"]) == 2
    assert "not in the capstone's alphabet" in capsys.readouterr().err
    assert main(["generate", "--prompt", "a", "--pair", "tiny", "--tree-size", "2", "--width", "3"]) == 2
