"""Checks: compare a student's (or the solution's) kernel with `pyspec_ref`, and report.

An `Exercise` names the cases its check runs (each topic declares its own in
`course/topics/<topic>/exercises.py`; `course.registry` holds them all). A check runs the
exercise on a fixed list of edge cases and on fresh random cases drawn from a seed (a public one
in the notebooks, a private one when grading), each case from its own keyed hash of that seed and
its name (`course.core.inputs.case_seed`), and gives a `Report`: one line per failing case
saying where and how the output differs. `course.check(exercise)` prints it and raises
`CheckFailed` if anything failed, so that a notebook run stops at a wrong kernel.

This room reports and nothing more: it knows no table of exercises and no answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..core import impl as implementations
from ..core.crash import Crash, describe
from ..core.runtime import SIMULATOR
from ..core.stubs import ExerciseNotImplemented
from . import barriers
from .diagnose import speaking_of

PUBLIC_SEED = 0
# The lesson modules not written in Numba CUDA: notebook 02 is plain PyTorch, notebooks 12 onward
# Triton. A check's messages speak of the terms of the language its exercise is written in.
LANGUAGES = {"attention": "torch"} | {module: "triton" for module in (
    "triton_attention", "deft", "spec_sampling", "tree_verification", "emssd", "swiftspec", "tree_shape")}


def language_of(exercise: str) -> str:
    """What the exercise (an id, "<module>.<function>") is written in: "numba", "triton" or "torch"."""
    return LANGUAGES.get(exercise.split(".")[0], "numba")


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
    speak of the language the exercise is written in (`language_of`)."""
    with speaking_of(language_of(exercise)):
        return _run_cases(exercise, cases)


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


@dataclass(frozen=True)
class Exercise:
    """One exercise as its topic declares it (`course/topics/<topic>/exercises.py`)."""

    id: str  # "<module>.<function>", the name lesson stubs print; gradebooks use it
    notebook: str  # e.g. "01_token_trees"
    points: int  # for grading
    cases: Callable  # cases(module, seed) -> iterable of (name, run)
    summary: str
    requires: tuple[str, ...] = ()  # exercises whose code this one's launcher also runs
    # Grading on a GPU times the kernel for the student and the solution, as the topic's bench
    # builds it (`grading_kernels` of course/topics/<topic>/bench.py; course.grading.speed).
    timed: bool = False
    # The default list: the beginnings of the names of the cases a check runs unless asked for the
    # full list (`--full`), chosen to finish in under 30 s on one core in the simulator; () runs every
    # case. Grading always runs the full list.
    default_cases: tuple[str, ...] = ()
    topic: str = ""  # the topic room that declares it (set by course.registry)

    @property
    def module(self) -> str:
        return self.id.split(".")[0]

    @property
    def language(self) -> str:
        """What the exercise is written in: its check's messages speak of that language's terms."""
        return language_of(self.id)

    def selected_cases(self, module, seed: int, full: bool = False):
        """(name, run) of the cases to run on `module`: the default list, or every case if `full` or on a
        GPU (the default lists spare the simulator's time; a GPU runs its own sizes, under other names)."""
        cases = self.cases(module, seed)
        if full or not self.default_cases or not SIMULATOR:
            return cases
        return ((name, run) for name, run in cases if name.startswith(self.default_cases))

    def run(self, impl: str | None = None, seed: int = PUBLIC_SEED, full: bool = False) -> Report:
        """The report of this exercise's check on `impl`'s module ("lessons" or "solutions")."""
        module = implementations.load(self.module, impl)
        report = run_cases(self.id, self.selected_cases(module, seed, full))
        report.default_list = bool(self.default_cases) and not full and SIMULATOR
        if report.results and not report.not_implemented:
            # The CPU cannot show a missing barrier's race: the source must still hold the solution's.
            problems = barriers.kernel_problems(self.id, module)
            if problems:
                report.results.append(CaseResult("barriers", False, "\n".join(problems)))
            if SIMULATOR and barriers.is_triton(self.id, module):
                report.note = barriers.race_note(self.id)
        return report
