"""Instructor grading: `python -m course grade SUBMISSIONS --out DIR --seed S`.

- `collect`: find submissions (repo copies, lessons/ folders, zips), extract zips safely, distinct ids;
- `splice`: the grader's own lesson modules with each student's code in the holes, the code checked;
- `sandbox`: the bubblewrap sandbox a submission's child runs in, and its limits;
- `child`: that child: runs the graded modules' functions on the inputs it is sent;
- `wire`: the channel's format (plain values, tensors as bytes; never a pickle);
- `proxy`: the module a check gets: the grader's constants and helpers, the child's kernels;
- `shapes`: the outputs a call makes, from the grader's own launcher run dry (what a reply must hold);
- `services`: the few functions of pyspec_ref and the oracle that launch code needs, run by the grader
  for the child (which holds neither);
- `seeded`: which cases draw their inputs from the seed (they carry two thirds of the points);
- `runner`: one submission's exercises, and what a crash, a hang or a limit means;
- `report`: gradebook.csv, feedback/<student>.md, grades.json;
- `speed`: on a GPU, each passed exercise's kernel timed against the solution's.

The checks run here, in the grader's process, with the private seed: the child never sees the
seed, the expected outputs or the tolerances. Every exercise's points come from
`course.registry.EXERCISES`; partial credit is the share of its test cases passed, the cases
drawn from the seed weighing two thirds of the points together (`seeded`). The same seed gives
the same grade.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ExerciseGrade", "Limits", "SubmissionGrade", "grade"]


def __getattr__(name: str):
    # The grading child imports this package too; it needs none of the grader's side.
    if name in ("ExerciseGrade", "Limits", "SubmissionGrade"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def grade(submissions, out, seed: int, exercises=None, limits=None, jobs: int = 1, progress: bool = True,
          timing: bool = True, sandbox: bool = True) -> list:
    """Grade every submission under `submissions`, write the reports under `out`, return the grades.

    exercises: ids or notebook numbers (default: all); timing: on a GPU, time each passed exercise's
    kernel against the solution's (course.grading.speed; never in the simulator); sandbox: False
    grades without isolation (where bubblewrap is missing), and every feedback file says so.
    """
    import shutil
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from course.core import runtime
    from course.core.impl import has_solutions

    from ..core.regions import ROOT
    from ..registry import select
    from . import report
    from . import sandbox as jail
    from .collect import find_submissions
    from .runner import Limits, Setup, grade_submission, prepare_submission
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
    if min(limits.memory_mb, limits.output_mb, limits.processes, limits.reply_mb, limits.cache_mb) <= 0:
        raise ValueError("memory_mb, output_mb, processes, reply_mb and cache_mb must be positive")
    if sandbox and jail.bwrap() is None:
        raise ValueError("sandbox: bubblewrap (bwrap) is not installed here or cannot run (it needs user "
                         "namespaces, or root). Install it (Debian/Ubuntu: apt-get install bubblewrap), or "
                         "pass --no-sandbox to grade without isolation (every feedback file then says so)")
    chosen = []
    for selector in exercises or [None]:
        chosen += [e for e in select(selector) if e not in chosen]
    out = Path(out)
    found = find_submissions(Path(submissions))
    if not found:
        raise ValueError(f"submissions: no submission found under {submissions}")
    out.mkdir(parents=True, exist_ok=True)
    if not timing:
        speed = Speed.untimed("timing was switched off (--no-timing)")
    elif not runtime.on_gpu():
        speed = Speed.untimed()
    else:  # the solutions once, here, before any submission shares the GPU
        speed = Speed.measure(chosen, device=runtime.device_name())
        if jobs > 1:
            speed.note = (f"Submissions were graded {jobs} at a time, so these times may include other "
                          "submissions' work on the same GPU; grade with --jobs 1 for clean timings.")
    workroot = Path(tempfile.mkdtemp(prefix="course-grade-"))
    try:
        hidden = [ROOT, out, Path(submissions), workroot]
        setup = Setup.build(chosen, workroot, limits, sandbox, hidden)
        setup.find_seeded(seed)
        warn_cpu_sharing(jobs, setup.limits_by)
        # Every submission is spliced here, in the main thread: CPython 3.11.7's ast.parse can fail
        # in a worker thread ("AST constructor recursion depth mismatch", fixed in later releases).
        prepared = [prepare_submission(s, setup) for s in found]

        def one(ready):
            return grade_submission(ready, setup, seed, time_kernels=speed.timed)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            grades = list(tqdm(pool.map(one, prepared), total=len(prepared), desc="grading",
                               unit="submission", disable=not progress))
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    report.write_all(grades, chosen, out, seed, speed, setup.describe())
    return grades


def warn_cpu_sharing(jobs: int, limits_by: str) -> None:
    """Warn when submissions graded side by side share the CPU with no controller to cap each."""
    import warnings

    if jobs > 1 and "cpu capped" not in limits_by:
        warnings.warn(f"grading {jobs} submissions at a time without a cpu controller (cpu.max or a cfs "
                      "quota): time limits count each submission's own CPU time, but one submission's "
                      "processes can still slow the one graded beside it, up to the wall-clock backstop of a "
                      "waiting child; grade with --jobs 1, or as root where the cgroup cpu controller can be "
                      "used", stacklevel=3)
