"""The exercises of the ladder (notebooks 03-11c): one per rung, the find-the-bug kernel of notebook
05 and notebook 11b's tile mask. Every rung is timed when grading on a GPU (`bench.grading_kernels`)."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.ladder.check import check_tile_visibility, rung_check
from course.topics.ladder.rungs import BY_MODULE, FIND_THE_BUG, RUNGS

# The default list (Exercise.default_cases): the edge cases that find most mistakes, within 30 s on
# one core in the simulator. A rung of the ladder runs a block in about a second there.
LADDER_DEFAULT = ("single node", "two nodes", "binary-ish", "star", "chain")

EXERCISES = [
    Exercise("ladder_bug.tree_attention_kernel", "05_times_in_shared", 3,
             rung_check(BY_MODULE[FIND_THE_BUG["ladder_bug"]]),
             "find the bug: rung 3 with one realistic defect", default_cases=LADDER_DEFAULT),
    Exercise("ladder_k10.tile_visibility_kernel", "11b_tile_mask", 3, check_tile_visibility,
             "the tile mask of a tree: which key tiles each query tile sees"),
] + [
    Exercise(f"{rung.module}.tree_attention_kernel", rung.notebook, 4, rung_check(rung),
             f"rung {rung.name}: {rung.change}",
             requires=("ladder_k10.tile_visibility_kernel",) if rung.module == "ladder_k10" else (),
             timed=True, default_cases=LADDER_DEFAULT)
    for rung in RUNGS
]

TOPIC = Topic(
    notebooks=("03_baseline", "04_sequence_parallelism", "05_times_in_shared", "06_coalesced_tiles",
               "07_register_mask", "08_register_tiling_pv", "09_coalesced_writes", "10_register_tiling_qk",
               "11_results", "11a_tile_skipping", "11b_tile_mask", "11c_loads_in_flight"),
    students=tuple(rung.module for rung in RUNGS) + tuple(FIND_THE_BUG),
    specs=("pyspec_ref.attention",), oracles=("course.oracle",))
