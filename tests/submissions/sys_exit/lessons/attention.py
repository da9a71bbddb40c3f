"""Sample submission: online_softmax ends the process."""

import sys

from ._solution_attention import *  # noqa: F403


def online_softmax(x, block):
    sys.exit(3)
