"""The exercises of notebook 12: tree attention in Triton. Both run the same check; the kernel is
timed when grading on a GPU (`bench.grading_kernels`)."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.triton_attention.check import check_triton_tree_attention

# The default list (Exercise.default_cases): the edge cases that find most mistakes, within 30 s on
# one core in the simulator.
TRITON_DEFAULT = ("single node N=1, d=64, float16", "chain N=128, d=64, float16", "star N=65, d=64, float16",
                  "binary-ish N=31, d=64, float32",
                  "root last, a row that sees nothing in its first block N=67, d=64, float32",
                  "batch of 2 random trees N=35, d=16, float32")

EXERCISES = [
    Exercise("triton_attention.online_softmax_step", "12_triton_tree_attention", 3,
             check_triton_tree_attention,
             "Triton: the masked online-softmax update of one key block (DeFT and EMS-SD reuse it)",
             default_cases=TRITON_DEFAULT),
    Exercise("triton_attention.tree_attention_kernel", "12_triton_tree_attention", 1,
             check_triton_tree_attention,
             "Triton: the interval mask of a pair of blocks, by broadcasting",
             requires=("triton_attention.online_softmax_step",), timed=True, default_cases=TRITON_DEFAULT),
]

TOPIC = Topic(notebooks=("12_triton_tree_attention",), students=("triton_attention",),
              specs=("pyspec_ref.attention",), oracles=("course.oracle",))
