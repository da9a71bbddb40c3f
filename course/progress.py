"""The record of your passes: which exercises' checks passed on your lessons/ code as it stands.

A check of your lessons that passes (`course.check`, `python -m course check`) records the exercise
in `.course/passed.json` at the repository root (git ignores it), with a hash of the lesson
functions that hold the exercise's regions. Edit them after the pass, and the record no longer
matches: the reference (`course.answers`) hides again until the check passes anew.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from course.checks import Exercise
from course.core import impl, regions
from course.core.regions import region_functions
from course.core.source import function_in_file

PASSES_ENV = "COURSE_PASSES"  # a file to keep the record of passes in, instead of the default


def _places() -> list[Path]:
    """Where the record may live, first choice first: the repository, else (a read-only copy of the
    course) the user's cache, one file per repository."""
    override = os.environ.get(PASSES_ENV, "").strip()
    if override:
        return [Path(override)]
    repository = hashlib.sha256(str(regions.ROOT).encode()).hexdigest()[:12]
    return [regions.ROOT / ".course" / "passed.json",
            Path.home() / ".cache" / "speckernels" / f"passed-{repository}.json"]


def _read(path: Path) -> dict[str, str]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, unreadable or damaged: as if nothing had passed
        return {}
    return {k: v for k, v in record.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(record, dict) else {}


def passes() -> dict[str, str]:
    """Exercise id -> the hash of your code when its check last passed."""
    record: dict[str, str] = {}
    for path in reversed(_places()):  # the first place wins
        record.update(_read(path))
    return record


def _write(record: dict[str, str]) -> bool:
    for path in _places():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            partial.replace(path)  # whole or not at all: a notebook and a terminal may both write
            return True
        except OSError:
            continue
    return False


def holders(exercise: Exercise) -> tuple[str, ...]:
    """The functions that hold the exercise's regions (a helper's too), from the solution where it
    is here; else the function the exercise is named after."""
    own = (exercise.id.split(".", 1)[1],)
    solution = regions.ROOT / "solutions" / f"{exercise.module}.py"
    if not impl.has_solutions() or not solution.is_file():
        return own
    found = region_functions(solution.read_text(), exercise.module, f"solutions/{solution.name}")
    return found.get(exercise.id) or own


def fingerprint(exercise: Exercise) -> str | None:
    """A hash of your lesson functions that hold the exercise's regions, read from lessons/ (None
    if the file cannot be read or parsed)."""
    try:
        text = (regions.ROOT / "lessons" / f"{exercise.module}.py").read_text()
        names = dict.fromkeys((*holders(exercise), exercise.id.split(".", 1)[1]))
        sources = [function_in_file(text, name) or "" for name in names]
    except (OSError, SyntaxError, ValueError):
        return None
    return hashlib.sha256("\n\x00\n".join(sources).encode()).hexdigest()


def record_pass(exercises: Iterable[Exercise]) -> bool:
    """Note that the check of these exercises (those one run checks: `course.registry.checked_together`)
    passed on your lessons/ code as it stands. False if the record could not be written anywhere (the
    check's result stands all the same)."""
    record = passes()
    for exercise in exercises:
        code = fingerprint(exercise)
        if code is not None:
            record[exercise.id] = code
    return _write(record)
