"""The barrier check: a solution's barrier missing from a student's kernel fails the check, at the
student's line, although the simulator and the interpreter cannot show the race."""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys

import pytest

import course  # noqa: F401  (the simulator before numba)
from course import checks, registry
from course.__main__ import main
from course.checks import barriers
from course.core.regions import ROOT
from course.core.source import function_in_file

BARRIER_LINE = re.compile(r"^\s*(tl\.debug_barrier|cuda\.syncthreads)\(\)\s*(#.*)?$")


def kernel_text(exercise: str) -> tuple[str, int]:
    """The solution kernel's source and its first line in solutions/<module>.py."""
    module, function = exercise.split(".", 1)
    text = (ROOT / "solutions" / f"{module}.py").read_text()
    source = function_in_file(text, function)
    first = text.splitlines().index(source.splitlines()[0]) + 1
    return source, first


def test_the_record_is_what_the_solutions_hold():
    assert barriers.DATA.read_text() == barriers.rendered(ROOT / "solutions", registry.EXERCISES)
    assert "swiftspec.compact_kernel" in barriers.read()
    assert "ladder_k11.tree_attention_kernel" in barriers.read()


@pytest.mark.parametrize("exercise", sorted(barriers.read()))
def test_removing_any_one_barrier_of_a_solution_is_caught(exercise):
    source, first = kernel_text(exercise)
    expected = barriers.read()[exercise]
    assert barriers.missing(expected, source, first, "x.py") == []
    lines = source.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if BARRIER_LINE.match(line)]
    assert found
    for index in found:
        assert barriers.missing(expected, "".join(lines[:index] + lines[index + 1:]), first, "x.py"), (
            f"{exercise}: removing line {first + index} went unnoticed")


def test_accesses_reordered_between_barriers_still_pass():
    source = '''
@cuda.jit
def kernel(x, out):
    tile = cuda.shared.array(4, dtype=np.float32)
    i = cuda.threadIdx.x
    a = x[i]
    tile[i] = a
    cuda.syncthreads()
    out[i] = tile[3 - i]
'''
    expected = barriers.placements(barriers.events(source))
    assert expected == [("store tile", "load tile")]
    reordered = source.replace("    i = cuda.threadIdx.x\n", "    i = cuda.threadIdx.x\n    b = x[0]\n")
    later = "    c = x[1]\n    out[i] = tile[3 - i] + c\n"
    reordered = reordered.replace("    out[i] = tile[3 - i]\n", later)
    assert barriers.missing(expected, reordered, 1, "x.py") == []
    early = "    cuda.syncthreads()\n    tile[i] = a\n"  # the barrier before the store: too early
    moved = source.replace("    cuda.syncthreads()\n", "").replace("    tile[i] = a\n", early)
    assert barriers.missing(expected, moved, 1, "x.py")


@pytest.fixture
def compact_without_barrier(tmp_path, monkeypatch):
    """lessons/swiftspec.py as a student who solved it but left out the barrier would have it."""
    text = (ROOT / "solutions" / "swiftspec.py").read_text()
    kept = [line for line in text.splitlines(keepends=True) if "tl.debug_barrier()" not in line
            or line.lstrip().startswith("#")]
    package = tmp_path / "student"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for sibling in (ROOT / "solutions").glob("*.py"):
        if sibling.name not in ("__init__.py", "swiftspec.py"):
            (package / sibling.name).write_text(sibling.read_text())
    (package / "swiftspec.py").write_text("".join(kept))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("student.swiftspec")
    store_line = next(i for i, line in enumerate(kept, 1) if "tl.store(base + t[:, None]" in line)
    yield module, store_line
    for name in [n for n in sys.modules if n == "student" or n.startswith("student.")]:
        sys.modules.pop(name)


def test_a_passing_compaction_without_its_barrier_fails_at_the_students_line(
        compact_without_barrier, monkeypatch):
    module, store_line = compact_without_barrier
    exercise = registry.get("swiftspec.compact_kernel")
    passing = dataclasses.replace(exercise, cases=lambda module, seed: [("every case", lambda: None)])
    monkeypatch.setattr(checks.implementations, "load", lambda name, impl=None: module)
    report = passing.run(impl="lessons")
    assert not report.passed
    failure = next(r for r in report.results if not r.passed)
    assert failure.case == "barriers"
    assert f"student/swiftspec.py:{store_line}: a barrier (tl.debug_barrier()) is missing" in failure.detail
    assert "between the load of cache and the store to cache" in failure.detail
    assert "barriers" in report.text()


def test_a_passing_triton_check_says_what_the_interpreter_cannot_show(monkeypatch):
    exercise = registry.get("swiftspec.compact_kernel")
    passing = dataclasses.replace(exercise, cases=lambda module, seed: [("every case", lambda: None)])
    report = passing.run(impl="solutions")
    assert report.passed
    if course.on_gpu():
        assert report.note == ""
    else:
        assert "no check on the CPU can show a race" in report.text()
        assert "compared your kernel's barriers with the solution's" in report.text()
        assert "python -m course check swiftspec.compact_kernel --racecheck" in report.text()
        assert "compared" not in barriers.race_note("triton_attention.tree_attention_kernel")


@pytest.mark.skipif(course.on_gpu(), reason="without a GPU, --racecheck explains itself")
def test_racecheck_without_a_gpu_says_so(capsys):
    assert main(["check", "swiftspec.compact_kernel", "--racecheck"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().out


def test_a_stub_is_not_blamed_for_missing_barriers(compact_without_barrier, monkeypatch):
    from course.core.stubs import ExerciseNotImplemented

    module, _ = compact_without_barrier

    def stub():
        raise ExerciseNotImplemented("swiftspec.compact_kernel is not implemented yet")

    exercise = registry.get("swiftspec.compact_kernel")
    unwritten = dataclasses.replace(exercise, cases=lambda module, seed: [("every case", stub)])
    monkeypatch.setattr(checks.implementations, "load", lambda name, impl=None: module)
    report = unwritten.run(impl="lessons")
    assert report.results == [] and "not implemented yet" in report.text()
