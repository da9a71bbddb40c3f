"""Grading: sample submissions (tests/submissions/) get the grades and notes they must get.

One grading run over every sample (two at a time) with a small, fast subset of exercises
and short limits; the correct submission and the `_solution_*.py` modules the hostile
samples import are written from solutions/ into a temporary folder, never committed here.
"""

from __future__ import annotations

import csv
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from course.core import runtime
from course.grading import Limits, grade
from course.grading.collect import SubmissionError, find_submissions, safe_extract

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SAMPLES = HERE / "submissions"
EXERCISES = ["trees.dfs_times_kernel", "attention.online_softmax", "attention.merge_attention"]
POINTS = {"trees.dfs_times_kernel": 3, "attention.online_softmax": 2, "attention.merge_attention": 2}
SEED = 1234


def _lessons_with_solutions(folder: Path) -> Path:
    lessons = folder / "lessons"
    lessons.mkdir(parents=True, exist_ok=True)
    for module in ("trees", "attention"):
        source = (ROOT / "solutions" / f"{module}.py").read_text()
        (lessons / f"_solution_{module}.py").write_text(source)
        if not (lessons / f"{module}.py").exists():
            (lessons / f"{module}.py").write_text(source)
    return lessons


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
    submissions = base / "submissions"
    for sample in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        shutil.copytree(sample, submissions / sample.name)
        _lessons_with_solutions(submissions / sample.name)
    _lessons_with_solutions(submissions / "correct")
    # a zipped repository copy, wrapped in a folder as GitHub's "download zip" does
    zipped = base / "zipped"
    _lessons_with_solutions(zipped / "SpecKernels-main")
    with zipfile.ZipFile(submissions / "zipped.zip", "w") as zf:
        for path in sorted(zipped.rglob("*.py")):
            zf.write(path, path.relative_to(zipped).as_posix())
    watched = base / "watched"  # stands for the grader's repository: nothing may change here
    watched.mkdir()
    (watched / "keep.txt").write_text("unchanged")
    out = base / "out"
    limits = Limits(per_exercise_s=20, total_s=120, memory_mb=8192, output_mb=1)
    grades = grade(submissions, out, SEED, exercises=EXERCISES, limits=limits, jobs=2, progress=False,
                   watch=[watched])
    return {g.student: g for g in grades}, out


def _points(g) -> dict[str, float]:
    return {e: g.exercises[e].points for e in EXERCISES}


def test_correct_submissions_get_every_point(graded):
    grades, _ = graded
    for student in ("correct", "zipped"):
        assert _points(grades[student]) == POINTS, grades[student].exercises
        assert grades[student].flags == [] and grades[student].notes == []


def test_partly_correct_gets_partial_credit(graded):
    g = graded[0]["partly_correct"]
    assert g.exercises["attention.online_softmax"].fraction == 0.5  # the large-score cases fail
    assert _points(g) == {**POINTS, "attention.online_softmax": 1.0}
    assert g.flags == []


@pytest.mark.parametrize("student, exercise, note, flag", [
    ("import_error", "trees.dfs_times_kernel", "importing lessons/trees.py failed", ""),
    ("hangs", "attention.online_softmax", "hung: it ran past the time limit of 20 s", "timed out"),
    ("segfault", "attention.merge_attention", "crashed the interpreter: SIGSEGV", "crashed"),
    ("sys_exit", "attention.online_softmax", "called sys.exit(3)", "exited"),
    ("prints_megabytes", "attention.online_softmax", "printed too much", "too much output"),
    ("writes_outside", "attention.online_softmax", "tried to write outside its folder",
     "writes outside its folder"),
    ("monkeypatch", "attention.online_softmax", "monkeypatching", "monkeypatched the harness"),
])
def test_hostile_submissions_keep_the_points_earned_elsewhere(graded, student, exercise, note, flag):
    grades, out = graded
    g = grades[student]
    assert g.exercises[exercise].points == 0
    assert note in g.exercises[exercise].note
    if flag:
        assert flag in g.flags
    zeroed = {exercise}
    if student == "monkeypatch":  # every import of its attention.py patches the check again
        zeroed.add("attention.merge_attention")
        assert "monkeypatching" in g.exercises["attention.merge_attention"].note
    assert {e: p for e, p in _points(g).items() if e not in zeroed} == {
        e: p for e, p in POINTS.items() if e not in zeroed}
    feedback = (out / "feedback" / f"{student}.md").read_text()
    assert note in feedback


def test_nothing_outside_the_submissions_changed(graded):
    grades, _ = graded
    assert not any("files outside its folder changed" in n for g in grades.values() for n in g.notes)


def test_gradebook_has_a_row_per_student_and_a_column_per_exercise(graded):
    grades, out = graded
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    assert rows[0]["student"] == "(points)"
    by_student = {r["student"]: r for r in rows[1:]}
    assert set(by_student) == set(grades)
    assert float(by_student["correct"]["total"]) == sum(POINTS.values())
    assert float(by_student["partly_correct"]["attention.online_softmax"]) == 1.0
    assert "crashed" in by_student["segfault"]["flags"]
    feedback = (out / "feedback" / "partly_correct.md").read_text()
    assert "failed: 5x37 scores, block=1, large scores" in feedback


