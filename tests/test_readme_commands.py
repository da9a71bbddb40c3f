"""The READMEs, the notebooks and the course's own code name only commands that exist: every
`python -m X` of README.md, of the results READMEs, of the notebooks and of course/'s docstrings,
comments and messages runs a module that resolves, every `python -m course <verb>`
a verb of the course's command line, and every `python -m course bench|figures <topic>` a room that
has a bench."""

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course import benchcli
from course.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
READMES = [ROOT / "README.md", *sorted((ROOT / "results").rglob("README.md"))]
TEXTS = READMES + sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "course").rglob("*.py"))
# `python -m module [word [word]]` on one line; a word is what a command's next argument can be.
COMMAND = re.compile(r"python3? -m ([A-Za-z_][\w.]*)((?:[ \t]+[\w<>-]+){0,2})")


def commands() -> list[tuple[str, str, list[str]]]:
    """(file, module, the words after it) of every `python -m` in the READMEs, notebooks and course/."""
    found = []
    for text in TEXTS:
        for match in COMMAND.finditer(text.read_text()):
            found.append((str(text.relative_to(ROOT)), match.group(1), match.group(2).split()))
    return found


def verbs() -> set[str]:
    """The verbs of `python -m course`, as its --help lists them ({info,list,...})."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    listed = re.search(r"\{([\w,-]+)\}", out.getvalue())
    assert listed, out.getvalue()
    return set(listed.group(1).split(","))


def test_the_texts_have_commands_to_check():
    assert len(READMES) >= 3 and len(TEXTS) > 20
    named = {module for _, module, _ in commands()}
    assert {"course", "course.capstone.train"} <= named
    assert any(text.startswith("course/") for text, _, _ in commands())  # the code's own texts are read


def test_every_module_resolves():
    missing = sorted({(text, module) for text, module, _ in commands()
                      if importlib.util.find_spec(module) is None})
    assert not missing, f"python -m of a module that does not exist: {missing}"


def test_every_course_verb_and_bench_topic_exists():
    known, rooms = verbs(), set(benchcli.rooms())
    wrong = []
    for text, module, words in commands():
        if module != "course" or not words or words[0].startswith(("-", "<")):
            continue
        verb = words[0]
        if verb not in known:
            wrong.append((text, f"python -m course {verb}"))
        elif verb in ("bench", "figures") and len(words) > 1 and not words[1].startswith(("-", "<")):
            if words[1] not in rooms:
                wrong.append((text, f"python -m course {verb} {words[1]}"))
    assert not wrong, f"commands that do not exist (verbs: {sorted(known)}; rooms: {sorted(rooms)}): {wrong}"


def test_the_check_sees_a_wrong_command():
    """The pattern finds what a stale line would hold."""
    stale = "run `python -m course.deft_bench --rep-ms 50`, then `python -m course figures deft`"
    found = COMMAND.findall(stale)
    assert [(m, w.split()) for m, w in found] == [("course.deft_bench", ["--rep-ms", "50"]),
                                                  ("course", ["figures", "deft"])]
    assert importlib.util.find_spec("course.deft_bench") is None


# `course.x.y` between backticks: a module of the course, or a name in one.
NAMED = re.compile(r"`(course(?:\.\w+)+)`")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module, not a package: no module below it
        return False


def _resolves(dotted: str) -> bool:
    """Whether the longest importable module that starts `dotted` holds the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        if not _is_module(".".join(parts[:cut])):
            continue
        held = importlib.import_module(".".join(parts[:cut]))
        for attribute in parts[cut:]:
            if not hasattr(held, attribute):
                return False
            held = getattr(held, attribute)
        return True
    return False


def test_every_named_module_of_the_course_exists():
    named = {(str(text.relative_to(ROOT)), name) for text in READMES + sorted((ROOT / "course").rglob("*.py"))
             for name in NAMED.findall(text.read_text())}
    assert len(named) > 50
    missing = sorted((text, name) for text, name in named if not _resolves(name))
    assert not missing, f"texts that name a module or name the course does not have: {missing}"
    assert not _resolves("course.ladder") and _resolves("course.topics.ladder.rungs.builds_on")
