"""Sample submission: merge_attention crashes the interpreter (reads address 0)."""

import ctypes

from ._solution_attention import *  # noqa: F403


def merge_attention(*args, **kwargs):
    return ctypes.string_at(0)
