"""Stubs that say what goes in: each todo(...) names its exercise and region as the notebook numbers
them, about how many lines go there and the names the code after it needs; the release computes
this from the solution, and the stub fails with it."""

from __future__ import annotations

import importlib
import re
import textwrap
from pathlib import Path

import pytest

from course import release
from course.core import regions
from course.core.stubs import ExerciseNotImplemented, require_written, todo

ROOT = Path(__file__).resolve().parent.parent


def _stub(source: str) -> str:
    return release.stub_source("from course.core.stubs import todo\n" + textwrap.dedent(source), "m", "m.py")


def test_a_stub_counts_the_lines_and_names_what_the_code_after_it_reads():
    stub = _stub('''
        def f(xs):
            total = 0
            ### BEGIN SOLUTION
            # a comment is not a line to write
            scale = 2
            for x in xs:
                total += x * scale

            best = max(xs)
            ### END SOLUTION
            for x in xs:  # x is assigned again before it is read: not needed from the region
                print(x)
            return total, best
    ''')
    assert 'todo("m.f", region=1, lines=4, defines="total, best")' in stub
    assert "# YOUR CODE HERE: exercise m.f, region 1 " in stub


def test_regions_are_numbered_per_exercise_as_the_notebooks_number_them():
    stub = _stub('''
        def f():
            ### BEGIN SOLUTION
            a = 1
            ### END SOLUTION
            ### BEGIN SOLUTION
            b = a
            ### END SOLUTION
            return b

        def g():
            ### BEGIN SOLUTION
            return 3
            ### END SOLUTION
    ''')
    assert re.findall(r"todo\((.*)\)", stub) == ['"m.f", region=1, lines=1, defines="a"',
                                                 '"m.f", region=2, lines=1, defines="b"',
                                                 '"m.g", region=1, lines=1']


def test_the_ladder_lessons_say_what_each_hole_holds():
    k4 = (ROOT / "lessons" / "ladder_k4.py").read_text()
    assert 'todo("ladder_k4.tree_attention_kernel", region=4, lines=6, defines="key")' in k4
    assert 'todo("ladder_k4.tree_attention_kernel", region=1, lines=1, defines="q_t")' in k4
    k10 = (ROOT / "lessons" / "ladder_k10.py").read_text()
    assert 'todo("ladder_k10.tile_visibility_kernel", region=1' in k10
    assert 'todo("ladder_k10.tree_attention_kernel", region=2' in k10


def test_no_two_stubs_of_an_exercise_read_alike():
    """The student matches a stub to the notebook's list by its text, not by its place."""
    for path in (ROOT / "lessons").glob("*.py"):
        own = [line.strip() for line in path.read_text().splitlines()
               if (stub := regions.TODO_LINE.match(line)) and stub.group(1).startswith(f"{path.stem}.")]
        assert len(own) == len(set(own)), path.name


def test_todo_fails_with_what_goes_in_and_where():
    with pytest.raises(ExerciseNotImplemented) as raised:
        todo("ladder_k4.tree_attention_kernel", region=4, lines=6, defines="key")
    message = str(raised.value)
    assert message.startswith("not implemented yet: exercise ladder_k4.tree_attention_kernel, region 4 "
                              "(about 6 lines; defines key). Open tests/test_stubs.py")
    with pytest.raises(ExerciseNotImplemented, match=r"^not implemented yet: exercise trees.x\. Open"):
        todo("trees.x")  # the one-argument form of older lessons still works


def test_a_kernel_refused_before_launch_names_its_hole():
    lesson = importlib.import_module("lessons.ladder_k4")
    with pytest.raises(ExerciseNotImplemented) as raised:
        require_written(lesson.tree_attention_kernel)
    message = str(raised.value)
    assert "exercise ladder_k2.tree_attention_kernel, region 1 (about 1 line; defines b, h, i)" in message
    assert "lessons/ladder_k4.py" in message
