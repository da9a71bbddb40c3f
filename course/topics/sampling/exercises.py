"""The exercises of notebooks 15 and 21: speculative sampling by tiles, and Sequoia's siblings
drawn without replacement."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.sampling import check

# The default list (Exercise.default_cases): the edge cases that find most mistakes, within 30 s on
# one core in the simulator.
SAMPLING_DEFAULT = ("gamma = 1", "first rejected", "ties", "acceptance at float32 resolution",
                    "int64 draft tokens", "from logits, p = q")

EXERCISES = [
    Exercise("spec_sampling.tile_pass_kernel", "15_speculative_sampling", 3, check.check_tile_pass,
             "the seed paper's per-tile pass: the test r q(x) < p(x), max(0, p - q), partial sums b_k",
             default_cases=SAMPLING_DEFAULT),
    Exercise("spec_sampling.first_crossing", "15_speculative_sampling", 3, check.check_spec_sampling,
             "the inverse CDF by tiles: the crossing tile from the partial sums, then the token",
             requires=("spec_sampling.tile_pass_kernel",), default_cases=SAMPLING_DEFAULT),
    Exercise("tree_shape.sibling_draw_kernel", "21_tree_shape", 2, check.check_sibling_draw,
             "Sequoia's siblings without replacement: the Gumbel top-k of a node's logits, in one pass"),
]

TOPIC = Topic(
    notebooks=("15_speculative_sampling", "21_tree_shape"), students=("spec_sampling", "tree_shape"),
    specs=("pyspec_ref.sampling", "pyspec_ref.tree_shape"), oracles=("course.oracle.sampling",),
    why="notebook 21 (tree_shape: when a tree beats a chain) writes one kernel, the draw of a node's "
        "siblings without replacement; that draw is a draw from q, checked against "
        "pyspec_ref.sampling.gumbel_top_k with speculative sampling's inputs and argument checks, so its "
        "exercise sits in this room, and notebook 21's measurements are the capstone's (capstone.json). "
        "spec_sampling keeps its module name: its exercise ids are in gradebooks.")
