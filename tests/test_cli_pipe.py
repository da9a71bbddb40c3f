"""The command line behaves in a pipe: `python -m course list | head -1` prints one line, no traceback."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_list_into_a_closed_pipe_ends_quietly():
    finished = subprocess.run(f"'{sys.executable}' -m course list | head -1", shell=True, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert len(finished.stdout.splitlines()) == 1
    assert "Traceback" not in finished.stderr and "BrokenPipeError" not in finished.stderr
