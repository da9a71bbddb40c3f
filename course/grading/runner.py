"""Grading one submission: its graded modules, its sandboxed child, and what the child's ends mean.

`Setup` holds what a grading run shares (built once, in the main thread): the grader's own
solution modules (the checks' constants and helpers come from them), which names of each module
run an exercise's code (`course.grading.proxy.remote_names`), the harness copy and the sandbox
plan. `prepare_submission` (main thread too) finds a submission's lessons and splices its holes
into the grader's lessons (`course.grading.splice`). `grade_submission` then runs every
exercise's checks here, in the grader's process, on a `ProxyModule` whose kernels run in the
submission's child; a child that dies, hangs or passes a limit costs the exercise it was on, and
the next exercise gets a fresh child.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import types
import unicodedata
import urllib.parse
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from course.core import inputs, runtime

from ..core.regions import ROOT
from ..release import files_of, lesson_holes, render_pieces
from . import proxy, sandbox, seeded, shapes, speed, splice, wire
from .collect import Submission, SubmissionError, prepare

TAIL_BYTES = 2000
NONE: frozenset[str] = frozenset()
DETAIL_CHARS = 600


@dataclass(frozen=True)
class Limits:
    per_exercise_s: float = 600.0  # the submission's own CPU time, all its processes together (Clock)
    total_s: float = 3600.0  # the same, over all its exercises
    memory_mb: int = 8192  # all the submission's processes together (see course.grading.sandbox)
    output_mb: int = 16  # stdout + stderr + every file it writes, together
    processes: int = 4096  # processes and threads together (the simulator runs a thread per GPU thread)
    reply_mb: int = 1024  # the largest reply the grader reads
    cache_mb: int = 256  # Triton's and Numba's caches in the sandbox (compiled kernels)


@dataclass
class ExerciseGrade:
    exercise: str
    points_possible: float
    results: list[tuple[str, bool, str]] = field(default_factory=list)
    not_implemented: str = ""
    note: str = ""
    violation: str = ""  # set when the exercise is zeroed for hostile behaviour
    seconds: float | None = None
    student_ms: float | None = None  # the kernel's median time on a GPU (course.grading.speed)
    timing_note: str = ""  # why a passed exercise has no time
    seeded: frozenset[str] = frozenset()  # the cases drawn from the seed (course.grading.seeded)

    @property
    def fraction(self) -> float:
        """The share of the points earned: seeded cases weigh SEEDED_SHARE together, fixed ones the rest."""
        if self.violation or self.not_implemented or not self.results:
            return 0.0
        shares = seeded.weights([case for case, _, _ in self.results], set(self.seeded))
        earned = sum(share for share, (_, passed, _) in zip(shares, self.results, strict=True) if passed)
        return min(1.0, earned)

    @property
    def points(self) -> float:
        return round(self.fraction * self.points_possible, 2)

    @property
    def failures(self) -> list[tuple[str, bool, str]]:
        return [r for r in self.results if not r[1]]


@dataclass
class SubmissionGrade:
    student: str
    source: str
    exercises: dict[str, ExerciseGrade]
    notes: list[str] = field(default_factory=list)  # about the submission as a whole
    flags: list[str] = field(default_factory=list)  # short names of hostile behaviour, for the gradebook
    isolated: bool = True  # False: graded without the sandbox (--no-sandbox)

    @property
    def total(self) -> float:
        return round(sum(g.points for g in self.exercises.values()), 2)

    @property
    def possible(self) -> float:
        return sum(g.points_possible for g in self.exercises.values())

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)


# ------------------------------------------------------------------------------------ the run

@dataclass
class Setup:
    """What every submission of one grading run shares."""

    exercises: list
    trusted: dict[str, types.ModuleType]  # module -> the grader's own stub of it (_stub_modules)
    contexts: dict[str, splice.Context]
    remote: dict[str, set[str]]
    kernels: dict[str, set[str]]
    workroot: Path
    limits: Limits
    plan: sandbox.Plan
    isolate: bool
    modules: set[str]  # the modules the chosen exercises run (the others stay stubs)
    rendered: dict  # the release's lessons tree (course.release.render_pieces)
    limits_by: str  # how memory and processes are limited (sandbox.Cgroup.probe)
    seeded: dict[str, frozenset[str]] = field(default_factory=dict)  # exercise -> its seeded cases
    dry: dict[str, types.ModuleType] = field(default_factory=dict)  # the launchers' dry runs (shapes)

    def find_seeded(self, seed: int) -> None:
        """Which cases of each exercise draw their inputs from the seed (course.grading.seeded)."""
        for exercise in self.exercises:
            try:
                found = seeded.seeded_cases(exercise, self, case_seed(seed, exercise.id))
            except Exception as error:  # noqa: BLE001  (its cases then weigh the same; grading goes on)
                warnings.warn(f"{exercise.id}: could not tell its seeded cases ({type(error).__name__}: "
                              f"{error}); they weigh the same as its fixed ones", stacklevel=2)
                found = set()
            self.seeded[exercise.id] = frozenset(found)

    def describe(self) -> dict:
        """What grades.json says about the sandbox."""
        return {"isolated": self.isolate, "limits": self.limits_by if self.isolate else "per process only",
                "bubblewrap": sandbox.bwrap() if self.isolate else None}

    @classmethod
    def build(cls, exercises: list, workroot: Path, limits: Limits, isolate: bool,
              hidden: list[Path]) -> Setup:
        solutions = ROOT / "solutions"
        sources = proxy.solution_sources(solutions)
        holes = {m: [(h.first + 1, h.last + 1) for h in lesson_holes(m, sources)] for m in sources}
        modules = {e.module for e in exercises} | {r.split(".")[0] for e in exercises for r in e.requires}
        rendered = render_pieces(solutions)
        trusted = _stub_modules(rendered, workroot / "stubs", modules)
        kernels = {m: proxy.kernel_names(s) for m, s in sources.items()}
        dry = _stub_modules(rendered, workroot / "shapes", modules, shapes.SHAPES)
        shapes.dry_modules(dry, kernels)
        harness = workroot / "harness"
        sandbox.copy_harness(harness)
        plan = sandbox.make_plan(harness, hidden, runtime.on_gpu(), runtime.SIMULATOR, runtime.SMALL_SIZES)
        return cls(exercises, trusted, {m: splice.context_of(m, t) for m, t in trusted.items()},
                   proxy.remote_names(sources, holes), kernels, workroot, limits, plan, isolate, modules,
                   rendered, sandbox.Cgroup.probe() if isolate else "", dry=dry)


STUBS = "course_grading_stubs"


def _stub_modules(rendered: dict, folder: Path, modules: set[str],
                  package: str = STUBS) -> dict[str, types.ModuleType]:
    """The lesson modules as the release writes them, imported as the package STUBS: what the checks'
    constants, classes and helpers come from. Stubs, not the solutions: should a kernel ever run in
    the grader by mistake, it stops at its todo(...) rather than hand out the answer; and not the
    repository's lessons/, which may hold the instructor's own answers."""
    for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
        del sys.modules[name]  # an earlier grading run's, from a folder since removed
    for relative, content in files_of(rendered).items():
        path = folder / package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    sys.path.insert(0, str(folder))
    try:
        importlib.invalidate_caches()
        return {m: importlib.import_module(f"{package}.{m}") for m in sorted(modules)}
    finally:
        sys.path.remove(str(folder))


@dataclass
class Prepared:
    """One submission, ready to grade: its graded lessons written under `code`."""

    submission: Submission
    workdir: Path
    code: Path | None
    spliced: splice.Spliced | None
    notes: list[str]


def prepare_submission(submission: Submission, setup: Setup) -> Prepared:
    """Find the submission's lessons and write its graded modules (call it in the main thread).
    Whatever goes wrong here is this submission's note, never the run's end."""
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=setup.workroot))
    notes = [submission.note] if submission.note else []
    try:
        return _prepare(submission, setup, workdir, notes)
    except (SubmissionError, OSError) as error:
        why = str(error)
    except (RecursionError, MemoryError):
        why = "it is nested too deeply to read"
    except Exception as error:  # noqa: BLE001  (one submission must not stop the class)
        why = f"{type(error).__name__}: {error}"
    note = f"could not use the submission: {clean_text(why)[:300]}"
    return Prepared(submission, workdir, None, None, [*notes, note])


def _prepare(submission: Submission, setup: Setup, workdir: Path, notes: list[str]) -> Prepared:
    lessons, found = prepare(submission, workdir)
    notes = [*notes, *found]
    contexts = {m: c for m, c in setup.contexts.items() if m in setup.modules}
    spliced = splice.splice(lessons, setup.rendered, contexts)
    notes += [m.ignored for m in spliced.modules.values() if m.ignored and m.module in setup.modules]
    code = workdir / "code"
    for relative, content in spliced.files.items():
        path = code / "lessons" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    sandbox.readable(code)
    return Prepared(submission, workdir, code, spliced, notes)


def grade_submission(prepared: Prepared, setup: Setup, seed: int,
                     time_kernels: bool = False) -> SubmissionGrade:
    """Grade one prepared submission: every chosen exercise's checks against its child."""
    exercises, limits = setup.exercises, setup.limits
    submission = prepared.submission
    grade = SubmissionGrade(submission.student, str(submission.source),
                            {e.id: ExerciseGrade(e.id, float(e.points), seeded=setup.seeded.get(e.id, NONE))
                             for e in exercises},
                            list(prepared.notes), isolated=setup.isolate)
    try:
        if prepared.code is None:
            grade.flag("unusable")
            for g in grade.exercises.values():
                g.note = "not graded: the submission could not be used"
            return grade
        channel = _channel(prepared, setup)
        clock = Clock(limits)
        try:
            for exercise in exercises:
                _grade_exercise(grade, exercise, prepared, setup, channel, seed, clock, time_kernels)
        finally:
            channel.stop()
        return grade
    except Exception as error:  # noqa: BLE001  (one submission must not stop the class)
        grade.notes.append(clean_text(f"grading stopped on this submission: {type(error).__name__}: "
                                      f"{error}")[:DETAIL_CHARS])
        grade.flag("grading error")
        return grade
    finally:
        shutil.rmtree(prepared.workdir, ignore_errors=True)


