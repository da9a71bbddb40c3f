"""The course's exercises: one table that notebooks, `python -m course check` and grading share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course.core import impl as implementations
from course.core.runtime import SIMULATOR
from course.topics.attention import check as attention_checks
from course.topics.deft import check as deft_checks
from course.topics.kvcache import check as kvcache_checks
from course.topics.ladder.check import check_tile_visibility, rung_check
from course.topics.ladder.rungs import BY_MODULE, FIND_THE_BUG, RUNGS
from course.topics.sampling import check as sampling_checks
from course.topics.trees import check as tree_checks
from course.topics.triton_attention.check import check_triton_tree_attention
from course.topics.verification import check as verification_checks

from .checks import CaseResult, Report, barriers, run_cases
from .grading import speed

# The modules not written in Numba CUDA: notebook 02 is plain PyTorch, notebooks 12 onward Triton.
LANGUAGES = {"attention": "torch"} | {module: "triton" for module in (
    "triton_attention", "deft", "spec_sampling", "tree_verification", "emssd", "swiftspec", "tree_shape")}


@dataclass(frozen=True)
class Exercise:
    id: str  # "<module>.<function>", the name lesson stubs print
    notebook: str  # e.g. "01_token_trees"
    points: int  # for grading
    cases: Callable  # cases(module, seed) -> iterable of (name, run)
    summary: str
    requires: tuple[str, ...] = ()  # exercises whose code this one's launcher also runs
    # bench(impl) -> a zero-argument call of impl's ("lessons"/"solutions") kernels on fixed inputs:
    # grading on a GPU times it for the student and the solution (course.grading.speed); None: untimed
    bench: Callable | None = None
    # The default list: the beginnings of the names of the cases a check runs unless asked for the
    # full list (`--full`), chosen to finish in under 30 s on one core in the simulator; () runs every
    # case. Grading always runs the full list.
    default_cases: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return self.id.split(".")[0]

    @property
    def language(self) -> str:
        """What the exercise is written in: its check's messages speak of that language's terms."""
        return LANGUAGES.get(self.module, "numba")

    def selected_cases(self, module, seed: int, full: bool = False):
        """(name, run) of the cases to run on `module`: the default list, or every case if `full` or on a
        GPU (the default lists spare the simulator's time; a GPU runs its own sizes, under other names)."""
        cases = self.cases(module, seed)
        if full or not self.default_cases or not SIMULATOR:
            return cases
        return ((name, run) for name, run in cases if name.startswith(self.default_cases))

    def run(self, impl: str | None = None, seed: int = 0, full: bool = False) -> Report:
        module = implementations.load(self.module, impl)
        report = run_cases(self.id, self.selected_cases(module, seed, full))
        report.default_list = bool(self.default_cases) and not full and SIMULATOR
        report.also = tuple(e.id for e in checked_together(self) if e is not self)
        if report.results and not report.not_implemented:
            # The CPU cannot show a missing barrier's race: the source must still hold the solution's.
            problems = barriers.kernel_problems(self.id, module)
            if problems:
                report.results.append(CaseResult("barriers", False, "\n".join(problems)))
            if SIMULATOR and barriers.is_triton(self.id, module):
                report.note = barriers.race_note(self.id)
        return report


# Default lists (Exercise.default_cases): the edge cases that find most mistakes, within 30 s on one
# core in the simulator. A rung of the ladder runs a block in about a second there.
LADDER_DEFAULT = ("single node", "two nodes", "binary-ish", "star", "chain")
TRITON_DEFAULT = ("single node N=1, d=64, float16", "chain N=128, d=64, float16", "star N=65, d=64, float16",
                  "binary-ish N=31, d=64, float32",
                  "root last, a row that sees nothing in its first block N=67, d=64, float32",
                  "batch of 2 random trees N=35, d=16, float32")
DEFT_DEFAULT = ("a single node", "a chain of nodes", "block boundaries", "one query")
SAMPLING_DEFAULT = ("gamma = 1", "first rejected", "ties", "acceptance at float32 resolution",
                    "int64 draft tokens", "from logits, p = q")

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
        Exercise("ladder_bug.tree_attention_kernel", "05_times_in_shared", 3,
                 rung_check(BY_MODULE[FIND_THE_BUG["ladder_bug"]]),
                 "find the bug: rung 3 with one realistic defect", default_cases=LADDER_DEFAULT),
        Exercise("ladder_k10.tile_visibility_kernel", "11b_tile_mask", 3, check_tile_visibility,
                 "the tile mask of a tree: which key tiles each query tile sees"),
    ]
    + [Exercise(f"{rung.module}.tree_attention_kernel", rung.notebook, 4,
                rung_check(rung),
                f"rung {rung.name}: {rung.change}",
                requires=("ladder_k10.tile_visibility_kernel",) if rung.module == "ladder_k10" else (),
                bench=speed.rung_bench(rung.name), default_cases=LADDER_DEFAULT)
       for rung in RUNGS]
    + [Exercise("triton_attention.online_softmax_step", "12_triton_tree_attention", 3,
                check_triton_tree_attention,
                "Triton: the masked online-softmax update of one key block (DeFT and EMS-SD reuse it)",
                default_cases=TRITON_DEFAULT),
       Exercise("triton_attention.tree_attention_kernel", "12_triton_tree_attention", 1,
                check_triton_tree_attention,
                "Triton: the interval mask of a pair of blocks, by broadcasting",
                requires=("triton_attention.online_softmax_step",),
                bench=speed.triton_bench, default_cases=TRITON_DEFAULT)]
    + [Exercise("deft.reduce_partials_kernel", "13_deft_node", 3, deft_checks.check_reduce_partials,
                "DeFT's global reduction: merge each query's partials by LSE, in a fixed order"),
       Exercise("deft.deft_node_kernel", "13_deft_node", 4, deft_checks.check_deft_node,
                "DeFT-Node: the (query, head) rows of a node group's tile and its partial results",
                requires=("deft.reduce_partials_kernel", "triton_attention.online_softmax_step"),
                default_cases=DEFT_DEFAULT),
       Exercise("deft.deft_flatten_kernel", "14_deft_flatten", 4, deft_checks.check_deft_flatten,
                "DeFT-Flatten: a block's bitmask words as the mask of a score tile",
                requires=("deft.reduce_partials_kernel", "deft.deft_node_kernel",
                          "triton_attention.online_softmax_step"), default_cases=DEFT_DEFAULT)]
    + [Exercise("spec_sampling.tile_pass_kernel", "15_speculative_sampling", 3,
                sampling_checks.check_tile_pass,
                "the seed paper's per-tile pass: the test r q(x) < p(x), max(0, p - q), partial sums b_k",
                default_cases=SAMPLING_DEFAULT),
       Exercise("spec_sampling.first_crossing", "15_speculative_sampling", 3,
                sampling_checks.check_spec_sampling,
                "the inverse CDF by tiles: the crossing tile from the partial sums, then the token",
                requires=("spec_sampling.tile_pass_kernel",), default_cases=SAMPLING_DEFAULT)]
    + [Exercise("tree_verification.tree_walk_kernel", "16_tree_verification", 4,
                verification_checks.check_tree_sampling,
                "the tree walk (Sequoia: siblings without replacement; SpecInfer: with): test a child, "
                "or reject it and update (C, Z, S) in closed form"),
       Exercise("tree_verification.greedy_walk_kernel", "16_tree_verification", 2,
                verification_checks.check_greedy_verification,
                "greedy verification: follow the child whose token is the target's argmax")]
    + [Exercise("emssd.unpadded_attention_kernel", "17_ems_sd", 4, kvcache_checks.check_unpadded_attention,
                "EMS-SD: restore each flat token's sample by binary search, then its causal KV mask",
                requires=("triton_attention.online_softmax_step",))]
    + [Exercise("swiftspec.compact_kernel", "18_swiftspec_kv_cache", 3, kvcache_checks.check_compaction,
                "SwiftSpec's compaction: move KV rows left in place, overlap-safe (load, barrier, store)"),
       Exercise("swiftspec.tree_cache_attention_kernel", "18_swiftspec_kv_cache", 4,
                kvcache_checks.check_tree_cache_attention,
                "SwiftSpec's non-square tree mask: w queries against [prefix | tree] by DFS intervals",
                requires=("swiftspec.compact_kernel", "triton_attention.online_softmax_step"))]
    + [Exercise("tree_shape.sibling_draw_kernel", "21_tree_shape", 2, sampling_checks.check_sibling_draw,
                "Sequoia's siblings without replacement: the Gumbel top-k of a node's logits, in one pass")]
}


def checked_together(exercise: Exercise) -> list[Exercise]:
    """The exercise and those whose check is the very same run (notebook 12's two exercises share
    one): a pass of one is a pass of each, and one run checks them all."""
    return [e for e in EXERCISES.values() if e.module == exercise.module and e.cases is exercise.cases]


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
