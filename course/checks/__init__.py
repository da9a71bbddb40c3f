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
from .crash import Crash, describe
from .diagnose import speaking_of

PUBLIC_SEED = 0


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one test case: its name, pass/fail, and on failure where and how."""

    case: str
    passed: bool
    detail: str = ""
    crash: Crash | None = field(default=None, compare=False)  # set when the case raised


@dataclass
class Report:
    exercise: str
    results: list[CaseResult] = field(default_factory=list)
    not_implemented: str = ""
    note: str = ""  # said under a pass: what the cases cannot show
    default_list: bool = False  # only the default list of cases ran (`--full` runs them all)
    also: tuple[str, ...] = ()  # other exercises whose check is this very run (notebook 12's two)

    @property
    def passed(self) -> bool:
        return not self.not_implemented and bool(self.results) and all(r.passed for r in self.results)

    @property
    def fraction(self) -> float:
        """Share of cases passed: the grader's partial credit."""
        if self.not_implemented or not self.results:
            return 0.0
        return sum(r.passed for r in self.results) / len(self.results)

    def text(self, verbose: bool = False) -> str:
        """The summary a check prints; `verbose` adds each distinct crash's whole traceback."""
        if self.not_implemented:
            return f"{self.exercise}: {self.not_implemented}"
        failures = [r for r in self.results if not r.passed]
        named = ", ".join((self.exercise, *self.also))
        if not failures:
            full = (f" (the default list; `python -m course check {self.exercise} --full` runs every case, "
                    "as grading does)" if self.default_list else "")
            passed = f"{named}: passed all {len(self.results)} cases{full}"
            return f"{passed}\n{self.note}" if self.note else passed
        lines = [f"{named} FAILED {len(failures)} of {len(self.results)} cases"]
        explained: set[str] = set()  # a case's explanation, once: later cases say only where
        for result in failures:
            if result.crash is None:
                where, *why = result.detail.splitlines() or [""]
                lines += [f"- {result.case}:", f"    {where}"]
                lines += [f"    {line}" for line in why if line not in explained]
                if why and set(why) <= explained:
                    lines.append("    (explained above)")
                explained.update(why)
        lines.extend(self._crash_lines(verbose))
        passing = [r.case for r in self.results if r.passed]
        if passing:
            lines.append(f"passing: {_some(passing)}")
        return "\n".join(lines)

    def _crash_lines(self, verbose: bool) -> list[str]:
        """Each distinct crash once, with the cases it hit: the same bug fails every case alike."""
        crashes: dict[tuple[str, ...], list[CaseResult]] = {}
        for result in self.results:
            if not result.passed and result.crash is not None:
                crashes.setdefault(result.crash.key, []).append(result)
        lines = []
        for hit in crashes.values():
            crash = hit[0].crash
            cases = (f"the same error in all {len(hit)} cases" if len(hit) == len(self.results) > 1
                     else f"in {len(hit)} of {len(self.results)} cases: " + _some(r.case for r in hit))
            lines.append(f"- raised {crash.kind}: {crash.message}")
            lines.append(f"  ({cases}; first in {hit[0].case})")
            lines.extend(f"    {line}" for line in crash.lines())
            if verbose:
                lines.extend(f"    {line}" for line in crash.traceback.rstrip().splitlines())
        if crashes and not verbose:
            lines.append(f"  (`python -m course check {self.exercise} --verbose` shows the whole traceback)")
        return lines

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:  # a notebook cell ending in check(...) shows the summary
        return self.text()


def _some(names, shown: int = 4) -> str:
    """The first few names, then '...': a summary line stays one line."""
    names = list(names)
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


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
    """Run each case, turning exceptions into failed cases (a stub stops everything); the messages
    speak of the language the exercise is written in (`course.exercises.Exercise.language`)."""
    with speaking_of(_language(exercise)):
        return _run_cases(exercise, cases)


def _language(exercise: str) -> str:
    from ..exercises import EXERCISES  # the table imports the checks: look it up when it is there

    known = EXERCISES.get(exercise)
    return known.language if known is not None else "numba"


def _run_cases(exercise: str, cases: Iterable[tuple[str, CaseRunner]]) -> Report:
    report = Report(exercise)
    for name, run in cases:
        try:
            result = run()
        except ExerciseNotImplemented as stub:
            report.not_implemented = str(stub)
            return report
        except Exception as error:  # a crash in one case must not hide the others
            crash = describe(error)
            where = f" at {crash.place}" if crash.place else ""
            result = CaseResult(name, False, f"raised {crash.kind}{where}: {crash.message}", crash)
        report.results.append(result if result is not None else CaseResult(name, True))
    return report


def check(exercise: str, *, impl: str | None = None, seed: int = PUBLIC_SEED, full: bool = False,
          quiet: bool = False, raise_on_failure: bool = True, verbose: bool = False) -> Report:
    """Check one exercise (e.g. "trees.dfs_times") against pyspec_ref; see `course.exercises`.

    The default list of cases is quick in the simulator; `full` runs every case, as grading does.
    `verbose` shows the whole traceback of a kernel or launcher that raised. A pass on your lessons/
    is recorded, so that the notebook's "Compare with ours" cell shows the reference (`course.answers`),
    and carried into the next ladder rung's lesson while that is still as released
    (`course.topics.ladder.carry`); a check that runs two exercises' code on the same cases records both.
    """
    from ..core.impl import impl_name
    from ..exercises import get

    report = get(exercise).run(impl=impl, seed=seed, full=full)
    carried = []
    if report.passed and (impl or impl_name()) == "lessons":
        from ..answers import record_pass
        from ..topics.ladder.carry import carry_after_pass

        record_pass(exercise)
        carried = carry_after_pass(get(exercise).module)  # the next rung, if still as released
    if not quiet:
        print("\n".join([report.text(verbose), *carried]))
    if raise_on_failure and not report.passed:
        raise CheckFailed(report.text(verbose))
    return report