def _channel(prepared: Prepared, setup: Setup) -> proxy.Channel:
    limits = setup.limits
    settings = sandbox.Settings(limits.memory_mb << 20, limits.output_mb << 20, limits.processes,
                                setup.isolate, runtime.SIMULATOR, limits.cache_mb << 20)
    logs = prepared.workdir / "logs"
    logs.mkdir(exist_ok=True)
    work = prepared.workdir / "work"
    work.mkdir(exist_ok=True)
    runs = [0]

    def spawn() -> sandbox.Child:
        runs[0] += 1
        pair = (logs / f"run{runs[0]}.out", logs / f"run{runs[0]}.err")
        name = f"course-grade-{os.getpid()}-{prepared.workdir.name}-{runs[0]}"
        return sandbox.start(setup.plan, prepared.code, settings, pair, name, work)

    devices = {"cpu"} | ({"cuda"} if runtime.on_gpu() else set())
    channel = proxy.Channel(spawn, wire.WireLimits(blob_bytes=limits.reply_mb << 20),
                            lambda device: device in devices,
                            lambda text: _student_lines(clean_text(text), prepared.spliced))
    return channel


def _student_lines(text: str, spliced: splice.Spliced) -> str:
    """'lessons/trees.py:65' in a child's text, with the line the student's own file has there (a
    line of their code: the graded module's numbers differ where they changed lines outside holes)."""
    def student(match: re.Match) -> str:
        module = spliced.modules.get(match.group(1))
        line = module.line_map.get(int(match.group(2))) if module is not None else None
        return f"lessons/{match.group(1)}.py:{line or match.group(2)}"

    return re.sub(r"lessons/(\w+)\.py:(\d+)", student, text)


