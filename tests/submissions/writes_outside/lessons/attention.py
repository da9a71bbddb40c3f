"""Sample submission: online_softmax is right but writes a file next to its folder."""

from pathlib import Path

from ._solution_attention import *  # noqa: F403
from ._solution_attention import online_softmax as _online_softmax


def online_softmax(x, block):
    (Path(__file__).resolve().parents[2] / "escaped.txt").write_text("written by a submission")
    return _online_softmax(x, block)
