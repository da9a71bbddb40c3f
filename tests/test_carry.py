"""Carrying a rung forward (`python -m course carry`): a rung's lesson gets the student's own code of
the rung it builds on, exactly, and nothing else: never ours, never over the student's own lines."""

from __future__ import annotations

import functools
import importlib.util
import shutil
from pathlib import Path

import pytest

from course import carry, release
from course.checks import run_cases
from course.core import regions
from course.registry import EXERCISES
from course.topics.ladder.rungs import builds_on

ROOT = Path(__file__).resolve().parent.parent
def _released(module: str) -> str:
    return (ROOT / "lessons" / f"{module}.py").read_text()


SOURCES = {path.stem: path.read_text() for path in (ROOT / "solutions").glob("*.py")}
# Rungs whose lessons hold lines of an earlier rung's answers.
CARRIED = [m for m in builds_on() if "# COPY FROM YOUR" in _released(m)]


@functools.cache
def _written(module: str, open_exercises: frozenset[str] = frozenset()) -> str:
    """The module's lesson as a student who has written every exercise but `open_exercises` holds it:
    the solution's own regions stand for the student's code."""
    body = release.stub_source(SOURCES[module], module, f"solutions/{module}.py", SOURCES,
                               lambda exercise: exercise in open_exercises)
    return _header(_released(module)) + body


def _own_holes_open(module: str) -> str:
    """The rung's lesson with every earlier answer written and this rung's own holes open, under the
    header the released lesson has."""
    own = frozenset(e for e in EXERCISES if e.startswith(f"{module}."))
    written = _written(module, own)
    return _header(_released(module)) + written[len(_header(written)):]


def _header(lesson: str) -> str:
    """The comment lines above a lesson's docstring."""
    return lesson[: lesson.index('"""')]


def _course(tmp_path: Path, solutions: bool = True) -> Path:
    """A copy of the course's lessons (and solutions, unless a hand-out) to carry in."""
    root = tmp_path / "course"
    shutil.copytree(ROOT / "lessons", root / "lessons")
    if solutions:
        shutil.copytree(ROOT / "solutions", root / "solutions")
    return root


@pytest.mark.parametrize("module", CARRIED)
def test_carrying_a_written_rung_fills_exactly_the_earlier_answers(module):
    rung = carry.plan(module, SOURCES)
    outcome = carry.carried(rung, _written(rung.base), _released(module))
    assert outcome.by_hand == [] and outcome.kept == []
    assert outcome.text == _own_holes_open(module)


def test_the_carried_lines_are_the_students_own(tmp_path):
    root = _course(tmp_path)
    mine = "    key_start = cuda.shared.array(TILE, int32)  # my own rung 3\n"
    written = _written("ladder_k3").replace("    key_start = cuda.shared.array(TILE, int32)\n", mine, 1)
    assert mine in written
    (root / "lessons" / "ladder_k3.py").write_text(written)
    outcome = carry.carry("ladder_k4", root)
    carried = (root / "lessons" / "ladder_k4.py").read_text()
    assert carried == outcome.text
    ours = "    key_start = cuda.shared.array(TILE, int32)\n"
    assert carried == _own_holes_open("ladder_k4").replace(ours, mine)
    assert "COPY FROM" not in carried.split('"""', 2)[2]  # past the header: one kernel, this rung's holes
    assert "region 1 of ladder_k3.tree_attention_kernel" in outcome.report("ladder_k4")


def test_a_part_written_another_way_is_left_to_copy_by_hand():
    """Inside a run of holes, the lines a rung keeps are told from the lines it changes by our code
    around them: where the student's differs, that part keeps its todo line and the report names it."""
    ours = "                    s[t, c] = p\n"  # rung 4 changes it; the lines after it are carried
    mine = _written("ladder_k3").replace(ours, "                    s[t, c] = p  # stored for P.V\n")
    outcome = carry.carried(carry.plan("ladder_k4", SOURCES), mine, _released("ladder_k4"))
    assert outcome.by_hand == ["region 3 of ladder_k2.tree_attention_kernel, at line 95"]
    assert outcome.text.splitlines()[94].strip() == \
        'todo("ladder_k2.tree_attention_kernel", region=3, lines=1, defines="l_tile")'
    assert "stored for P.V" not in outcome.text and len(outcome.carried) == 11
    assert "copy by hand from lessons/ladder_k3.py" in outcome.report("ladder_k4")