# A child that waits without computing (a sleep, a blocking read) uses no CPU time: it is stopped
# once the wall-clock time passes this many times its CPU time limit.
WALL_FACTOR = 4


@dataclass
class Clock:
    """A submission's time limits, in its own CPU time (course.grading.sandbox.Child.cpu_seconds):
    per exercise, and in all; so a classmate graded beside it, or the grader's own checks, cost it
    nothing. Wall-clock time is only the backstop (WALL_FACTOR) for a child that waits."""

    limits: Limits
    cpu_used: float = 0.0  # by the exercises graded so far
    wall_start: float = field(default_factory=time.monotonic)

    def exercise_budget(self) -> float:
        """CPU seconds the next exercise may use (0: the total ran out)."""
        return max(0.0, min(self.limits.per_exercise_s, self.limits.total_s - self.cpu_used))

    def wall_deadline(self, budget: float, now: float) -> float:
        total = self.wall_start + WALL_FACTOR * self.limits.total_s
        return min(total, now + WALL_FACTOR * budget)

    def count(self, cpu_seconds: float) -> None:
        self.cpu_used += cpu_seconds

    def total_ran_out(self) -> bool:
        wall_end = self.wall_start + WALL_FACTOR * self.limits.total_s
        return self.exercise_budget() <= 0 or time.monotonic() >= wall_end


