"""Every other notebook's hand-out, run as a student first runs it (`student_errors`): the setup and
the foundations (00-02), the ladder's results (11) and every topic after the ladder (12 on), each in a
fresh `release --handout DIR --through NN` with no exercise written. The ladder's own stages are in
`test_handout_student`; the two files are apart so that the test workers share them."""

from __future__ import annotations

from pathlib import Path

import pytest

from course import release
from tests.test_handout_student import STAGES, student_errors

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(release.notebook_number(path.stem) for path in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
OTHER_STAGES = [number for number in NOTEBOOKS if number not in STAGES]


def test_every_notebook_is_run_as_a_student_by_one_of_the_two_files():
    # OTHER_STAGES is what the ladder's stages leave; the ladder's must be notebooks on disk too, or a
    # renamed rung notebook would be run by neither file.
    assert set(STAGES) <= set(NOTEBOOKS), sorted(set(STAGES) - set(NOTEBOOKS))
    assert {"00", "12", "21"} <= set(OTHER_STAGES)


@pytest.mark.parametrize("number", OTHER_STAGES)
def test_a_fresh_handout_runs_up_to_its_first_unwritten_exercise(number, tmp_path):
    assert student_errors(number, tmp_path / "course") == []
