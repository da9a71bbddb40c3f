"""Our reference answers, shown once you have earned them: when your own code passes the check.

Each notebook's "Compare with ours" cell calls `compare_with_ours(exercise)`. It prints our
reference (from `solutions/`) when that exercise's check has passed on your `lessons/` code as it
stands now, or when the course runs on the reference itself (`COURSE_IMPL=solutions`: instructors
and CI). Otherwise it prints one line saying how to get there. `reveal(exercise)` prints it
whenever you ask: reading an answer is a choice, never an accident one cell below the exercise.

A check of your lessons that passes (`course.check`, `python -m course check`) records the
exercise (`course.progress`), with a hash of the lesson functions that hold the exercise's
regions. Edit them after the pass, and the reference hides again until the check passes anew.
"""

from __future__ import annotations

from .checks import Exercise
from .core import impl, regions
from .core.regions import LESSON, marked_lines
from .core.source import diff_sources, function_in_file
from .progress import fingerprint, holders, passes
from .registry import EXERCISES
from .topics.ladder.rungs import builds_on

NO_REFERENCE = ("This copy of the course has no reference answers (a hand-out leaves solutions/ out): "
                "your passing check is the answer; your instructor may show theirs once the exercise closes.")


def earned(exercise_id: str) -> bool:
    """True when the course runs the reference (COURSE_IMPL=solutions), or when the exercise's check
    passed on your code as it stands now."""
    exercise = _exercise(exercise_id)
    if impl.impl_name() == "solutions":
        return True
    recorded = passes().get(exercise.id)
    return recorded is not None and recorded == fingerprint(exercise)


def not_yet(exercise_id: str) -> str:
    """The one line a "Compare with ours" cell prints while the reference stays hidden."""
    exercise = _exercise(exercise_id)
    ask = f'course.reveal("{exercise.id}")'
    if exercise.id in passes():
        return (f"{exercise.id}: your code changed since its check passed. Run the check again to "
                f"compare with ours here, or ask for ours now with {ask}.")
    return (f"{exercise.id}: our reference appears here once your check passes "
            f'(course.check("{exercise.id}")). To see it now anyway: {ask}.')


# --------------------------------------------------------------------------------- the reference

def _exercise(exercise_id: str) -> Exercise:
    if exercise_id not in EXERCISES:
        raise ValueError(f"exercise must be an exercise id such as 'trees.dfs_times_kernel' "
                         f"(`python -m course list`), got {exercise_id!r}")
    return EXERCISES[exercise_id]


def exercises_of(target: str) -> list[Exercise]:
    """The exercises a target names: an exercise id, or a lesson module (all of its exercises)."""
    if not isinstance(target, str):
        raise TypeError(f"target must be an exercise id or a module name, got {type(target).__name__}")
    if target in EXERCISES:
        return [EXERCISES[target]]
    chosen = [e for e in EXERCISES.values() if e.module == target]
    if not chosen:
        modules = ", ".join(dict.fromkeys(e.module for e in EXERCISES.values()))
        raise ValueError(f"target must be an exercise id (`python -m course list`) or one of the "
                         f"modules {modules}; got {target!r}")
    return chosen


def _solution_text(module: str) -> str:
    path = regions.ROOT / "solutions" / f"{module}.py"
    if not impl.has_solutions() or not path.is_file():
        raise impl.SolutionsMissing(NO_REFERENCE)
    return path.read_text()


def reference(exercise_id: str) -> str:
    """Our answer to one exercise, as the notebooks show it. A ladder rung: its change from the rung
    it builds on, as a diff. A find-the-bug exercise: its regions (the fix, then after `### LESSON`
    the defect, commented out). Otherwise the solution's functions that hold the exercise's
    regions, whole, the answer's lines between `### BEGIN SOLUTION` and `### END SOLUTION`."""
    exercise = _exercise(exercise_id)
    text = _solution_text(exercise.module)
    shown = []
    for name in holders(exercise):
        mine = function_in_file(text, name) or ""
        base = builds_on().get(exercise.module)
        before = None if base is None or LESSON in mine else function_in_file(_solution_text(base), name)
        if LESSON in mine:
            shown.append(f"# ours, solutions/{exercise.module}.py, {name}: the region of the defect\n"
                         + marked_lines(mine))
        elif before is not None:
            shown.append(f"# ours: what rung {exercise.module} changes in {name}, from {base}'s solution\n"
                         + diff_sources(before, mine, f"{base}.{name}", f"{exercise.module}.{name}"))
        else:
            shown.append(f"# ours, solutions/{exercise.module}.py: the answer stands between "
                         f"### BEGIN SOLUTION and ### END SOLUTION\n{mine}")
    return "\n\n".join(shown)


def compare_with_ours(target: str) -> None:
    """A notebook's "Compare with ours" cell: our reference for each exercise of `target` (an exercise
    id or a module) that you have earned (see `earned`), one line saying how to earn it for the others."""
    exercises = exercises_of(target)
    if not impl.has_solutions():
        print(NO_REFERENCE)
        return
    print("\n\n".join(reference(e.id) if earned(e.id) else not_yet(e.id) for e in exercises))


def reveal(target: str) -> None:
    """Our reference for `target` (an exercise id or a module), now, because you asked: passed or not."""
    exercises = exercises_of(target)
    if not impl.has_solutions():
        print(NO_REFERENCE)
        return
    print("\n\n".join(reference(e.id) for e in exercises))