def _grade_exercise(grade: SubmissionGrade, exercise, prepared: Prepared, setup: Setup,
                    channel: proxy.Channel, seed: int, clock: Clock, time_kernels: bool) -> None:
    from course.checks import run_cases

    g = grade.exercises[exercise.id]
    if clock.total_ran_out():
        g.note = f"not run: the total time limit ({setup.limits.total_s:g} s of CPU time) ran out"
        grade.flag("timed out")
        return
    wanted = (exercise.id, *exercise.requires)
    problems = prepared.spliced.problems(wanted)
    if problems:
        tampering = [p for p in problems if p.tampering]
        g.note = "; ".join(p.note for p in problems)
        if tampering:
            g.violation = "tampering"
            grade.flag("tampering")
        return
    started = time.monotonic()
    budget = clock.exercise_budget()
    channel.start_exercise(budget, clock.wall_deadline(budget, started))
    name = exercise.module
    module = proxy.ProxyModule(name, setup.trusted[name], setup.remote[name], setup.kernels[name],
                               prepared.spliced.modules[name].stubs, channel, setup.trusted,
                               setup.dry.get(name))
    try:
        cases = exercise.selected_cases(module, case_seed(seed, exercise.id), full=True)
        report = run_cases(exercise.id, cases)
        g.results = [(r.case, bool(r.passed), r.detail) for r in report.results]
        g.not_implemented = report.not_implemented
        _after_exercise(channel)
        hook = speed.hook_of(exercise)
        if time_kernels and report.passed and hook is not None:
            clock.count(channel.exercise_cpu())
            budget = clock.exercise_budget()
            channel.start_exercise(budget, clock.wall_deadline(budget, time.monotonic()))
            g.student_ms, g.timing_note = channel.time(hook.spec)
    except proxy.ChildGone as gone:
        if gone.why == "timeout":  # stopped at its budget: it used all of it
            channel.cpu_spent = max(channel.cpu_spent, channel.cpu_budget)
        _gone(grade, g, gone, channel, setup.limits, clock)
    except proxy.ModuleBroken as broken:
        g.note = f"importing lessons/{exercise.module}.py failed: {broken.message}"
        channel.stop()
    except proxy.ReplyError as error:
        g.note = str(error)
    except Exception as error:  # noqa: BLE001  (a check that broke must not stop the run)
        g.note = clean_text(f"the check stopped with {type(error).__name__}: {error}")[:DETAIL_CHARS]
    clock.count(channel.exercise_cpu())
    channel.start_exercise(0.0, float("inf"))  # nothing more counts against this exercise
    g.seconds = round(time.monotonic() - started, 3)


def case_seed(seed: int, exercise: str) -> int:
    """The seed an exercise's check is run with, the first of two keyed hashes: HMAC-SHA256 keyed by
    the private seed over the exercise's id, 56 bits (`course.core.inputs.case_seed`). The second is
    the check's own: each case draws its inputs from `inputs.case_seed(this seed, the case's name)`,
    and no case's name or message shows a seed. So what a student learns of one case's inputs gives
    away neither another case's inputs, nor this seed, nor the private seed and another exercise's."""
    return inputs.case_seed(seed, exercise)


def _after_exercise(channel: proxy.Channel) -> None:
    """The output limit, added up once more after the exercise (a write at its very end counts)."""
    child = channel.child
    if child is not None and not child.closed:
        child.tick()
        if child.over:
            raise proxy.ChildGone(child.over)


GONE_FLAGS = {"timeout": "timed out", "waited": "timed out", "memory": "out of memory",
              "output": "too much output", "garbled": "garbled the results"}


