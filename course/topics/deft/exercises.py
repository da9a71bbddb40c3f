"""The exercises of notebooks 13 and 14: DeFT's global reduction, DeFT-Node and DeFT-Flatten."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.deft import check

# The default list (Exercise.default_cases): the edge cases that find most mistakes, within 30 s on
# one core in the simulator.
DEFT_DEFAULT = ("a single node", "a chain of nodes", "block boundaries", "one query")

EXERCISES = [
    Exercise("deft.reduce_partials_kernel", "13_deft_node", 3, check.check_reduce_partials,
             "DeFT's global reduction: merge each query's partials by LSE, in a fixed order"),
    Exercise("deft.deft_node_kernel", "13_deft_node", 4, check.check_deft_node,
             "DeFT-Node: the (query, head) rows of a node group's tile and its partial results",
             requires=("deft.reduce_partials_kernel", "triton_attention.online_softmax_step"),
             default_cases=DEFT_DEFAULT),
    Exercise("deft.deft_flatten_kernel", "14_deft_flatten", 4, check.check_deft_flatten,
             "DeFT-Flatten: a block's bitmask words as the mask of a score tile",
             requires=("deft.reduce_partials_kernel", "deft.deft_node_kernel",
                       "triton_attention.online_softmax_step"), default_cases=DEFT_DEFAULT),
]

TOPIC = Topic(notebooks=("13_deft_node", "14_deft_flatten"), students=("deft",), specs=("pyspec_ref.deft",),
              oracles=("course.oracle",))
