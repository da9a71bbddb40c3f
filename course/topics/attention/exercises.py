"""The exercises of notebook 02: attention in plain PyTorch, one streaming pass at a time."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.attention import check

EXERCISES = [
    Exercise("attention.online_softmax", "02_attention", 2, check.check_online_softmax,
             "softmax in one streaming pass"),
    Exercise("attention.flash_attention", "02_attention", 3, check.check_flash_attention,
             "tiled attention returning the LSE"),
    Exercise("attention.merge_attention", "02_attention", 2, check.check_merge_attention,
             "merging partial results by their LSE"),
]

TOPIC = Topic(notebooks=("02_attention",), students=("attention",), specs=("pyspec_ref.attention",),
              oracles=("course.oracle",))
