"""A Python outside the course's .venv is told so, by name, instead of "No module named 'torch'";
the venv's own Python says nothing about it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course.core import venv

ROOT = Path(__file__).resolve().parent.parent
ADVICE = ("this Python is not the course's .venv: run `.venv/bin/python -m course …` or "
          "`source .venv/bin/activate`")

needs_venv = pytest.mark.skipif(not venv.in_course_venv(), reason="the suite runs outside the course's .venv")


def _run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=300)


@needs_venv
def test_the_command_line_outside_the_venv_says_which_python_to_use():
    # -S leaves out site: the venv's packages are not seen, as from a pyenv or system python.
    done = _run("-S", "-m", "course", "list")
    assert done.returncode == 2
    assert ADVICE in done.stderr and "torch" in done.stderr
    assert "Traceback" not in done.stderr and "No module named" not in done.stderr


@needs_venv
def test_importing_the_course_outside_the_venv_raises_the_advice():
    done = _run("-S", "-c", "import course")
    assert done.returncode == 1
    assert f"NotTheCoursePython: {ADVICE}" in done.stderr
    assert issubclass(venv.NotTheCoursePython, ModuleNotFoundError)  # `except ImportError` still holds


@needs_venv
def test_the_venv_itself_stays_silent():
    done = _run("-m", "course", "list")
    assert done.returncode == 0 and "trees.dfs_times_kernel" in done.stdout
    assert ".venv" not in done.stderr


def test_nothing_is_said_where_no_package_is_missing(monkeypatch):
    monkeypatch.setattr(venv, "in_course_venv", lambda: False)
    monkeypatch.setattr(venv, "missing_packages", lambda: [])
    venv.require_packages()  # neither raises nor exits
