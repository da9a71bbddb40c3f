"""One name per topic: the room course/topics/<topic>/ names its results file and its command, and
declares (`TOPIC` in its exercises.py) its notebooks, student modules, specification and oracle.
These tests hold the declarations against the files, so that a renamed file fails here."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from course import benchcli, topics
from course.capstone import bench as capstone_bench
from course.capstone import parallel_bench, step_profile
from course.registry import EXERCISES

ROOT = Path(__file__).resolve().parent.parent
TOPICS = topics.names()
DECLARED = {topic: topics.declared(topic) for topic in TOPICS}
# The results files that are not a topic's: the capstone's (notebooks 19-21, with notebook 20's
# measurements by tools/*.py: `queued_rounds.py`, `side_spans.py`, `queued_timeline.py`) and the
# simulator's times of the checks (`python -m course.check_times`).
SUITES_OUTSIDE_TOPICS = {capstone_bench.SUITE, step_profile.SUITE, parallel_bench.SUITE, "queued_rounds",
                         "side_spans", "queued_timeline", "check_times"}


def _stems(folder: str, suffix: str) -> set[str]:
    return {p.stem for p in (ROOT / folder).glob(f"*{suffix}") if not p.name.startswith("_")} - {"__init__"}


def test_every_topic_declares_its_names():
    for topic, names in DECLARED.items():
        assert isinstance(names, topics.Topic), f"course/topics/{topic}/exercises.py: TOPIC is not a Topic"
        assert names.notebooks and names.students and names.specs and names.oracles, topic


def test_every_notebook_belongs_to_exactly_one_room():
    owners: dict[str, list[str]] = {}
    for topic, names in DECLARED.items():
        for notebook in names.notebooks:
            owners.setdefault(notebook, []).append(topic)
    for notebook in topics.NOTEBOOKS_OUTSIDE_TOPICS:
        owners.setdefault(notebook, []).append("outside the topics")
    on_disk = _stems("notebooks", ".ipynb")
    assert sorted(set(owners) - on_disk) == [], "declared notebooks that do not exist"
    assert sorted(on_disk - set(owners)) == [], "notebooks no room declares"
    assert {n: rooms for n, rooms in owners.items() if len(rooms) > 1} == {}


def test_every_student_module_belongs_to_exactly_one_room():
    declared = [module for names in DECLARED.values() for module in names.students]
    assert len(declared) == len(set(declared)), "a student module declared by two rooms"
    assert sorted(declared) == sorted(_stems("solutions", ".py"))
    assert sorted(declared) == sorted(_stems("lessons", ".py"))


@pytest.mark.parametrize("topic", TOPICS)
def test_every_exercise_is_named_by_a_module_and_notebook_of_its_room(topic):
    names = DECLARED[topic]
    for exercise in EXERCISES.values():
        if exercise.topic != topic:
            continue
        assert exercise.module in names.students, f"{exercise.id}: {exercise.module} is not {topic}'s"
        assert exercise.notebook in names.notebooks, f"{exercise.id}: {exercise.notebook} is not {topic}'s"


@pytest.mark.parametrize("topic", TOPICS)
def test_a_name_other_than_the_rooms_says_why(topic):
    names = DECLARED[topic]
    elsewhere = [module for module in names.students if not module.startswith(topic)]
    assert not elsewhere or len(names.why) > 40, \
        f"course/topics/{topic}/exercises.py: student modules {elsewhere} are named otherwise; say why"


def test_every_spec_and_oracle_module_named_exists_and_is_someones():
    specs = {module for names in DECLARED.values() for module in names.specs}
    oracles = {module for names in DECLARED.values() for module in names.oracles}
    missing = [m for m in sorted(specs | oracles) if importlib.util.find_spec(m) is None]
    assert missing == []
    assert all(m.startswith("pyspec_ref.") for m in specs)
    assert all(m == "course.oracle" or m.startswith("course.oracle.") for m in oracles)
    # pyspec_ref.parallel_tree is the capstone's (notebook 20): its draft tree across rounds.
    assert sorted(_stems("pyspec_ref", ".py") - {"parallel_tree"}) == sorted(m.split(".")[1] for m in specs)
    submodules = [m.split(".")[2] for m in oracles if m != "course.oracle"]
    assert sorted(_stems("course/oracle", ".py")) == sorted(submodules)


@pytest.mark.parametrize("topic", TOPICS)
def test_a_topics_results_file_and_command_are_named_after_its_room(topic):
    assert benchcli.part_of(topic, "bench").SUITE == topic


def test_every_results_file_is_named_after_its_room():
    found = sorted((ROOT / "results").glob("*/*.json"))
    assert found
    for path in found:
        suite = json.loads(path.read_text())["suite"]
        assert suite == path.stem, f"{path.relative_to(ROOT)} holds suite {suite!r}"
        assert path.stem in TOPICS or path.stem in SUITES_OUTSIDE_TOPICS, \
            f"{path.relative_to(ROOT)} is named after no room"


def test_the_readme_lists_each_topics_notebooks_and_modules():
    readme = (ROOT / "README.md").read_text()
    for topic, names in DECLARED.items():
        row = re.search(rf"^\| `{topic}` \|(.*)$", readme, re.MULTILINE)
        assert row, f"the README's table of topics has no row for {topic}"
        # The ladder's notebooks and rungs are written as ranges (03–11c, ladder_k1 … ladder_k11).
        numbers = [] if topic == "ladder" else [notebook.split("_")[0] for notebook in names.notebooks]
        modules = [module for module in names.students if not module.startswith("ladder_k")]
        absent = [n for n in numbers if n not in row.group(1)]
        absent += [m for m in modules if f"`{m}`" not in row.group(1)]
        assert absent == [], f"the README's row of {topic} lacks {absent}"
