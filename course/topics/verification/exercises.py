"""The exercises of notebook 16: walking a token tree to verify it, sampled and greedy."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.verification import check

EXERCISES = [
    Exercise("tree_verification.tree_walk_kernel", "16_tree_verification", 4, check.check_tree_sampling,
             "the tree walk (Sequoia: siblings without replacement; SpecInfer: with): test a child, "
             "or reject it and update (C, Z, S) in closed form"),
    Exercise("tree_verification.greedy_walk_kernel", "16_tree_verification", 2,
             check.check_greedy_verification,
             "greedy verification: follow the child whose token is the target's argmax"),
]

TOPIC = Topic(
    notebooks=("16_tree_verification",), students=("tree_verification",), specs=("pyspec_ref.sampling",),
    oracles=("course.oracle.sampling",),
    why="the student module tree_verification and its exercise ids keep the notebook's name, which "
        "gradebooks use; the room, its bench and its results file are `verification`.")
