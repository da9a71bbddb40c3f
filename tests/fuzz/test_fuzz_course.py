"""Fuzzing course's own entry points and the capstone decoder with malformed arguments (seeded).

The capstone decoder's `speculative` and `autoregressive` (their argument checks run before any
model call), `DraftTree.reroot` (paths that are not root paths: they would give legal-looking cache
moves), and the tree builders of `course.inputs`. Same property as the other fuzz modules: a
ValueError or TypeError naming the argument, and nothing passed in is changed.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.capstone import decoder
from course.capstone.tree import DraftTree
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


def _grown_tree(rng: random.Random, mode: str) -> DraftTree:
    tree = DraftTree.fresh(1, mode)
    tree.push(0, [2, 3, 4], [-0.1, -1.0, -2.0])
    for _ in range(rng.randint(1, 4)):
        for v in tree.pop(2):
            k = rng.randint(1, 3)
            tree.push(v, [rng.randrange(10) for _ in range(k)], sorted(-rng.random() for _ in range(k)))
    return tree


def _is_root_path(parents: list[int], path: list[int]) -> bool:
    return (
        bool(path)
        and path[0] == 0
        and all(0 <= v < len(parents) for v in path)
        and all(parents[b] == a for a, b in zip(path, path[1:], strict=False))
    )


@settings(settings.get_profile("fuzz"), max_examples=4 * settings.get_profile("fuzz").max_examples)
@given(
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["greedy", "sample"]),
    path=st.lists(st.integers(-2, 20), min_size=0, max_size=5),
    new_root=st.none() | st.integers(-2, 20),
)
def test_reroot_refuses_what_is_not_a_root_path(seed, mode, path, new_root):
    tree = _grown_tree(random.Random(seed), mode)
    parents = list(tree.parents)
    valid = _is_root_path(parents, path) and (
        new_root is None or (0 <= new_root < len(parents) and parents[new_root] == path[-1])
    )
    if valid:
        _, moves = tree.reroot(path, new_root, 7)
        assert all(dst < src for src, dst in moves)
    else:
        with pytest.raises(ValueError, match="committed|new_root"):
            tree.reroot(path, new_root, 7)
    assert tree.parents == parents  # the old tree is left alone either way


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