def test_zips_may_not_escape(tmp_path):
    for name in ("../evil.py", "/abs/evil.py"):
        archive = tmp_path / "evil.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr(name, "x = 1\n")
        with pytest.raises(SubmissionError, match="refuses the path"):
            safe_extract(archive, tmp_path / "target")
    assert not (tmp_path / "evil.py").exists()


def test_find_submissions(tmp_path):
    (tmp_path / "a" / "lessons").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trees.py").write_text("")
    (tmp_path / "c.zip").write_bytes(b"")
    assert [s.student for s in find_submissions(tmp_path)] == ["a", "b", "c"]
    assert [s.student for s in find_submissions(tmp_path / "a")] == ["a"]
    with pytest.raises(ValueError, match="submissions"):
        find_submissions(tmp_path / "missing")


# ------------------------------------------------------------------ speed (course.grading.speed)

@pytest.mark.skipif(not runtime.SIMULATOR, reason="on a GPU, grading times the exercises")
def test_simulator_grading_times_nothing_and_says_so(graded):
    grades, out = graded
    feedback = (out / "feedback" / "correct.md").read_text()
    assert "## Speed" in feedback and "Not timed: this grading ran in the simulator" in feedback
    document = json.loads((out / "grades.json").read_text())
    assert document["timing"]["timed"] is False
    assert document["students"][0]["exercises"]["trees.dfs_times_kernel"]["student_ms"] is None
    header = next(csv.reader((out / "gradebook.csv").open()))
    assert not any(column.startswith("speed ") for column in header)


def test_every_ladder_rung_and_the_triton_kernel_have_a_bench_hook():
    from course.exercises import EXERCISES
    from course.topics.ladder.rungs import RUNGS

    hooked = {e.id for e in EXERCISES.values() if e.bench is not None}
    assert {f"{rung.module}.tree_attention_kernel" for rung in RUNGS} <= hooked
    assert "triton_attention.tree_attention_kernel" in hooked


def _fake(exercise_id: str, points: int, hook):
    from course.exercises import Exercise

    return Exercise(exercise_id, "99_fake", points, lambda module, seed: [], "fake", bench=hook)


def test_timed_results_are_reported_with_a_fake_timer(tmp_path):
    from course.grading import report
    from course.grading.runner import ExerciseGrade, SubmissionGrade
    from course.grading.speed import Speed, time_impl

    calls = []

    def hook(impl):
        calls.append(impl)
        return lambda: impl

    def broken(impl):
        raise RuntimeError("out of shared memory")

    fast, slow = _fake("m.fast", 2, hook), _fake("m.slow", 2, hook)
    untimed, failing = _fake("m.none", 1, None), _fake("m.broken", 1, broken)
    exercises = [fast, slow, untimed, failing]

    def timer(fn):  # the solution takes 2 ms; lessons' kernels what the test says
        return {"solutions": 2.0}[fn()]

    speed = Speed.measure(exercises, timer=timer, device="Fake GPU")
    assert calls == ["solutions", "solutions"] and speed.solution_ms == {"m.fast": 2.0, "m.slow": 2.0}
    assert speed.solution_notes["m.broken"].startswith("timing failed: RuntimeError: out of shared memory")
    assert time_impl(untimed, "lessons", timer) == (None, "no timing for this exercise")
    assert time_impl(fast, "lessons", lambda fn: 3.0) == (3.0, "")

    passed = [("case", True, "")]
    grade = SubmissionGrade("alice", "alice/", {
        "m.fast": ExerciseGrade("m.fast", 2, passed, student_ms=1.0),
        "m.slow": ExerciseGrade("m.slow", 2, [("case", False, "wrong")]),  # failed: never timed
        "m.none": ExerciseGrade("m.none", 1, passed),
        "m.broken": ExerciseGrade("m.broken", 1, passed, student_ms=1.0)})
    report.write_all([grade], exercises, tmp_path, seed=1, speed=speed)

    text = (tmp_path / "feedback" / "alice.md").read_text()
    assert "Median times on Fake GPU" in text
    assert "| `m.fast` | 1.000 ms vs the solution's 2.000 ms: 0.50x its time |" in text
    assert "| `m.slow` | not timed: only a kernel that passes every case is timed |" in text
    assert "| `m.broken` | not timed: the solution's timing failed: RuntimeError" in text
    assert "No timing for: `m.none`." in text
    rows = list(csv.DictReader((tmp_path / "gradebook.csv").open()))
    speed_columns = [c for c in rows[0] if c.startswith("speed ")]
    assert speed_columns == ["speed m.fast", "speed m.slow", "speed m.broken"]
    assert rows[1]["speed m.fast"] == "0.500" and rows[1]["speed m.slow"] == ""
    document = json.loads((tmp_path / "grades.json").read_text())
    fast_json = document["students"][0]["exercises"]["m.fast"]
    assert (fast_json["student_ms"], fast_json["solution_ms"], fast_json["time_ratio"]) == (1.0, 2.0, 0.5)
    assert document["timing"]["timed"] is True and document["timing"]["device"] == "Fake GPU"


def test_worker_result_carries_the_time():
    from course.grading.runner import _grade_from

    g = _grade_from({"exercise": "m.fast", "results": [["case", True, ""]], "student_ms": 1.5,
                     "timing_note": ""}, 2.0)
    assert g.student_ms == 1.5 and g.points == 2.0