def _gone(grade: SubmissionGrade, g: ExerciseGrade, gone: proxy.ChildGone, channel: proxy.Channel,
          limits: Limits, clock: Clock) -> None:
    child = channel.child
    channel.stop()
    code = child.returncode if child is not None else None
    why = gone.why
    if why == "ended" and code == -signal.SIGXFSZ:
        why = "output"
    when = f"while {g.exercise} was checked"
    if why in ("timeout", "waited"):
        text = f"hung: it ran past {_time_limit_text(why, channel.cpu_budget, limits)} {when} (killed)"
    elif why == "memory":
        text = (f"used more than the memory limit ({limits.memory_mb} MB, all its processes together) {when} "
                "(killed)")
    elif why == "output":
        text = (f"printed or wrote too much: over the {limits.output_mb} MB output limit (printing and files "
                f"together) {when} (killed)")
    elif why == "garbled":
        text = f"garbled the grader's channel {when} (killed): {clean_text(gone.detail)[:200]}"
    elif code is not None and code < 0:
        text = f"crashed the interpreter: {_signal_name(code)} {when}"
    else:
        text = f"ended the process: exit code {code} {when}"
    flag = GONE_FLAGS.get(why, "crashed" if code is not None and code < 0 else "exited")
    g.note, g.violation = f"{text}; scored zero", flag
    g.results = []
    if child is not None and why not in ("timeout", "waited", "output"):
        stderr = _tail(child.logs[1]).strip()
        if stderr:
            g.note += f"\n\nstderr (end):\n{stderr}"
    grade.flag(flag)


def _time_limit_text(why: str, budget: float, limits: Limits) -> str:
    """Which time limit a child passed: its CPU time ("timeout"), or the wall-clock backstop ("waited")."""
    which = (f"the time limit of {limits.per_exercise_s:g} s per exercise" if budget >= limits.per_exercise_s
             else f"the total time limit ({limits.total_s:g} s)")
    if why == "timeout":
        return f"{which} (CPU time, all its processes together)"
    return (f"{which}, waiting: {WALL_FACTOR} times that in wall-clock time passed while it used little CPU "
            "time")


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(path: Path) -> str:
    """The end of a child's stderr; for a fatal signal, faulthandler's traceback without its module list."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    fatal = text.rfind("Fatal Python error")
    if fatal >= 0:
        text = text[fatal:].split("\nExtension modules:")[0]
        return clean_text(text)[:TAIL_BYTES]
    return clean_text(("..." if len(text) > TAIL_BYTES else "") + text[-TAIL_BYTES:])


# A path in what a child wrote: the submission's own lessons keep their name, anything else of the
# grader's or the system's is cut to its last part.
_PATH = re.compile(r"(?<![\w.~])/(?:[^\s'\"`:,;()\[\]{}<>|]+/)*[^\s'\"`:,;()\[\]{}<>|]*")
_OWN = ((f"{sandbox.INSIDE}/code/lessons/", "lessons/"), (f"{sandbox.INSIDE}/harness/", ""),
        (f"{sandbox.INSIDE}/work", "~"))


def clean_text(text: str) -> str:
    """A child's text for the feedback: the submission's files by their lessons/ names, every other
    path (the grader's folders, its Python, its temporary folders) cut to its last part. The text
    is decoded first (%2F, \\x2f, \\u002f, full-width and other look-alike slashes), so that no
    spelling of a path gets past the cut."""
    def shorten(match: re.Match) -> str:
        path = match.group(0)
        for prefix, shown in _OWN:
            if path.startswith(prefix):
                return shown + path[len(prefix):]
        return ".../" + path.rstrip("/").rsplit("/", 1)[-1] if path.count("/") > 1 else path

    return _PATH.sub(shorten, _decoded(str(text).replace("\x00", "")))


_ENCODED_SLASH = re.compile(r"(?i)%2f|%5c|\\x2f|\\u002f|\\U0000002f|\\057|&#0*47;|&#x0*2f;|&sol;")


def _decoded(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)  # full-width and other compatibility slashes: "/"
    text = text.replace("\u2215", "/").replace("\u2044", "/").replace("\u29f8", "/")
    for _ in range(3):  # percent-encoding of a percent-encoding
        decoded = _ENCODED_SLASH.sub("/", urllib.parse.unquote(text, errors="replace"))
        if decoded == text:
            break
        text = decoded
    return text
