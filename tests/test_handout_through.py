"""Hand-outs give the course, not the answers: no lesson of a hand-out (`lessons/` itself, and
`release --handout DIR --through NN [--solved MM]` for every rung) holds most of an open exercise's
region, and `--solved` gives a later rung with the earlier ones written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course import release
from course.core import regions
from course.registry import EXERCISES
from course.topics.ladder.rungs import RUNGS, builds_on

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
MOST = 0.6  # a lesson gives a region away when it holds this share of the region's lines, in order
RUNG_NOTEBOOKS = sorted({release.notebook_number(rung.notebook) for rung in RUNGS})  # 03 ... 11c


def _normalised(line: str) -> str:
    """Whitespace normalised, but the indent kept: a copied answer keeps its nesting, while a bare
    `if row < n:` or `for x in range(D):` of the given code at another depth is not the answer."""
    indent = line[: len(line) - len(line.lstrip())].replace("\t", "    ")
    return indent + " ".join(line.split())


def _region_lines(lines: list[str], region: regions.Region) -> list[str]:
    """A region's non-blank lines, whitespace normalised (a find-the-bug region: its correct part)."""
    end = next((i for i in range(region.first + 1, region.last) if lines[i].strip() == regions.LESSON),
               region.last)
    return [_normalised(line) for line in lines[region.first + 1 : end] if line.strip()]


def _closed_code(module: str, selection: release.Selection) -> set[str]:
    """Lines of the closed rungs `module` builds on (through any number of rungs): a hand-out gives
    them, so a later region that keeps them unchanged gives nothing away by them."""
    lines, base = set(), builds_on().get(module)
    while base is not None:
        if not any(selection.is_open(e.id) for e in EXERCISES.values() if e.module == base):
            lines |= {_normalised(line) for line in (SOLUTIONS / f"{base}.py").read_text().splitlines()}
        base = builds_on().get(base)
    return lines


def open_regions(selection: release.Selection) -> list[tuple[str, regions.Region, list[str]]]:
    """(module, region, its lines) of every open exercise's region, without the lines it keeps from
    closed rungs, where at least 2 lines are left."""
    found = []
    for path in sorted(SOLUTIONS.glob("*.py")):
        source, given = path.read_text(), _closed_code(path.stem, selection)
        for region in regions.find_regions(source, path.stem, path.name):
            lines = [line for line in _region_lines(source.splitlines(), region) if line not in given]
            if len(lines) >= 2 and selection.is_open(region.exercise):
                found.append((path.stem, region, lines))
    return found


