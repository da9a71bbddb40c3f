"""Grading one submission: its child processes, their limits, and what their ends mean."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course.core import runtime

from ..release import ROOT
from .collect import Submission, SubmissionError, prepare

STARTUP_S = 180.0  # importing torch, numba and the harness in a fresh child
MAX_LINE_BYTES = 64 * 2**20  # a result line longer than this is not one
TAIL_BYTES = 2000


@dataclass(frozen=True)
class Limits:
    per_exercise_s: float = 600.0
    total_s: float = 3600.0
    memory_mb: int = 8192  # address space; applied in the simulator only (CUDA maps far more)
    output_mb: int = 16  # stdout + stderr + any file the child writes


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

    @property
    def fraction(self) -> float:
        if self.violation or self.not_implemented or not self.results:
            return 0.0
        return sum(passed for _, passed, _ in self.results) / len(self.results)

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

    @property
    def total(self) -> float:
        return round(sum(g.points for g in self.exercises.values()), 2)

    @property
    def possible(self) -> float:
        return sum(g.points_possible for g in self.exercises.values())

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)


def digest(folder: Path) -> str:
    """sha256 over every file's path and bytes under folder (the harness copy a child imports)."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def listing(folder: Path, skip: list[Path]) -> dict[str, tuple[int, int]]:
    """path -> (mtime_ns, size) of every file under folder, skipping `skip` folders and caches."""
    skip = [s.resolve() for s in skip]
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath).resolve()
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", ".git") and (here / d) not in skip]
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            found[os.path.join(dirpath, name)] = (st.st_mtime_ns, st.st_size)
    return found


