"""The course's exercises: one table that notebooks, `python -m course check` and grading share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import impl as implementations
from .checks import Report, run_cases
from .checks import attention as attention_checks
from .checks import trees as tree_checks
from .checks.tree_attention import check_tile_visibility, check_tree_attention
from .ladder import RUNGS


@dataclass(frozen=True)
class Exercise:
    id: str  # "<module>.<function>", the name lesson stubs print
    notebook: str  # e.g. "01_token_trees"
    points: int  # for grading
    cases: Callable  # cases(module, seed) -> iterable of (name, run)
    summary: str
    requires: tuple[str, ...] = ()  # exercises whose code this one's launcher also runs

    @property
    def module(self) -> str:
        return self.id.split(".")[0]

    def run(self, impl: str | None = None, seed: int = 0) -> Report:
        module = implementations.load(self.module, impl)
        return run_cases(self.id, self.cases(module, seed))


EXERCISES: dict[str, Exercise] = {
    e.id: e
    for e in [
        Exercise("trees.dfs_times_kernel", "01_token_trees", 3, tree_checks.check_dfs_times,
                 "DFS start/end times, one thread per tree"),
        Exercise("trees.tree_mask_kernel", "01_token_trees", 2, tree_checks.check_tree_mask,
                 "the dense tree mask from the DFS times"),
        Exercise("trees.tree_bitmask_kernel", "01_token_trees", 2, tree_checks.check_tree_bitmask,
                 "SpecInfer's 64-bit bitmask from the DFS times"),
        Exercise("attention.online_softmax", "02_attention", 2,
                 attention_checks.check_online_softmax, "softmax in one streaming pass"),
        Exercise("attention.flash_attention", "02_attention", 3,
                 attention_checks.check_flash_attention, "tiled attention returning the LSE"),
        Exercise("attention.merge_attention", "02_attention", 2,
                 attention_checks.check_merge_attention, "merging partial results by their LSE"),
        Exercise("ladder_bug.tree_attention_kernel", "05_times_in_shared", 3, check_tree_attention,
                 "find the bug: rung 3 with one realistic defect"),
        Exercise("ladder_k10.tile_visibility_kernel", "11b_tile_mask", 3, check_tile_visibility,
                 "the tile mask of a tree: which key tiles each query tile sees"),
    ]
    + [Exercise(f"{rung.module}.tree_attention_kernel", rung.notebook, 4, check_tree_attention,
                f"rung {rung.name}: {rung.change}",
                requires=("ladder_k10.tile_visibility_kernel",) if rung.module == "ladder_k10" else ())
       for rung in RUNGS]
}


def get(exercise: str) -> Exercise:
    """Look an exercise up by id; a wrong id lists the valid ones."""
    if exercise not in EXERCISES:
        known = ", ".join(EXERCISES)
        raise ValueError(f"exercise must be one of: {known}; got {exercise!r}")
    return EXERCISES[exercise]


def select(selector: str | None) -> list[Exercise]:
    """Exercises by id, by notebook number ('01') or all of them (None)."""
    if selector is None:
        return list(EXERCISES.values())
    if selector in EXERCISES:
        return [EXERCISES[selector]]
    chosen = [e for e in EXERCISES.values() if e.notebook.split("_")[0] == selector]
    if not chosen:
        raise ValueError(f"exercise must be an exercise id or a notebook number such as '01'; "
                         f"got {selector!r}. Exercises: {', '.join(EXERCISES)}")
    return chosen
