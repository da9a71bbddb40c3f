"""The ladder's tree-attention check passes a correct implementation and catches wrong ones."""

from types import SimpleNamespace

import torch

from course import oracle
from course.checks import run_cases
from course.topics.ladder.check import check_tree_attention


def _correct(q, k, v, start, end):
    return oracle.tree_attention(q, k, v, start, end)[0].float()


def _report(function, head_dims=(8, 16)):
    module = SimpleNamespace(tree_attention=function, HEAD_DIMS=head_dims, TILE=8)
    return run_cases("ladder.tree_attention", check_tree_attention(module, seed=3, heads=2))


def test_a_correct_implementation_passes_every_case():
    report = _report(_correct)
    assert report.passed and len(report.results) >= 10


def test_causal_instead_of_tree_mask_is_caught_on_trees_only():
    def causal(q, k, v, start, end):
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return oracle.attention_with_lse(q, k, v, mask)[0].float()

    report = _report(causal)
    assert 0 < report.fraction < 1  # chains, N = 1 and N = 2 still pass
    assert "batch 0, head" in report.text()


def test_scores_truncated_before_the_max_are_caught():
    def truncated(q, k, v, start, end):  # a classic bug: int(score) before the row max
        scale = q.shape[-1] ** -0.5
        scores = torch.trunc((q.double() @ k.double().transpose(-1, -2)) * scale)
        mask = oracle.dense_tree_mask(start.long(), end.long()).unsqueeze(1)
        scores = scores.masked_fill(~mask, float("-inf"))
        return (torch.softmax(scores, -1) @ v.double()).float()

    report = _report(truncated)
    assert report.fraction < 0.5 and "max |got - expected|" in report.text()
