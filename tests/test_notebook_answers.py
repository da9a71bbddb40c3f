"""No notebook shows a student our answers before their check passes.

Each notebook runs as a student first meets it: `COURSE_IMPL=lessons`, the lessons' stubs, nothing
passed yet. Cells may fail ("not implemented yet"), so errors are allowed, but no cell's output may
hold a line of code of an exercise region of `solutions/`: a "Compare with ours" cell prints one
line instead, and hints describe the line rather than print it. The whole set takes under two
minutes on one core (3 to 8 s a notebook, most of it the kernel's start), so every notebook runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course import progress
from course.core import impl, regions

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LONG = 20  # non-space characters: shorter lines (`m_prev = m_new`, `else:`) are not an answer
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def answer_lines() -> dict[str, str]:
    """Each long code line of a solution region (a find-the-bug region: its fix) that no lesson
    holds -> where it comes from ('ladder_k4.tree_attention_kernel region 3')."""
    public = {line.strip() for path in (ROOT / "lessons").glob("*.py")
              for line in path.read_text().splitlines()}
    found: dict[str, str] = {}
    for path in sorted((ROOT / "solutions").glob("*.py")):
        lines = path.read_text().splitlines()
        for region in regions.find_regions("\n".join(lines), path.stem, path.name):
            end = next((i for i in range(region.first + 1, region.last)
                        if lines[i].strip() == regions.LESSON), region.last)
            for line in lines[region.first + 1 : end]:
                code = line.strip()
                if len(code.replace(" ", "")) >= LONG and code not in public:
                    found.setdefault(code, f"{region.exercise} region {region.number}")
    return found


def output_text(cell) -> str:
    """Everything a code cell shows: streams, results and displays as text, error tracebacks."""
    shown = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            shown.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            shown += [value for kind, value in output.get("data", {}).items()
                      if kind.startswith("text/") and isinstance(value, str)]
        elif output.output_type == "error":
            shown.append("\n".join(output.traceback))
    return ANSI.sub("", "\n".join(shown))


def leaks(notebook, answers_by_line: dict[str, str]) -> list[str]:
    """'cell 18: <line> (ladder_k1.tree_attention_kernel region 1)' for each answer line shown."""
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            shown = output_text(cell)
            found += [f"cell {index}: {line}   ({where})"
                      for line, where in answers_by_line.items() if line in shown]
    return found


def test_the_answer_lines_are_found():
    """The scan has something to look for, and finds it where it stands."""
    found = answer_lines()
    assert len(found) > 100
    line = next(line for line, where in found.items() if where.startswith("ladder_k4."))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(ours)")])
    notebook.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"+    {line}\n")]
    assert leaks(notebook, found) == [f"cell 0: {line}   ({found[line]})"]


@pytest.mark.skipif(not impl.has_solutions(), reason="a hand-out has no solutions/ to compare with")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_student_sees_no_answer(path, tmp_path, monkeypatch):
    monkeypatch.setenv(impl.IMPL_ENV, "lessons")
    monkeypatch.setenv(progress.PASSES_ENV, str(tmp_path / "passed.json"))  # nothing passed yet
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    shown = leaks(notebook, answer_lines())
    assert not shown, (f"{path.name} shows our answers to a student before the check passes:\n"
                       + "\n".join(shown))