def test_carrying_refuses_an_unwritten_previous_rung(tmp_path):
    root = _course(tmp_path)
    with pytest.raises(carry.CarryError, match="ladder_k3.py is as released"):
        carry.carry("ladder_k4", root)
    half = _written("ladder_k3", frozenset({"ladder_k3.tree_attention_kernel"}))  # rung 2's parts only
    (root / "lessons" / "ladder_k3.py").write_text(half)
    with pytest.raises(carry.CarryError, match="still holds stubs .*write rung 3 first"):
        carry.carry("ladder_k4", root)
    uncarried = _written("ladder_k3", frozenset({"ladder_k2.tree_attention_kernel"}))  # rung 2 not carried in
    (root / "lessons" / "ladder_k3.py").write_text(uncarried)
    with pytest.raises(carry.CarryError, match="python -m course carry ladder_k3"):
        carry.carry("ladder_k4", root)
    assert (root / "lessons" / "ladder_k4.py").read_text() == _released("ladder_k4")


def test_carrying_names_the_rungs_it_knows(tmp_path):
    with pytest.raises(carry.CarryError, match="ladder rung that builds on another.*got 'trees'"):
        carry.carry("trees", _course(tmp_path))


def test_carrying_never_overwrites_a_hole_the_student_wrote(tmp_path):
    root = _course(tmp_path)
    (root / "lessons" / "ladder_k3.py").write_text(_written("ladder_k3"))
    stub = '    todo("ladder_k2.tree_attention_kernel", region=4, lines=3)\n'
    mine = "    pass  # my own ending\n"
    assert _released("ladder_k4").count(stub) == 1
    (root / "lessons" / "ladder_k4.py").write_text(_released("ladder_k4").replace(stub, mine))
    outcome = carry.carry("ladder_k4", root)
    carried = (root / "lessons" / "ladder_k4.py").read_text()
    assert mine in carried and stub not in carried
    assert outcome.kept == ["region 4 of ladder_k2.tree_attention_kernel"]
    assert "already written, left as they are: region 4 of ladder_k2" in outcome.report("ladder_k4")


def test_a_handout_cannot_carry_and_gives_nothing_away(tmp_path):
    root = _course(tmp_path, solutions=False)
    (root / "lessons" / "ladder_k3.py").write_text(_written("ladder_k3"))
    with pytest.raises(carry.CarryError, match="has no solutions/"):
        carry.carry("ladder_k4", root)
    assert (root / "lessons" / "ladder_k4.py").read_text() == _released("ladder_k4")
    assert carry.carry_after_pass("ladder_k3", root) == []  # a passing check there carries nothing either
    assert "in a hand-out, which cannot carry" in _released("ladder_k4")


def test_a_passing_check_carries_into_a_next_rung_still_as_released(tmp_path):
    root = _course(tmp_path)
    (root / "lessons" / "ladder_k3.py").write_text(_written("ladder_k3"))
    told = carry.carry_after_pass("ladder_k3", root)
    assert sorted(report.split(":")[0] for report in told) == [
        "carried your lessons/ladder_k3.py into lessons/ladder_bug.py",
        "carried your lessons/ladder_k3.py into lessons/ladder_k4.py"]
    assert (root / "lessons" / "ladder_k4.py").read_text() == _own_holes_open("ladder_k4")
    (root / "lessons" / "ladder_k4.py").write_text(_released("ladder_k4") + "# my note\n")
    assert not any("ladder_k4.py" in line for line in carry.carry_after_pass("ladder_k3", root))


def test_a_carried_lesson_passes_its_check_once_its_own_holes_are_written(tmp_path):
    rung = carry.plan("ladder_k4", SOURCES)
    carried = carry.carried(rung, _written("ladder_k3"), _released("ladder_k4")).text
    # The student's own rung 4: the solution's regions, written where the todo lines stand.
    finished = _written("ladder_k4")
    assert carried != finished and "todo(" in carried
    for hole in (p.hole for p in rung.pieces if p.hole is not None and p.hole.module == "ladder_k4"):
        stub = "".join(next(p.lines for p in rung.pieces if p.hole == hole))
        carried = carried.replace(stub, "".join(_region_lines(hole)), 1)
    assert carried[len(_header(carried)):] == finished[len(_header(finished)):]
    path = tmp_path / "ladder_k4_carried.py"
    path.write_text(carried)
    spec = importlib.util.spec_from_file_location("ladder_k4_carried", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exercise = EXERCISES["ladder_k4.tree_attention_kernel"]
    cases = [(name, run) for name, run in exercise.cases(module, 0) if name.startswith("two nodes")][:1]
    report = run_cases(exercise.id, cases)
    assert cases and report.passed, report.text()


def _region_lines(hole: regions.Hole) -> list[str]:
    lines = SOURCES["ladder_k4"].splitlines(keepends=True)
    return lines[hole.first + 1 : hole.last]
