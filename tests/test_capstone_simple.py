"""The readable decoder (`course.capstone.simple`, notebook 19) with the tiny pair on the CPU: its greedy
tokens are the graphed decoder's and plain greedy decoding's; it stands on its own; bad input."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import decoder, simple
from course.capstone.text import encode
from course.capstone.weights import load_pair
from course.core import runtime

PROMPTS = ["The old fox ", "12 + 7 = "]
NEW = 10


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


def target_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy continuation: full-sequence forward passes, no cache, no kernels."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq], device=model.device))[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("tree_size, width, branch, steps", [(8, 2, 4, 3), (4, 1, 1, 3)])
def test_greedy_tokens_equal_the_graphed_decoder_and_plain_decoding(pair, tree_size, width, branch, steps):
    prompts = [encode(p) for p in PROMPTS]
    settings = dict(tree_size=tree_size, width=width, branch=branch, steps=steps)
    fast = decoder.speculative(pair.target, pair.draft, prompts, NEW, impl="solutions", **settings)
    for b, prompt in enumerate(prompts):
        got = simple.generate(pair.target, pair.draft, prompt, NEW, impl="solutions", **settings)
        want = target_greedy(pair.target, prompt, NEW)
        assert got.tokens == fast.tokens[b] == want
        assert got.tokens == simple.plain_greedy(pair.target, prompt, NEW, impl="solutions")
        assert len(got.accepted) < NEW and sum(got.accepted) > 0  # the draft does get tokens accepted
        assert all(0 <= a <= steps for a in got.accepted)  # a round accepts at most the tree's depth


def test_a_one_token_prompt(pair):
    prompt = encode("T")
    got = simple.generate(pair.target, pair.draft, prompt, 6, tree_size=6, width=2, branch=2, steps=3,
                          impl="solutions")
    assert got.tokens == target_greedy(pair.target, prompt, 6)


def test_it_stands_on_its_own():
    """It reads the model, the kernels (through course.core.impl) and the specification's DFS times,
    nothing of the fast decoder's machinery."""
    tree = ast.parse(Path(simple.__file__).read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
    assert imported == {"__future__", "dataclasses", "torch", "course.core", "pyspec_ref.trees", "model"}


def test_bad_input(pair):
    prompt = encode("The")
    for kwargs, name in ((dict(prompt=[]), "prompt"), (dict(max_new_tokens=0), "max_new_tokens"),
                         (dict(tree_size=0), "tree_size"), (dict(width=True), "width"),
                         (dict(steps=1.5), "steps")):
        call = dict(prompt=prompt, max_new_tokens=4) | kwargs
        with pytest.raises(ValueError, match=name):
            simple.generate(pair.target, pair.draft, call.pop("prompt"), call.pop("max_new_tokens"), **call)
    with pytest.raises(ValueError, match="prompt"):
        simple.plain_greedy(pair.target, "The", 4)
