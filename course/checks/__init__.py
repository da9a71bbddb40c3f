"""Checks: compare a student's (or the solution's) kernel with `pyspec_ref`.

One call per exercise, `course.checks.check("trees.tree_mask")`. It runs the
exercise on a fixed list of edge cases and on fresh random cases drawn from a
seed (a public one in the notebooks, a private one when grading), prints one line
per failing case saying where and how the output differs, and raises
`CheckFailed` if anything failed, so that a notebook run stops at a wrong kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..exercise import ExerciseNotImplemented

PUBLIC_SEED = 0


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one test case: its name, pass/fail, and on failure where and how."""

    case: str
    passed: bool
    detail: str = ""


@dataclass
class Report:
    exercise: str
    results: list[CaseResult] = field(default_factory=list)
    not_implemented: str = ""

    @property
    def passed(self) -> bool:
        return not self.not_implemented and bool(self.results) and all(r.passed for r in self.results)

    @property
    def fraction(self) -> float:
        """Share of cases passed: the grader's partial credit."""
        if self.not_implemented or not self.results:
            return 0.0
        return sum(r.passed for r in self.results) / len(self.results)

    def text(self) -> str:
        if self.not_implemented:
            return f"{self.exercise}: {self.not_implemented}"
        failures = [r for r in self.results if not r.passed]
        if not failures:
            return f"{self.exercise}: passed all {len(self.results)} cases"
        lines = [f"{self.exercise} FAILED {len(failures)} of {len(self.results)} cases"]
        for result in failures:
            lines.append(f"- {result.case}:")
            lines.extend(f"    {line}" for line in result.detail.splitlines())
        passing = [r.case for r in self.results if r.passed]
        if passing:
            shown = ", ".join(passing[:4]) + (", ..." if len(passing) > 4 else "")
            lines.append(f"passing: {shown}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:  # a notebook cell ending in check(...) shows the summary
        return self.text()


def rerun_problem(first, second) -> str:
    """'' when two runs on the same input agree bit for bit; a kernel race shows up here."""
    pairs = zip(first, second, strict=True) if isinstance(first, tuple) else [(first, second)]
    if all(a.shape == b.shape and bool((a == b).all()) for a, b in pairs):
        return ""
    return "two runs on the same input differ: a race?"


class CheckFailed(AssertionError):
    """An exercise's output differs from the reference; the message says where."""


CaseRunner = Callable[[], "CaseResult | None"]


def run_cases(exercise: str, cases: Iterable[tuple[str, CaseRunner]]) -> Report:
    """Run each case, turning exceptions into failed cases (a stub stops everything)."""
    report = Report(exercise)
    for name, run in cases:
        try:
            result = run()
        except ExerciseNotImplemented as stub:
            report.not_implemented = str(stub)
            return report
        except Exception as error:  # a crash in one case must not hide the others
            result = CaseResult(name, False, f"raised {type(error).__name__}: {error}")
        report.results.append(result if result is not None else CaseResult(name, True))
    return report


def check(exercise: str, *, impl: str | None = None, seed: int = PUBLIC_SEED,
          quiet: bool = False, raise_on_failure: bool = True) -> Report:
    """Check one exercise (e.g. "trees.dfs_times") against pyspec_ref; see `course.exercises`."""
    from ..exercises import get

    report = get(exercise).run(impl=impl, seed=seed)
    if not quiet:
        print(report.text())
    if raise_on_failure and not report.passed:
        raise CheckFailed(report.text())
    return report
