"""The release turns solutions/ into lessons/: in sync, same API, loud stubs."""

import importlib
import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

from course import release
from course.checks import run_cases
from course.core import regions, runtime
from course.core.stubs import ExerciseNotImplemented, kernel_stub_name
from course.registry import EXERCISES

ROOT = Path(__file__).resolve().parent.parent


def test_lessons_match_a_fresh_release():
    assert release.differences() == [], "run `python -m course release`"


def test_every_region_becomes_a_named_stub():
    source = textwrap.dedent('''
        from course.core.stubs import todo

        def area(w, h):
            """Docstring stays."""
            if w < 0:
                raise ValueError("w")
            ### BEGIN SOLUTION
            return w * h
            ### END SOLUTION
    ''')
    stub = release.stub_source(source, "shapes", "shapes.py")
    assert 'todo("shapes.area", region=1, lines=1)' in stub
    assert "return w * h" not in stub
    assert '"""Docstring stays."""' in stub and 'raise ValueError("w")' in stub


def test_a_helper_region_may_belong_to_the_exercise_of_its_caller():
    source = textwrap.dedent('''
        from course.core.stubs import todo

        def _rows(n):
            ### BEGIN SOLUTION (shapes.kernel)
            return list(range(n))
            ### END SOLUTION

        def kernel(n):
            return _rows(n)
    ''')
    assert [r.exercise for r in regions.find_regions(source, "shapes", "shapes.py")] == ["shapes.kernel"]
    assert 'todo("shapes.kernel", region=1, lines=1)' in release.stub_source(source, "shapes", "shapes.py")


@pytest.mark.parametrize("broken, message", [
    ("def f():\n    ### BEGIN SOLUTION\n    pass\n", "never closed"),
    ("def f():\n    pass\n    ### END SOLUTION\n", "without"),
    ("def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION\n",
     "inside another"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "inside a function"),
    ("def f():\n    ### BEGIN SOLUTION (other.g)\n    pass\n    ### END SOLUTION\n", "names its exercise"),
    ("def f():\n    ### BEGIN SOLUTION g\n    pass\n    ### END SOLUTION\n", "names its exercise"),
])
def test_malformed_regions_are_rejected(broken, message):
    source = "from course.core.stubs import todo\n" + broken
    with pytest.raises(release.ReleaseError, match=message):
        release.stub_source(source, "m", "m.py")


def test_region_without_todo_import_is_rejected():
    with pytest.raises(release.ReleaseError, match="import todo"):
        release.stub_source("def f():\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION\n",
                            "m", "m.py")


def _lesson_stubs(module: str = "*") -> set[str]:
    """The exercises the todo(...) lines of lessons/<module>.py name."""
    stubs = set()
    for path in (ROOT / "lessons").rglob(f"{module}.py"):
        for line in path.read_text().splitlines():
            if stub := regions.TODO_LINE.match(line):
                stubs.add(stub.group(1))
    return stubs


def _bug_exercises() -> set[str]:
    """Find-the-bug exercises: their lessons hold a defect, not a todo stub."""
    found = set()
    for path in (ROOT / "solutions").glob("*.py"):
        source = path.read_text()
        lines = source.splitlines()
        for region in regions.find_regions(source, path.stem, path.name):
            if any(line.strip() == regions.LESSON for line in lines[region.first:region.last]):
                found.add(region.exercise)
    return found


def test_every_exercise_has_a_stub_in_lessons():
    stubs, bugs = _lesson_stubs(), _bug_exercises()
    assert bugs == {"ladder_bug.tree_attention_kernel"}
    assert not stubs & bugs
    assert stubs | bugs == set(EXERCISES), "each exercise region must be declared by its topic (exercises.py)"


def test_lessons_have_the_same_public_api_as_solutions():
    for path in (ROOT / "solutions").glob("*.py"):
        solution = importlib.import_module(f"solutions.{path.stem}")
        lesson = importlib.import_module(f"lessons.{path.stem}")
        public = {n for n in dir(solution) if not n.startswith("_")}
        assert public == {n for n in dir(lesson) if not n.startswith("_")}, path.stem


@pytest.mark.parametrize("exercise", sorted(set(EXERCISES) - _bug_exercises()))
def test_every_lesson_stub_fails_loudly(exercise):
    report = EXERCISES[exercise].run(impl="lessons", seed=0)
    assert not report.passed
    # It names itself, an exercise it requires that is still a stub too, or an earlier rung whose
    # answer its lesson leaves for the student to paste (those may come first).
    named = [f"not implemented yet: exercise {e}" in report.not_implemented
             for e in (exercise, *EXERCISES[exercise].requires, *_lesson_stubs(EXERCISES[exercise].module))]
    assert any(named), report.not_implemented


def test_kernel_stubs_are_detected_before_launch():
    lesson = importlib.import_module("lessons.trees")
    assert kernel_stub_name(lesson.tree_mask_kernel) == "trees.tree_mask_kernel"
    solution = importlib.import_module("solutions.trees")
    assert kernel_stub_name(solution.tree_mask_kernel) is None
    with pytest.raises(ExerciseNotImplemented, match="trees.dfs_times_kernel"):
        import torch

        import course
        lesson.dfs_times(torch.tensor([[-1, 0]], dtype=torch.int32, device=course.torch_device()))


def test_release_refuses_to_erase_written_exercises(tmp_path):
    lessons = tmp_path / "lessons"
    release.release(lessons=lessons)
    assert release.edited_exercises(lessons=lessons) == []
    trees = lessons / "trees.py"
    trees.write_text(re.sub(r'todo\("trees.tree_mask_kernel".*\)', "pass", trees.read_text()))
    assert release.edited_exercises(lessons=lessons) == ["trees.tree_mask_kernel"]


def test_every_generated_lesson_compiles():
    """A region that ends inside a block would leave the lesson with a stray indent."""
    from course.release import render

    for relative, content in render(ROOT / "solutions").items():
        if relative.suffix == ".py":
            compile(content, f"lessons/{relative}", "exec")


# The planted bug is a missing barrier: a GPU's warps often run in step and hide it (racecheck
# names it there, `python -m course sanitize`); the simulator's threads never do.
@pytest.mark.skipif(not runtime.SIMULATOR, reason="a GPU may hide the planted race")
@pytest.mark.parametrize("exercise", sorted(_bug_exercises()))
def test_every_find_the_bug_lesson_is_caught_by_its_check(exercise, tmp_path):
    """The defective kernel stands on the rung it copies: with that rung's answers pasted in (here the
    solution's, as a hand-out with that rung solved gives them), it runs, and its check fails."""
    module = EXERCISES[exercise].module
    only_the_bug_open = release.render(ROOT / "solutions", lambda e: e == exercise)
    path = tmp_path / f"{module}.py"
    path.write_bytes(only_the_bug_open[Path(f"{module}.py")])
    spec = importlib.util.spec_from_file_location(f"lessons.{module}_on_rung", path)
    lesson = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lesson)
    report = run_cases(exercise, EXERCISES[exercise].cases(lesson, 0))
    assert not report.passed and not report.not_implemented
    plain = EXERCISES[exercise].run(impl="lessons", seed=0)  # the rung's answers still to paste
    assert "not implemented yet" in plain.not_implemented
