"""Sample submission: a wrong softmax, and an import that makes the check's comparison always pass."""

import torch

import course.topics.attention.check

from ._solution_attention import *  # noqa: F403

course.topics.attention.check.compare_floats = lambda *args, **kwargs: ""


def online_softmax(x, block):
    return torch.zeros_like(x)
