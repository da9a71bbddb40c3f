"""Each rung's hand-out, run as a student first runs it: a fresh `release --handout DIR --through NN`,
no exercise written, nothing passed, and notebook NN (the newest the hand-out gives, the one that
sees the fewest lessons) run cell by cell. Every cell runs, or stops with "not implemented yet":
never a NameError left behind by a cell that stopped, or a file the hand-out does not give.

The stages here are the ladder's (notebooks 03 to 11c), a few seconds to a minute each in the simulator;
every other notebook's stage is run by `test_handout_student_topics`."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course import release
from course.topics.ladder.rungs import RUNGS
from tests.test_handout import _env

ROOT = Path(__file__).resolve().parent.parent
STAGES = sorted({release.notebook_number(rung.notebook) for rung in RUNGS})  # 03 ... 11c
STUB = "not implemented yet"


def _student_env(folder: Path) -> dict[str, str]:
    """A student's kernel: the hand-out's own course first on the path, no COURSE_IMPL, no record of
    passes kept elsewhere."""
    environment = {k: v for k, v in _env().items() if k != "COURSE_PASSES"}
    environment["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [environment.get("PYTHONPATH")])])
    return environment


def student_errors(number: str, folder: Path) -> list[str]:
    """'cell 12: NameError: ...' for each cell of notebook `number` that stopped with anything but a
    stub's "not implemented yet", run in a fresh hand-out through that notebook written to `folder`."""
    release.handout(folder, selection=release.Selection(through=number))
    path = next((folder / "notebooks").glob(f"{number}_*.ipynb"))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, kernel_name="python3", allow_errors=True, timeout=600,
                   resources={"metadata": {"path": str(path.parent)}}).execute(env=_student_env(folder))
    return [f"cell {index}: {output['ename']}: {output['evalue'][:300]}"
            for index, cell in enumerate(notebook.cells) for output in cell.get("outputs", [])
            if output.get("output_type") == "error" and STUB not in output["evalue"]]


@pytest.mark.parametrize("number", STAGES)
def test_a_fresh_handout_runs_up_to_its_first_unwritten_exercise(number, tmp_path):
    assert student_errors(number, tmp_path / "course") == []
