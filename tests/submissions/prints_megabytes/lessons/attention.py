"""Sample submission: online_softmax is right but prints 3 MB first."""

from ._solution_attention import *  # noqa: F403
from ._solution_attention import online_softmax as _online_softmax


def online_softmax(x, block):
    print("x" * 3_000_000)
    return _online_softmax(x, block)
