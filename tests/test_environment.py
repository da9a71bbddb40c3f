"""Install files agree with each other and with the README's two commands."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pyproject_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["dev"]


def _environment_requirements():
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_lines = [line.strip()[2:] for line in lines if line.startswith("      - ")]
    return [line for line in pip_lines if not line.startswith("-e")]


def _normalise(requirement):
    return re.sub(r"\s+", "", requirement.split("#")[0]).lower()


def test_environment_yml_pins_what_pyproject_pins():
    assert sorted(map(_normalise, _environment_requirements())) == sorted(
        map(_normalise, _pyproject_requirements()))


def test_the_pins_the_course_depends_on():
    requirements = set(map(_normalise, _pyproject_requirements()))
    assert "torch==2.13.0" in requirements
    assert "numpy>=1.26,<2.5" in requirements  # numba-cuda 0.30 cannot compile with numpy 2.5
    assert "numba-cuda==0.30.4" in requirements


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
