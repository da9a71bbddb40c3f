"""Instructor grading: `python -m course grade SUBMISSIONS --out DIR --seed S`.

- `collect`: find submissions (repo copies, lessons/ folders, zips), extract zips safely;
- `worker`: the child process that imports one submission and runs the checks;
- `runner`: one submission's child processes, time/memory/output limits, what a crash means;
- `report`: gradebook.csv, feedback/<student>.md, grades.json;
- `speed`: on a GPU, each passed exercise's kernel timed against the solution's.

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
          progress: bool = True, watch=None, timing: bool = True) -> list[SubmissionGrade]:
    """Grade every submission under `submissions`, write the reports under `out`, return the grades.

    exercises: ids or notebook numbers (default: all); watch: folders whose files a submission must
    not change (default: the grader's repository); timing: on a GPU, time each passed exercise's
    kernel against the solution's (course.grading.speed; never in the simulator).
    """
    from tqdm import tqdm

    from course.core import runtime
    from course.core.impl import has_solutions

    from ..exercises import select
    from ..release import ROOT
    from . import report
    from .collect import find_submissions, lesson_stubs
    from .runner import grade_submission
    from .speed import Speed

    if not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if not has_solutions():
        raise ValueError("grading needs the course's own repository: this copy has no solutions/ "
                         "(a hand-out leaves them out)")
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
    if not timing:
        speed = Speed.untimed("timing was switched off (--no-timing)")
    elif not runtime.on_gpu():
        speed = Speed.untimed()
    else:  # the solutions once, here, before any submission shares the GPU
        speed = Speed.measure(chosen, device=runtime.device_name())
        if jobs > 1:
            speed.note = (f"Submissions were graded {jobs} at a time, so these times may include other "
                          "submissions' work on the same GPU; grade with --jobs 1 for clean timings.")
    with tempfile.TemporaryDirectory(prefix="course-grade-") as workroot:
        def one(submission):
            return grade_submission(submission, chosen, seed, limits, Path(workroot), watch=watch,
                                    time_kernels=speed.timed)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            grades = list(tqdm(pool.map(one, found), total=len(found), desc="grading", unit="submission",
                               disable=not progress))
    report.write_all(grades, chosen, out, seed, speed)
    return grades