def lines_in_order(wanted: list[str], text: list[str]) -> int:
    """How many of `wanted` appear in `text` in the same order (longest common subsequence)."""
    present = set(wanted)
    text = [line for line in text if line in present]
    previous = [0] * (len(text) + 1)
    for line in wanted:
        current = [0]
        for j, other in enumerate(text):
            current.append(previous[j] + 1 if line == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def given_away(lessons: dict[Path, bytes], selection: release.Selection) -> list[str]:
    """'lessons/x.py holds 5 of 6 lines of region 3 of ex' for each open region a lesson gives away."""
    texts = {path: [_normalised(line) for line in content.decode().splitlines() if line.strip()]
             for path, content in lessons.items() if path.suffix == ".py"}
    problems = []
    for _, region, lines in open_regions(selection):
        for path, text in texts.items():
            held = lines_in_order(lines, text)
            if held >= MOST * len(lines):
                problems.append(f"{path.as_posix()} holds {held} of {len(lines)} lines of region "
                                f"{region.number} of {region.exercise}")
    return problems


def _lessons_of(files: dict[Path, bytes]) -> dict[Path, bytes]:
    return {path: content for path, content in files.items() if path.parts[0] == "lessons"}


def test_the_measure_sees_a_region_copied_into_a_lesson():
    region = ["a = 1", "for x in y:", "b += x", "return b"]
    assert lines_in_order(region, ["z = 0", "a = 1", "for x in y:", "q()", "b += x", "return b"]) == 4
    assert lines_in_order(region, ["return b", "b += x", "for x in y:", "a = 1"]) == 1


def test_repository_lessons_give_no_answer_away():
    lessons = {path.relative_to(ROOT): path.read_bytes() for path in (ROOT / "lessons").glob("*.py")}
    assert given_away(lessons, release.Selection()) == []


def test_without_the_ladders_stubs_the_measure_would_see_the_leak():
    """The measure is not vacuous: a rung's solution file holds the previous rung's answers."""
    k4 = {Path("lessons/ladder_k4.py"): (SOLUTIONS / "ladder_k4.py").read_bytes()}
    problems = given_away(k4, release.Selection())
    assert any("ladder_k3.tree_attention_kernel" in problem for problem in problems)


def _previous(number: str) -> str | None:
    earlier = [n for n in RUNG_NOTEBOOKS if n < number]
    return earlier[-1] if earlier else None


@pytest.fixture(scope="module", params=RUNG_NOTEBOOKS)
def rung_handouts(request) -> tuple[str, dict[release.Selection, dict[Path, bytes]]]:
    """The hand-outs through one rung's notebook: all exercises open, and the rungs before it solved."""
    number = request.param
    selections = (release.Selection(through=number),
                  release.Selection(through=number, solved=_previous(number)))
    return number, {selection: release.handout_files(ROOT, selection) for selection in selections}


def test_no_handout_through_a_rung_gives_an_answer_away(rung_handouts):
    for selection, files in rung_handouts[1].items():
        assert given_away(_lessons_of(files), selection) == [], selection


def test_handout_through_a_rung_has_its_notebooks_and_lessons_only(rung_handouts):
    number, handouts = rung_handouts
    for files in handouts.values():
        notebooks = {release.notebook_number(p.name) for p in files if p.suffix == ".ipynb"}
        assert max(notebooks) == number and "00" in notebooks
        lessons = {p.stem for p in _lessons_of(files) if p.stem != "__init__"}
        assert lessons == {e.module for e in EXERCISES.values()
                           if release.notebook_number(e.notebook) <= number}


def _todo_exercises(content: bytes) -> list[str]:
    """The exercise each todo(...) line names, in order."""
    return [m.group(1) for line in content.decode().splitlines() if (m := regions.TODO_LINE.match(line))]


def test_solved_handout_gives_the_rung_on_the_finished_previous_ones(rung_handouts):
    """--through NN --solved <the rung before>: NN's lesson has a todo for each of its own regions and
    no other (the earlier rungs' code stands written, those exercises being closed)."""
    number, handouts = rung_handouts
    files = handouts[release.Selection(through=number, solved=_previous(number))]
    for rung in RUNGS:
        if release.notebook_number(rung.notebook) == number:
            source = (SOLUTIONS / f"{rung.module}.py").read_text()
            own = [r.exercise for r in regions.find_regions(source, rung.module, rung.module)]
            assert _todo_exercises(files[Path("lessons") / f"{rung.module}.py"]) == own, rung.module


def test_open_handout_asks_for_the_earlier_rungs_where_their_answers_stand():
    k4 = (ROOT / "lessons" / "ladder_k4.py").read_text()
    assert {"ladder_k2.tree_attention_kernel", "ladder_k3.tree_attention_kernel",
            "ladder_k4.tree_attention_kernel"} == set(_todo_exercises(k4.encode()))
    copy = "# COPY FROM YOUR lessons/ladder_k3.py: the lines of region 3 of ladder_k3.tree_attention_kernel"
    assert copy in k4


@pytest.mark.parametrize("arguments, message", [
    (["--through", "06"], "pass --handout DIR too"),
    (["--handout", "{dir}", "--through", "06", "--solved", "07"], "lies past --through"),
    (["--handout", "{dir}", "--through", "6"], "must be a notebook number"),
])
def test_handout_options_refuse_what_makes_no_sense(arguments, message, tmp_path):
    from course.__main__ import main

    argv = ["release", *(a.format(dir=tmp_path / "out") for a in arguments)]
    assert main(argv) == 2
    assert not (tmp_path / "out").exists()


def test_check_in_a_solved_handout_asks_for_the_rungs_own_code(tmp_path):
    folder = tmp_path / "course"
    done = subprocess.run([sys.executable, "-m", "course", "release", "--handout", str(folder), "--through",
                           "06", "--solved", "05"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (folder / "notebooks" / "07_register_mask.ipynb").exists()
    assert not (folder / "lessons" / "ladder_k5.py").exists()
    check = subprocess.run([sys.executable, "-m", "course", "check", "ladder_k4.tree_attention_kernel"],
                           cwd=folder, capture_output=True, text=True, timeout=300,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert check.returncode == 1, check.stdout + check.stderr
    assert ("not implemented yet: exercise ladder_k4.tree_attention_kernel, region 1 (about 1 line; "
            "defines q_t)") in check.stdout
    assert "lessons/ladder_k4.py" in check.stdout


@pytest.mark.parametrize("module", sorted(builds_on()))
def test_each_pasted_hole_holds_lines_that_stand_together_in_the_rung_before(module):
    """What a `# COPY FROM YOUR lessons/<previous>.py` hole asks for is there, in one piece."""
    sources = {path.stem: path.read_text() for path in SOLUTIONS.glob("*.py")}
    previous = "\n".join(line.strip() for line in sources[builds_on()[module]].splitlines()
                         if line.strip() and not line.strip().startswith(("### BEGIN", "### END")))
    lines = sources[module].splitlines()
    for hole in release.lesson_holes(module, sources):
        if hole.module != module:
            wanted = "\n".join(line.strip() for line in lines[hole.first : hole.last + 1] if line.strip())
            assert wanted in previous, (module, hole.first + 1, hole.region.exercise)
