"""The house keeps its shape: every topic has its check, bench and figures under one contract,
every exercise belongs to a topic, and the README's map names every room and module."""

import inspect
import re
from pathlib import Path

import pytest

from course.exercises import EXERCISES
from course.measure import benchcli

ROOT = Path(__file__).resolve().parent.parent
TOPICS = ["attention", "deft", "kvcache", "ladder", "sampling", "trees", "triton_attention", "verification"]
PARTS = ("check", "bench", "figures")


def test_the_topics_are_the_courses():
    assert benchcli.topics() == TOPICS


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_has_its_check_bench_and_figures(topic):
    folder = ROOT / "course" / "topics" / topic
    assert (folder / "__init__.py").read_text() == ""  # a room, not a module of its own
    missing = [f"{part}.py" for part in PARTS if not (folder / f"{part}.py").is_file()]
    assert not missing, f"course/topics/{topic}/ lacks {missing}"


@pytest.mark.parametrize("room", list(benchcli.rooms()))
def test_every_bench_and_figures_follow_the_contract(room):
    bench = benchcli.part_of(room, "bench")
    assert isinstance(bench.SUITE, str) and bench.SUITE
    assert bench.SECTIONS and all(callable(rows) for rows in bench.SECTIONS.values())
    assert callable(bench.section_of)
    assert not hasattr(bench, "main")  # one command line: python -m course bench
    figures = benchcli.part_of(room, "figures")
    assert figures.FIGURES and all(callable(draw) for draw in figures.FIGURES.values())
    assert "savefig" not in inspect.getsource(bench) + inspect.getsource(figures)  # benchcli writes PNGs


def test_every_exercise_belongs_to_a_topic():
    topic_of = {f"course.topics.{topic}.check": topic for topic in TOPICS}
    homeless = [e.id for e in EXERCISES.values() if e.cases.__module__ not in topic_of]
    assert not homeless, f"exercises whose cases are in no course/topics/<topic>/check.py: {homeless}"
    served = {topic_of[e.cases.__module__] for e in EXERCISES.values()}
    assert served == set(TOPICS), f"topics with no exercise: {sorted(set(TOPICS) - served)}"


def _house_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## The house")
    return readme[start:readme.index("\n## ", start + 1)]


def test_the_readme_maps_every_room_and_module():
    section = _house_section()
    course = ROOT / "course"
    rooms = [p.name for p in course.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert [room for room in rooms if f"{room}/" not in section] == []
    assert [topic for topic in TOPICS if f"`{topic}`" not in section] == []
    modules = [p for p in course.rglob("*.py") if p.name != "__init__.py"
               and p.relative_to(course).parts[0] not in ("capstone", "grading")
               and not (p.parent.parent.name == "topics" and p.stem in PARTS)]
    unnamed = [str(p.relative_to(ROOT)) for p in modules
               if not re.search(rf"\b{re.escape(p.name)}\b", section)]
    assert not unnamed, f"the README's house section does not name {unnamed}"
