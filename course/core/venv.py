"""Is this the Python the course was installed into? Said before anything imports torch.

`make lab` and `make test` install the course's packages into the repository's `.venv`. A terminal
whose shell start-up (a `~/.bashrc` that starts pyenv or conda, or anything else that edits PATH)
puts another `python` ahead of `.venv/bin` runs the course without them, and a bare
"No module named 'torch'" does not say why. `require_packages` says why.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from course.core.regions import ROOT

VENV = ROOT / ".venv"
PACKAGES = ("torch", "numpy", "numba")  # what importing the course needs, torch first


class NotTheCoursePython(ModuleNotFoundError):
    """The course's packages are missing because this Python is not the course's .venv."""


def in_course_venv() -> bool:
    """True when this interpreter runs from the repository's .venv (activated or not)."""
    try:
        return Path(sys.prefix).resolve() == VENV.resolve()
    except OSError:
        return False


def missing_packages() -> list[str]:
    """The packages of PACKAGES this Python cannot import (found without importing them)."""
    return [name for name in PACKAGES if importlib.util.find_spec(name) is None]


def advice(missing: list[str]) -> str:
    """What to do: the course's own Python, by path or by activating the venv."""
    return ("this Python is not the course's .venv: run `.venv/bin/python -m course …` or "
            f"`source .venv/bin/activate` in {ROOT} ({sys.executable} has no {', '.join(missing)}; a "
            "shell start-up file, such as a ~/.bashrc that starts pyenv or conda, can put its own python "
            "ahead of .venv/bin)")


def require_packages() -> None:
    """Refuse, saying why, when the course's packages are missing because this is not the venv's
    Python while the repository has one. In the venv, or without one (conda, SYSTEM_TORCH), a
    missing package raises its own error when it is imported."""
    if in_course_venv() or not (VENV / "bin" / "python").exists():
        return
    missing = missing_packages()
    if not missing:
        return
    if sys.argv[:1] == ["-m"]:  # `python -m course …` is being started: one line, no traceback
        print(f"error: {advice(missing)}", file=sys.stderr)
        raise SystemExit(2)
    raise NotTheCoursePython(advice(missing), name=missing[0])
