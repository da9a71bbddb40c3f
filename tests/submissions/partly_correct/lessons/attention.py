"""Sample submission: a softmax without the running maximum, so large scores overflow."""

import torch

from ._solution_attention import *  # noqa: F403  (tests/test_grade.py writes it from solutions/)


def online_softmax(x, block):
    e = torch.exp(x)  # exp(900) is inf in float64: inf / inf = nan
    return e / e.sum(dim=-1, keepdim=True)
