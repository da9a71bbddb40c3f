"""Without Triton (macOS, Windows: Triton publishes Linux wheels only) the Numba half still runs,
and a Triton module says what is missing and where it runs."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WITHOUT_TRITON = """
import sys

class NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "triton":
            raise ModuleNotFoundError("No module named 'triton'", name="triton")

sys.meta_path.insert(0, NoTriton())
import course
from course.registry import check

assert check("trees.tree_mask_kernel", impl="solutions", raise_on_failure=False).passed
try:
    course.impl.load("triton_attention", "solutions")
except course.impl.TritonMissing as error:
    print(error)
else:
    raise AssertionError("triton_attention loaded without Triton")
"""


def test_numba_runs_and_triton_modules_explain_themselves_without_triton():
    environment = dict(os.environ, PYTHONPATH=str(ROOT), COURSE_SIM="1")
    finished = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], cwd=ROOT, env=environment,
                              capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert "Linux" in finished.stdout and "WSL 2" in finished.stdout
