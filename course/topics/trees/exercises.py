"""The exercises of notebook 01: the DFS times of a token tree and the masks made from them."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.trees import check

EXERCISES = [
    Exercise("trees.dfs_times_kernel", "01_token_trees", 3, check.check_dfs_times,
             "DFS start/end times, one thread per tree"),
    Exercise("trees.tree_mask_kernel", "01_token_trees", 2, check.check_tree_mask,
             "the dense tree mask from the DFS times"),
    Exercise("trees.tree_bitmask_kernel", "01_token_trees", 2, check.check_tree_bitmask,
             "SpecInfer's 64-bit bitmask from the DFS times"),
]

TOPIC = Topic(notebooks=("01_token_trees",), students=("trees",), specs=("pyspec_ref.trees",),
              oracles=("course.oracle",))
