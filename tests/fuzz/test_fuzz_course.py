"""Fuzzing course's own entry points and the capstone decoder with malformed arguments (seeded).

The capstone decoder's `speculative` and `autoregressive` (their argument checks run before any
model call), and the tree builders of `course.inputs`. Same property as the other fuzz modules: a
ValueError or TypeError naming the argument, and nothing passed in is changed. And the capstone's
device-side draft trees (`course.capstone.tree.DraftTrees`) on random schedules and random draft
outputs: their fixed shape, intervals that encode ancestry exactly, verified sets that are subtrees.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.capstone import decoder
from course.capstone.tree import DEPTH, END, PARENT, START, DraftTrees, schedule
from course.capstone.weights import load_pair
from course.core import inputs, runtime


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


BAD_INTS = [0, -1, 1.5, True, None, "2"]

# argument -> values that `speculative` must refuse, naming the argument
SPECULATIVE = {
    "max_new_tokens": BAD_INTS,
    "tree_size": BAD_INTS,
    "width": BAD_INTS + [10**3],  # width > tree_size
    "branch": [0, -1, 1.5, True, "2"],
    "steps": [0, -1, 1.5, True, "2"],
    "mode": ["beam", None, 1],
    "backend": ["cuda", None, 1],
    "prompts": [[], [[]], "hello", [[1, 2], "x"], [[1, -1]], [[10**9]], [[1.5]], [[True]], None, 3],
}


@settings(settings.get_profile("fuzz"))
@given(data=st.data())
def test_speculative_refuses_malformed_arguments_by_name(pair, data):
    target, draft = pair.target, pair.draft
    name = data.draw(st.sampled_from(sorted(SPECULATIVE)), label="argument")
    bad = data.draw(st.sampled_from(SPECULATIVE[name]), label="value")
    kwargs = {
        "prompts": [[1, 2, 3]],
        "max_new_tokens": 4,
        "tree_size": 4,
        "width": 2,
        "mode": "greedy",
        "backend": "reference",
    }
    kwargs[name] = copy.deepcopy(bad)
    before = repr(kwargs)
    with pytest.raises((ValueError, TypeError)) as raised:
        decoder.speculative(target, draft, **kwargs)
    message = str(raised.value)
    named = {"width": ("width",), "prompts": ("prompts",), "backend": ("backend",)}.get(name, (name,))
    assert any(n in message for n in named), f"{name} = {bad!r}: {message!r}"
    assert repr(kwargs) == before


@settings(settings.get_profile("fuzz"))
@given(data=st.data())
def test_autoregressive_refuses_malformed_arguments_by_name(pair, data):
    target = pair.target
    name = data.draw(st.sampled_from(["max_new_tokens", "mode", "prompts"]), label="argument")
    bad = data.draw(st.sampled_from(SPECULATIVE[name]), label="value")
    kwargs = {"prompts": [[1, 2, 3]], "max_new_tokens": 4, "mode": "greedy"}
    kwargs[name] = bad
    with pytest.raises((ValueError, TypeError)) as raised:
        decoder.autoregressive(target, **kwargs)
    assert name in str(raised.value), f"{name} = {bad!r}: {raised.value}"


@settings(settings.get_profile("fuzz"))
@given(steps=st.integers(1, 5), width=st.integers(1, 4), branch=st.integers(1, 4), seed=st.integers(0, 2**16),
       mode=st.sampled_from(["greedy", "sample"]))
def test_draft_trees_keep_their_shape_and_encode_ancestry(steps, width, branch, seed, mode):
    plan = schedule(steps, width, branch)
    batch, vocab = 2, 12
    trees = DraftTrees(batch, plan, mode, vocab, "cpu")
    trees.reset(torch.tensor([1, 2]))
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids = trees.pick(step)
        assert ids.shape == (batch, plan.runs[step])
        per_run = trees.uniforms_per_run(vocab)  # without replacement: one Gumbel key per token
        uniforms = torch.rand((batch, plan.runs[step], per_run), generator=gen, dtype=torch.float64)
        logits = 3 * torch.randn((batch, plan.runs[step], vocab), generator=gen)
        tokens, logp = trees.children(logits, ids, uniforms)
        if mode == "sample":  # siblings drawn without replacement are distinct tokens
            assert all(len(set(row)) == branch for row in tokens.reshape(-1, branch).tolist())
        trees.add_children(step, trees.rows(ids), tokens, logp)
    for b in range(batch):
        tree = trees.snapshot(b)
        parents = tree["parents"]
        assert len(parents) == plan.size and parents[0] == -1
        assert all(p < v for v, p in enumerate(parents) if v)  # numbered parent before child
        for v in range(plan.size):  # a node the draft ran has exactly `branch` children, the others none
            assert sum(p == v for p in parents) == (branch if tree["run"][v] else 0)
        rows = trees.table[b]
        start, end = rows[:, START].long().tolist(), rows[:, END].long().tolist()
        depth = rows[:, DEPTH].long().tolist()
        for i in range(plan.size):
            above, v = set(), i
            while v >= 0:
                above.add(v)
                v = parents[v]
            assert depth[i] == len(above) - 1
            for j in range(plan.size):  # the attention's interval test sees exactly the ancestors
                assert (start[j] <= start[i] and end[i] <= end[j]) == (j in above)
    size = random.Random(seed).randint(1, plan.size)
    chosen = trees.choose(size, torch.zeros((batch, plan.size), dtype=torch.long))
    assert (chosen.ids[:, 0] == 0).all() and (chosen.parents[:, 0] == -1).all()
    assert (chosen.ids[:, 1:] > chosen.ids[:, :-1]).all()
    # a subtree: every verified node's parent is verified, and named by its position among them
    assert torch.equal(chosen.ids.gather(1, chosen.parents[:, 1:]), chosen.rows[:, 1:, PARENT].long())


BUILDERS = {
    "chain": lambda n: inputs.chain(n),
    "star": lambda n: inputs.star(n),
    "caterpillar": lambda n: inputs.caterpillar(n),
    "random_tree": lambda n: inputs.random_tree(n, random.Random(0)),
    "speculative_tree": lambda n: inputs.speculative_tree(n, 1, random.Random(0)),
}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("n", [0, -3, 2.0, True, None, "4"])
def test_tree_builders_refuse_bad_sizes(builder, n):
    with pytest.raises((ValueError, TypeError), match=r"\bn\b"):
        BUILDERS[builder](n)


@pytest.mark.parametrize(
    "trees, message",
    [
        ([], "trees"),
        ([[-1, 0], [-1, 0, 0]], "same size"),
    ],
)
def test_batch_builders_refuse_bad_batches(trees, message):
    with pytest.raises(ValueError, match=message):
        inputs.batch_of_trees(trees)


def test_random_tensor_is_seeded():
    a = inputs.random_tensor((2, 3), 5, torch.float32)
    assert torch.equal(a, inputs.random_tensor((2, 3), 5, torch.float32))
