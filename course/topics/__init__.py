"""The topic rooms: one package per topic, course/topics/<topic>/, each with the same parts.

Every topic has `check.py` (its exercises' cases), `exercises.py` (`EXERCISES`, the exercises it
declares), `bench.py` (what it measures on a GPU) and `figures.py` (what it draws from the
measurements); `python -m course` finds them here, so a new topic needs no line elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

PARTS = ("check", "exercises", "bench", "figures")


def names() -> list[str]:
    """The topic rooms, course/topics/<topic>/, in alphabetical order."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def part_of(topic: str, part: str) -> ModuleType:
    """`course.topics.<topic>.<part>` imported (part: one of PARTS); a ValueError for another."""
    if topic not in names():
        raise ValueError(f"topic must be one of {', '.join(names())}; got {topic!r}")
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}; got {part!r}")
    return importlib.import_module(f"{__name__}.{topic}.{part}")
