"""Sample submissions (tests/submissions/<name>/sample.py) as the grader finds them: lessons/ folders.

A sample is a recipe: HOLES (exercise -> the code a student wrote in its hole), STUBS (exercises
left as the todo), OUTSIDE (module -> (old, new) lines changed outside the holes), FILES (other
files of the submission), LINKS (path -> a path of this repository to link to), NAME (the folder's
name) and BARE (no lessons/ at all). Every other hole is answered from solutions/ here, at run
time, so that no sample holds a solution. tests/test_grade.py and tools/gpu_grade_check.sh use it.
"""

from __future__ import annotations

import functools
import runpy
import textwrap
from pathlib import Path

from course.release import Piece, render, render_pieces

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "submissions"


def _answer(source_lines: list[str], piece: Piece) -> list[str]:
    """The solution's lines for one hole of the lesson (a region's code, without its markers)."""
    hole = piece.hole
    lines = source_lines[hole.first : hole.last + 1]
    if not lines[0].strip().startswith("### BEGIN"):  # an earlier rung's lines, kept in this one
        return lines
    body = lines[1:-1]
    cut = next((i for i, line in enumerate(body) if line.strip() == "### LESSON"), len(body))
    return body[:cut]


@functools.cache
def _pieces(module: str) -> list[Piece]:
    return render_pieces(ROOT / "solutions")[Path(f"{module}.py")]


def lesson_with(module: str, holes: dict[str, str], stubs: list[str]) -> str:
    """The lesson of `module` with every hole answered from solutions/, except `holes` (exercise ->
    the student's code) and `stubs` (exercises left as the todo)."""
    source_lines = (ROOT / "solutions" / f"{module}.py").read_text().splitlines(keepends=True)
    out = []
    for piece in _pieces(module):
        exercise = piece.hole.region.exercise if piece.hole is not None else None
        if exercise is None or exercise in stubs:
            out += piece.lines
        elif exercise in holes:
            indent = piece.lines[0][: len(piece.lines[0]) - len(piece.lines[0].lstrip())]
            out.append(textwrap.indent(textwrap.dedent(holes[exercise]).strip("\n") + "\n", indent))
        else:
            out += _answer(source_lines, piece)
    return "".join(out)


def recipe(name: str) -> dict:
    return runpy.run_path(str(SAMPLES / name / "sample.py"))


def write_sample(name: str, target_root: Path, tokens: dict[str, str]) -> Path:
    spec = recipe(name)
    folder = target_root / spec.get("NAME", name)
    lessons = folder / "lessons"
    holes = {k: _tokens(v, tokens) for k, v in spec.get("HOLES", {}).items()}
    if not spec.get("BARE"):
        lessons.mkdir(parents=True)
        for module in ("trees", "attention"):
            text = lesson_with(module, holes, spec.get("STUBS", []))
            for old, new in spec.get("OUTSIDE", {}).get(module, []):
                assert text.count(old) == 1, f"{name}: {old!r} must stand once in lessons/{module}.py"
                text = text.replace(old, new)
            (lessons / f"{module}.py").write_text(text)
    for relative, content in spec.get("FILES", {}).items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(content)
    for relative, target in spec.get("LINKS", {}).items():
        link = folder / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists():
            link.unlink()
        link.symlink_to(ROOT / target)
    return folder


def _tokens(code: str, tokens: dict[str, str]) -> str:
    for token, value in tokens.items():
        code = code.replace(token, value)
    return code


def write_correct(folder: Path) -> Path:
    """A correct submission in folder: every lesson module with every hole answered (the release's
    lessons with every exercise solved)."""
    for relative, content in render(ROOT / "solutions", is_open=lambda exercise: False).items():
        path = folder / "lessons" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return folder
