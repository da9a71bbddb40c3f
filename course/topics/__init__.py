"""The topic rooms: one package per topic, course/topics/<topic>/, each with the same parts.

Every topic has `check.py` (its exercises' cases), `exercises.py` (`EXERCISES`, the exercises it
declares, and `TOPIC`, its names elsewhere), `bench.py` (what it measures on a GPU) and `figures.py`
(what it draws from the measurements); `python -m course` finds them here, so a new topic needs no
line elsewhere.

A topic has one name: its room's, course/topics/<topic>/, which is also its results file's,
results/<device>/<topic>.json (`bench.SUITE`), and its command's, `python -m course bench <topic>`.
Notebooks, student modules and exercise ids keep the names students and gradebooks know; each room
declares them in `TOPIC` (tests/test_names.py holds the declarations against the files).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType

PARTS = ("check", "exercises", "bench", "figures")
# The notebooks that open no topic of their own, and the room that holds what they run.
NOTEBOOKS_OUTSIDE_TOPICS = {
    "00_setup_and_tour": "the tour of the course and the machine: course/core/ and the command line",
    "19_capstone": "course/capstone/: the decoder that puts every topic together",
    "20_parallel_tree_generation": "course/capstone/: the draft and the target on two GPUs",
}


@dataclass(frozen=True)
class Topic:
    """What a topic is called outside its room: its notebooks (notebooks/<name>.ipynb), its student
    modules (solutions/<module>.py and lessons/; an exercise's id is "<module>.<function>"), the
    modules of pyspec_ref/ its checks hold the kernels to and those of course/oracle/ its checks and
    benches compare with. `why` says why the topic keeps a name that is not the room's (a student
    module named otherwise, two papers in one room)."""

    notebooks: tuple[str, ...]
    students: tuple[str, ...]
    specs: tuple[str, ...]
    oracles: tuple[str, ...]
    why: str = ""


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


def declared(topic: str) -> Topic:
    """The names a topic declares (`TOPIC` of course/topics/<topic>/exercises.py)."""
    return part_of(topic, "exercises").TOPIC
