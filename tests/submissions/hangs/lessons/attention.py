"""Sample submission: online_softmax never returns."""

from ._solution_attention import *  # noqa: F403


def online_softmax(x, block):
    while True:
        pass