def _tail(path: Path) -> str:
    """The end of a child's stderr; for a fatal signal, faulthandler's traceback without its module list."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64 * TAIL_BYTES))
        text = f.read().decode(errors="replace")
    fatal = text.rfind("Fatal Python error")
    if fatal >= 0:
        text = text[fatal:].split("\nExtension modules:")[0]
        return text[:TAIL_BYTES]
    return ("..." if len(text) > TAIL_BYTES else "") + text[-TAIL_BYTES:]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: threads and children it started
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class _Child:
    """One worker process over the exercises still to grade."""

    def __init__(self, sub: Path, harness: Path, exercises: list[str], seed: int, limits: Limits, logs: Path,
                 time_kernels: bool = False):
        self.out, self.err = logs.with_suffix(".out"), logs.with_suffix(".err")
        read, write = os.pipe()
        self.pipe = read
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSTARTUP", "PYTHONHOME", "COURSE_IMPL")}
        # The harness first (it shadows any course/, pyspec_ref/ a submission carries), then the
        # grader's own PYTHONPATH (where its packages may live: a GPU machine's carried numpy).
        own = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
        env.update(PYTHONPATH=os.pathsep.join([str(harness), *own]),
                   COURSE_SIM="1" if runtime.SIMULATOR else "0",
                   PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1", HOME=str(sub / "home"),
                   TMPDIR=str(sub / "tmp"), TRITON_CACHE_DIR=str(sub / "tmp" / "triton"),
                   NUMBA_CACHE_DIR=str(sub / "tmp" / "numba"), MPLCONFIGDIR=str(sub / "tmp" / "mpl"))
        command = [sys.executable, "-m", "course.grading.worker", "--exercises", ",".join(exercises),
                   "--seed", str(seed), "--result-fd", str(write), "--memory-mb", str(limits.memory_mb),
                   "--output-mb", str(limits.output_mb)] + (["--time"] if time_kernels else [])
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(command, cwd=sub, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=err, pass_fds=(write,), start_new_session=True)
        os.close(write)

    def messages(self, deadline_for):
        """Decoded messages until the pipe closes; ('timeout', None) once the deadline has passed."""
        buffer = b""
        try:
            while True:
                left = deadline_for() - time.monotonic()
                if left <= 0:
                    yield "timeout", None
                    return
                ready, _, _ = select.select([self.pipe], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(self.pipe, 1 << 16)
                if not chunk:
                    return
                buffer += chunk
                if len(buffer) > MAX_LINE_BYTES:
                    yield "garbled", None
                    return
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    try:
                        message = json.loads(line)
                    except ValueError:
                        yield "garbled", None
                        return
                    yield "message", message
        finally:
            os.close(self.pipe)


def _grade_from(message: dict, possible: float) -> ExerciseGrade:
    return ExerciseGrade(message["exercise"], possible,
                         [(str(c), bool(p), str(d)) for c, p, d in message.get("results", [])],
                         str(message.get("not_implemented", "")), str(message.get("note", "")),
                         str(message.get("violation", "")), message.get("seconds"),
                         message.get("student_ms"), str(message.get("timing_note", "")))


def grade_submission(submission: Submission, exercises: list, seed: int, limits: Limits,
                     workroot: Path, watch: list[Path] = (), keep: bool = False,
                     time_kernels: bool = False) -> SubmissionGrade:
    """Grade one submission in child processes; `exercises` are course.exercises.Exercise rows.
    time_kernels: on a GPU, also time each passed exercise's kernel (course.grading.speed)."""
    possible = {e.id: float(e.points) for e in exercises}
    grade = SubmissionGrade(submission.student, str(submission.source),
                            {e.id: ExerciseGrade(e.id, possible[e.id]) for e in exercises})
    workdir = Path(tempfile.mkdtemp(prefix=f"{submission.student}-", dir=workroot))
    try:
        try:
            sub, notes = prepare(submission, workdir)
        except (SubmissionError, OSError) as error:
            grade.notes.append(f"could not use the submission: {error}")
            grade.flag("unusable")
            for g in grade.exercises.values():
                g.note = "not graded: the submission could not be used"
            return grade
        grade.notes.extend(notes)
        harness = workdir / "harness"
        for package in ("course", "pyspec_ref"):
            shutil.copytree(ROOT / package, harness / package, ignore=shutil.ignore_patterns("__pycache__"))
        harness_digest = digest(harness)
        logs = workdir / "logs"
        logs.mkdir()
        skip = [sub, harness, logs, workroot]
        watched = [Path(w) for w in watch] + [workdir]
        before = {str(w): listing(w, skip if w != workdir else [sub, harness, logs]) for w in watched}
        _run_children(grade, sub, harness, [e.id for e in exercises], seed, limits, logs, time_kernels)
        if digest(harness) != harness_digest:
            grade.notes.append("changed the grader's own files (course/ or pyspec_ref/) while it ran: "
                               "every exercise scores zero")
            grade.flag("changed the harness")
            for g in grade.exercises.values():
                g.violation = g.violation or "changed the harness"
        for w in watched:
            after = listing(w, skip if w != workdir else [sub, harness, logs])
            old = before[str(w)]
            touched = sorted(p for p in set(old) | set(after) if old.get(p) != after.get(p))
            if touched:
                shown = ", ".join(touched[:5]) + (" ..." if len(touched) > 5 else "")
                grade.notes.append(f"files outside its folder changed while it ran: {shown}")
                grade.flag("wrote outside its folder")
        return grade
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _run_children(grade: SubmissionGrade, sub: Path, harness: Path, remaining: list[str], seed: int,
                  limits: Limits, logs: Path, time_kernels: bool = False) -> None:
    total_deadline = time.monotonic() + limits.total_s
    runs = 0
    while remaining:
        if time.monotonic() >= total_deadline:
            for exercise in remaining:
                grade.exercises[exercise].note = (f"not run: the total time limit ({limits.total_s:g} s) "
                                                  "ran out")
            grade.flag("timed out")
            return
        runs += 1
        child = _Child(sub, harness, remaining, seed, limits, logs / f"run{runs}", time_kernels)
        current, deadline = None, [min(total_deadline, time.monotonic() + STARTUP_S)]
        ended, progressed = "", False
        for kind, message in child.messages(lambda: deadline[0]):  # noqa: B023  (read live)
            if kind != "message":
                ended = kind
                break
            event = message.get("event")
            if event == "start" and message.get("exercise") in remaining:
                current = message["exercise"]
                deadline[0] = min(total_deadline, time.monotonic() + limits.per_exercise_s)
            elif event == "result" and message.get("exercise") in remaining:
                exercise = message["exercise"]
                grade.exercises[exercise] = _grade_from(message, grade.exercises[exercise].points_possible)
                if message.get("violation"):
                    grade.flag(message["violation"])
                remaining.remove(exercise)
                progressed, current = True, None
                deadline[0] = min(total_deadline, time.monotonic() + limits.per_exercise_s)
        timed_out = ended == "timeout"
        if child.proc.poll() is None:
            if not timed_out and ended != "garbled":
                try:  # the pipe closed: give the process a moment to exit by itself
                    child.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            _kill(child.proc)
        code = child.proc.returncode
        if current is None and not progressed:
            # it died before starting an exercise: the next run would too
            why = _ending(code, timed_out, ended, limits, total_deadline, "while starting")
            for exercise in remaining:
                grade.exercises[exercise].note = f"not graded: the grading process {why}"
                if child.err.exists():
                    grade.exercises[exercise].note += f"\n\nstderr (end):\n{_tail(child.err)}"
            grade.flag("crashed")
            return
        if current is not None:
            why = _ending(code, timed_out, ended, limits, total_deadline, f"while {current} was checked")
            g = grade.exercises[current]
            g.note, g.violation = f"{why}; scored zero", _flag_of(code, timed_out, ended)
            stderr = _tail(child.err).strip()
            if stderr:
                g.note += f"\n\nstderr (end):\n{stderr}"
            grade.flag(_flag_of(code, timed_out, ended))
            remaining.remove(current)


def _flag_of(code, timed_out, ended) -> str:
    if timed_out:
        return "timed out"
    if ended == "garbled":
        return "garbled the results"
    if code is not None and code == -signal.SIGXFSZ:
        return "too much output"
    if code is not None and code < 0:
        return "crashed"
    return "exited"


def _ending(code, timed_out, ended, limits: Limits, total_deadline: float, when: str) -> str:
    if timed_out:
        which = ("the total time limit" if time.monotonic() >= total_deadline - 0.5
                 else f"the time limit of {limits.per_exercise_s:g} s per exercise")
        return f"hung: it ran past {which} {when} (killed)"
    if ended == "garbled":
        return f"garbled the grader's result channel {when} (killed)"
    if code is not None and code == -signal.SIGXFSZ:
        return f"printed too much: over the {limits.output_mb} MB output limit {when} (killed)"
    if code is not None and code < 0:
        return f"crashed the interpreter: {_signal_name(code)} {when}"
    return f"ended the process: exit code {code} {when}"
