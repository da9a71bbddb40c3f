"""The house keeps its shape: every topic (a folder of course/topics/) has its check, exercises, bench
and figures under one contract, every exercise belongs to the topic that declares it, the README's
map names every room and module, and no import of course/ runs up the house."""

import ast
import inspect
import re
from pathlib import Path

import pytest

from course import benchcli, topics
from course.registry import EXERCISES

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "course"
# The topics are the folders of course/topics/: a new folder is a new topic, and it must be whole.
TOPICS = sorted(p.name for p in (COURSE / "topics").iterdir() if p.is_dir() and p.name != "__pycache__")

# The rooms of course/, from the ground up: a room may import only the rooms below it (and itself).
# A folder is one room; a module at the top of course/ is named with the room it belongs to.
HOUSE = (
    ("core", ("core/",)),
    ("oracle", ("oracle/",)),
    ("checks", ("checks/",)),
    ("measure", ("measure/",)),
    ("topics", ("topics/",)),
    ("registry", ("registry.py", "progress.py")),
    ("release", ("release.py", "answers.py")),
    ("grading", ("grading/",)),
    ("capstone", ("capstone/",)),
    ("the command line", ("__init__.py", "__main__.py", "benchcli.py", "sanitize.py", "gpu_compile.py",
                          "ptx_compile.py", "check_times.py", "carry.py")),
)


def test_the_topics_are_the_folders_of_course_topics():
    assert TOPICS, "course/topics/ holds no topic"
    assert topics.names() == TOPICS  # every folder is a package the commands find
    assert set(TOPICS) <= set(benchcli.rooms())


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_has_its_parts(topic):
    folder = COURSE / "topics" / topic
    assert (folder / "__init__.py").read_text() == ""  # a room, not a module of its own
    missing = [f"{part}.py" for part in topics.PARTS if not (folder / f"{part}.py").is_file()]
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


@pytest.mark.parametrize("topic", TOPICS)
def test_every_topic_declares_its_exercises_with_its_own_cases(topic):
    declared = topics.part_of(topic, "exercises").EXERCISES
    assert declared, f"course/topics/{topic}/exercises.py declares no exercise"
    for exercise in declared:
        assert exercise.cases.__module__ == f"course.topics.{topic}.check", \
            f"{exercise.id}: its cases are not in course/topics/{topic}/check.py"
        assert EXERCISES[exercise.id].topic == topic
        if exercise.timed:  # grading asks this topic's bench what to time
            assert callable(getattr(topics.part_of(topic, "bench"), "grading_kernels", None)), \
                f"{exercise.id} is timed, and course/topics/{topic}/bench.py has no grading_kernels"


def test_the_table_is_what_the_topics_declare():
    declared = [e.id for topic in TOPICS for e in topics.part_of(topic, "exercises").EXERCISES]
    assert sorted(declared) == sorted(EXERCISES)
    assert len(declared) == len(set(declared))


def _house_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## The house")
    return readme[start:readme.index("\n## ", start + 1)]


def test_the_readme_maps_every_room_and_module():
    section = _house_section()
    rooms = [p.name for p in COURSE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert [room for room in rooms if f"{room}/" not in section] == []
    assert [topic for topic in TOPICS if f"`{topic}`" not in section] == []
    modules = [p for p in COURSE.rglob("*.py") if p.name != "__init__.py"
               and not (p.parent.parent.name == "topics" and p.stem in topics.PARTS)]
    unnamed = [str(p.relative_to(ROOT)) for p in modules
               if not re.search(rf"\b{re.escape(p.name)}\b", section)]
    assert not unnamed, f"the README's house section does not name {unnamed}"


# ------------------------------------------------------------------------------------ the imports

def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module of course/) of every import in a file, at any depth (a function's imports too);
    `from a import b` counts as importing a.b where that is a module. The bare package `course`
    is left out: it is the package's face, and importing any module of course/ runs it."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(above + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append((node.lineno, target if _is_module(target) else base))
    return [(line, module) for line, module in found if module.startswith("course.")]


def room_of(module: str) -> str:
    """The room of HOUSE that holds a module of course/ (a KeyError names one that no room holds)."""
    relative = module.split(".")[1:]
    for room, places in HOUSE:
        for place in places:
            if place.endswith("/") and relative[0] == place[:-1]:
                return room
            if len(relative) == 1 and place == f"{relative[0]}.py":
                return room
    raise KeyError(f"course.{'.'.join(relative)} is in no room of HOUSE: place it there")


def arrows() -> dict[tuple[str, str], list[str]]:
    """(room, room it imports) -> where, for every import between two rooms."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(COURSE.rglob("*.py")):
        module = _module_name(path)
        here = "the command line" if module == "course" else room_of(module)
        for line, target in imports_of(path):
            there = room_of(target)
            if there != here:
                where = f"{path.relative_to(ROOT)}:{line} imports {target}"
                found.setdefault((here, there), []).append(where)
    return found


def test_every_module_of_course_has_a_room():
    placed = [_module_name(p) for p in COURSE.rglob("*.py") if p.name != "__init__.py" or p.parent != COURSE]
    assert [m for m in placed if not _has_room(m)] == []


def _has_room(module: str) -> bool:
    try:
        room_of(module)
    except KeyError:
        return False
    return True


def test_no_import_runs_up_the_house():
    floor = {room: index for index, (room, _) in enumerate(HOUSE)}
    upward = [where for (here, there), places in arrows().items() if floor[there] > floor[here]
              for where in places]
    assert not upward, "imports that run up the house:\n" + "\n".join(upward)


def test_the_rooms_import_each_other_in_no_circle():
    """Implied by the test above for the rooms of HOUSE, and checked here on the graph itself, so that a
    circle shows as one, whatever the order written above."""
    graph: dict[str, set[str]] = {}
    for here, there in arrows():
        graph.setdefault(here, set()).add(there)
    done, path = set(), []

    def visit(room: str) -> list[str] | None:
        if room in path:
            return path[path.index(room):] + [room]
        if room in done:
            return None
        path.append(room)
        for there in sorted(graph.get(room, ())):
            circle = visit(there)
            if circle:
                return circle
        path.pop()
        done.add(room)
        return None

    circles = [circle for room in sorted(graph) if (circle := visit(room))]
    assert not circles, f"rooms that import each other in a circle: {' -> '.join(circles[0])}"


def test_the_import_reader_sees_what_it_must():
    """The reader of imports finds relative, nested and `from package import module` imports."""
    found = dict((module, line) for line, module in imports_of(COURSE / "answers.py"))
    assert "course.registry" in found and "course.core.regions" in found
    assert room_of("course.topics.ladder.bench") == "topics" and room_of("course.core.stubs") == "core"
    assert room_of("course.registry") == "registry"
    with pytest.raises(KeyError, match="in no room"):
        room_of("course.nowhere")
