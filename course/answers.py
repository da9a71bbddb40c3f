"""Our reference answers, shown once you have earned them: when your own code passes the check.

Each notebook's "Compare with ours" cell calls `compare_with_ours(exercise)`. It prints our
reference (from `solutions/`) when that exercise's check has passed on your `lessons/` code as it
stands now, or when the course runs on the reference itself (`COURSE_IMPL=solutions`: instructors
and CI). Otherwise it prints one line saying how to get there. `reveal(exercise)` prints it
whenever you ask: reading an answer is a choice, never an accident one cell below the exercise.

A check of your lessons that passes (`course.checks.check`, `python -m course check`) records the
exercise in `.course/passed.json` at the repository root (git ignores it), with a hash of the
lesson functions that hold the exercise's regions. Edit them after the pass, and the reference
hides again until the check passes anew.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .core import impl
from .core.source import diff_sources, function_in_file
from .exercises import EXERCISES, Exercise, checked_together

PASSES_ENV = "COURSE_PASSES"  # a file to keep the record of passes in, instead of the default
NO_REFERENCE = ("This copy of the course has no reference answers (a hand-out leaves solutions/ out): "
                "your passing check is the answer; your instructor may show theirs once the exercise closes.")


# ------------------------------------------------------------------------------ the record of passes

def _places() -> list[Path]:
    """Where the record may live, first choice first: the repository, else (a read-only copy of the
    course) the user's cache, one file per repository."""
    override = os.environ.get(PASSES_ENV, "").strip()
    if override:
        return [Path(override)]
    repository = hashlib.sha256(str(impl.ROOT).encode()).hexdigest()[:12]
    return [impl.ROOT / ".course" / "passed.json",
            Path.home() / ".cache" / "speckernels" / f"passed-{repository}.json"]


def _read(path: Path) -> dict[str, str]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, unreadable or damaged: as if nothing had passed
        return {}
    return {k: v for k, v in record.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(record, dict) else {}


def passes() -> dict[str, str]:
    """Exercise id -> the hash of your code when its check last passed."""
    record: dict[str, str] = {}
    for path in reversed(_places()):  # the first place wins
        record.update(_read(path))
    return record


def _write(record: dict[str, str]) -> bool:
    for path in _places():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            partial.replace(path)  # whole or not at all: a notebook and a terminal may both write
            return True
        except OSError:
            continue
    return False


def _holders(exercise: Exercise) -> tuple[str, ...]:
    """The functions that hold the exercise's regions (a helper's too), from the solution where it
    is here; else the function the exercise is named after."""
    from .release import region_functions

    own = (exercise.id.split(".", 1)[1],)
    solution = impl.ROOT / "solutions" / f"{exercise.module}.py"
    if not impl.has_solutions() or not solution.is_file():
        return own
    found = region_functions(solution.read_text(), exercise.module, f"solutions/{solution.name}")
    return found.get(exercise.id) or own


def fingerprint(exercise: Exercise) -> str | None:
    """A hash of your lesson functions that hold the exercise's regions, read from lessons/ (None
    if the file cannot be read or parsed)."""
    try:
        text = (impl.ROOT / "lessons" / f"{exercise.module}.py").read_text()
        names = dict.fromkeys((*_holders(exercise), exercise.id.split(".", 1)[1]))
        sources = [function_in_file(text, name) or "" for name in names]
    except (OSError, SyntaxError, ValueError):
        return None
    return hashlib.sha256("\n\x00\n".join(sources).encode()).hexdigest()


def record_pass(exercise_id: str) -> bool:
    """Note that the exercise's check passed on your lessons/ code as it stands. False if the record
    could not be written anywhere (the check's result stands all the same)."""
    record = passes()
    for exercise in checked_together(_exercise(exercise_id)):
        code = fingerprint(exercise)
        if code is not None:
            record[exercise.id] = code
    return _write(record)


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
            f'(course.checks.check("{exercise.id}")). To see it now anyway: {ask}.')


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
    path = impl.ROOT / "solutions" / f"{module}.py"
    if not impl.has_solutions() or not path.is_file():
        raise impl.SolutionsMissing(NO_REFERENCE)
    return path.read_text()


def reference(exercise_id: str) -> str:
    """Our answer to one exercise, as the notebooks show it. A ladder rung: its change from the rung
    it builds on, as a diff. A find-the-bug exercise: its regions (the fix, then after `### LESSON`
    the defect, commented out). Otherwise the solution's functions that hold the exercise's
    regions, whole, the answer's lines between `### BEGIN SOLUTION` and `### END SOLUTION`."""
    from .release import LESSON
    from .topics.ladder.rungs import builds_on

    exercise = _exercise(exercise_id)
    text = _solution_text(exercise.module)
    shown = []
    for name in _holders(exercise):
        mine = function_in_file(text, name) or ""
        base = builds_on().get(exercise.module)
        before = None if base is None or LESSON in mine else function_in_file(_solution_text(base), name)
        if LESSON in mine:
            shown.append(f"# ours, solutions/{exercise.module}.py, {name}: the region of the defect\n"
                         + _regions(mine))
        elif before is not None:
            shown.append(f"# ours: what rung {exercise.module} changes in {name}, from {base}'s solution\n"
                         + diff_sources(before, mine, f"{base}.{name}", f"{exercise.module}.{name}"))
        else:
            shown.append(f"# ours, solutions/{exercise.module}.py: the answer stands between "
                         f"### BEGIN SOLUTION and ### END SOLUTION\n{mine}")
    return "\n\n".join(shown)


def _regions(source: str) -> str:
    """The exercise regions of a function's source, markers included, separated by '...'."""
    from .release import BEGIN, END

    kept, inside = [], False
    for line in source.splitlines():
        inside = inside or line.strip().startswith(BEGIN)
        if inside:
            kept.append(line)
        if line.strip().startswith(END):
            inside = False
            kept.append("...")
    return "\n".join(kept[:-1])


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
