"""The course's exercises: one table that notebooks, `python -m course check`, grading, the release
and the answers share, assembled from what each topic declares in course/topics/<topic>/exercises.py.

`check(exercise)` is what a notebook's check cell calls (`course.check`): it runs the exercise's
check, prints the report and, when your lessons/ pass, records the pass (`course.progress`), so
that the notebook's "Compare with ours" cell shows the reference (`course.answers`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from course import progress, topics
from course.checks import PUBLIC_SEED, CheckFailed, Exercise, Report
from course.core.impl import impl_name


def notebook_number(name: str) -> str:
    """'06' for notebooks/06_coalesced_tiles.ipynb (or an exercise's notebook '06_coalesced_tiles'). As
    strings the numbers sort in course order: '11' < '11a' < '11c' < '12'."""
    return Path(name).name.split("_")[0]


def declared() -> dict[str, Exercise]:
    """Every topic's exercises (`EXERCISES` of course/topics/<topic>/exercises.py) by id, in the order
    of their notebooks, each knowing the topic that declares it."""
    found: dict[str, Exercise] = {}
    for topic in topics.names():
        for exercise in topics.part_of(topic, "exercises").EXERCISES:
            if exercise.id in found:
                raise ValueError(f"exercise {exercise.id} is declared by both {found[exercise.id].topic} "
                                 f"and {topic}")
            found[exercise.id] = dataclasses.replace(exercise, topic=topic)
    ordered = sorted(found.values(), key=lambda e: notebook_number(e.notebook))  # stable: a topic's order
    return {e.id: e for e in ordered}


EXERCISES: dict[str, Exercise] = declared()


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
    chosen = [e for e in EXERCISES.values() if notebook_number(e.notebook) == selector]
    if not chosen:
        raise ValueError(f"exercise must be an exercise id or a notebook number such as '01'; "
                         f"got {selector!r}. Exercises: {', '.join(EXERCISES)}")
    return chosen


def check(exercise: str, *, impl: str | None = None, seed: int = PUBLIC_SEED, full: bool = False,
          quiet: bool = False, raise_on_failure: bool = True, verbose: bool = False) -> Report:
    """Check one exercise (e.g. "trees.dfs_times_kernel") against pyspec_ref.

    The default list of cases is quick in the simulator; `full` runs every case, as grading does.
    `verbose` shows the whole traceback of a kernel or launcher that raised. A pass on your lessons/
    is recorded, so that the notebook's "Compare with ours" cell shows the reference (`course.answers`);
    a check that runs two exercises' code on the same cases records both.
    """
    chosen = get(exercise)
    together = checked_together(chosen)
    report = chosen.run(impl=impl, seed=seed, full=full)
    report.also = tuple(e.id for e in together if e is not chosen)
    if report.passed and (impl or impl_name()) == "lessons":
        progress.record_pass(together)
    if not quiet:
        print(report.text(verbose))
    if raise_on_failure and not report.passed:
        raise CheckFailed(report.text(verbose))
    return report
