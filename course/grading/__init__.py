"""Instructor grading: `python -m course grade SUBMISSIONS --out DIR --seed S`.

- `collect`: find submissions (repo copies, lessons/ folders, zips), extract zips safely;
- `worker`: the child process that imports one submission and runs the checks;
- `runner`: one submission's child processes, time/memory/output limits, what a crash means;
- `report`: gradebook.csv, feedback/<student>.md, grades.json.

Every exercise's points come from `course.exercises.EXERCISES`; partial credit is the
share of its test cases passed. The same seed gives the same grade.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .runner import ExerciseGrade, Limits, SubmissionGrade

__all__ = ["ExerciseGrade", "Limits", "SubmissionGrade", "grade"]


def grade(submissions, out, seed: int, exercises=None, limits: Limits | None = None, jobs: int = 1,
          progress: bool = True, watch=None) -> list[SubmissionGrade]:
    """Grade every submission under `submissions`, write the reports under `out`, return the grades.

    exercises: ids or notebook numbers (default: all); watch: folders whose files a submission must
    not change (default: the grader's repository).
    """
    from tqdm import tqdm

    from ..exercises import select
    from ..release import ROOT
    from . import report
    from .collect import find_submissions, lesson_stubs
    from .runner import grade_submission

    if not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    limits = limits or Limits()
    if limits.per_exercise_s <= 0 or limits.total_s <= 0:
        raise ValueError("timeouts must be positive")
    chosen = []
    for selector in exercises or [None]:
        chosen += [e for e in select(selector) if e not in chosen]
    out = Path(out)
    found = find_submissions(Path(submissions))
    if not found:
        raise ValueError(f"submissions: no submission found under {submissions}")
    watch = [ROOT] if watch is None else list(watch)
    watch += [s.source for s in found if s.source.is_dir()]
    out.mkdir(parents=True, exist_ok=True)
    lesson_stubs()  # rendered here, in the main thread (see lesson_stubs)
    with tempfile.TemporaryDirectory(prefix="course-grade-") as workroot:
        def one(submission):
            return grade_submission(submission, chosen, seed, limits, Path(workroot), watch=watch)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            grades = list(tqdm(pool.map(one, found), total=len(found), desc="grading", unit="submission",
                               disable=not progress))
    report.write_all(grades, chosen, out, seed)
    return grades
