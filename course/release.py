"""Release: write the student copy `lessons/` from `solutions/`.

Every exercise region of a solution module, the lines from `### BEGIN SOLUTION`
to `### END SOLUTION`, becomes a stub that fails loudly:

    # YOUR CODE HERE: exercise trees.dfs_times (delete the todo line when you start)
    todo("trees.dfs_times")

The exercise is named after the module and the function that holds the region.

A find-the-bug exercise gives the student a defective kernel instead of a stub: its
region holds the correct code, then a `### LESSON` line, then the defective code
commented out; the lesson gets the defective lines uncommented (or nothing, for a
missing line) and no todo, so the kernel runs and the checks show the symptoms.
Everything outside the regions is copied unchanged, so a lesson module has the
same API as its solution and the checks can call either.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
LESSON = "### LESSON"
END = "### END SOLUTION"
ROOT = Path(__file__).resolve().parent.parent
HEADER = (
    "# Student copy, generated from solutions/{path} by `python -m course release`.\n"
    "# Write your code where a todo(...) line stands; everything else matches the solution.\n"
)


class ReleaseError(ValueError):
    """The solutions cannot be turned into lessons (unbalanced markers, a missing import...)."""


@dataclass(frozen=True)
class Region:
    first: int  # 0-based line index of the BEGIN marker
    last: int  # 0-based line index of the END marker
    exercise: str


def _enclosing_functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _exercise_name(module: str, functions, line_number: int, where: str) -> str:
    holders = [f for f in functions if f.lineno <= line_number <= (f.end_lineno or f.lineno)]
    if not holders:
        raise ReleaseError(f"{where}: a solution region must sit inside a function")
    innermost = max(holders, key=lambda f: f.lineno)
    return f"{module}.{innermost.name}"


def find_regions(source: str, module: str, where: str) -> list[Region]:
    """The exercise regions of one solution module, in order."""
    functions = _enclosing_functions(ast.parse(source))
    lines = source.splitlines()
    regions, opened = [], None
    for index, line in enumerate(lines):
        marker = line.strip()
        if marker.startswith(BEGIN):
            if opened is not None:
                raise ReleaseError(f"{where}:{index + 1}: {BEGIN} inside another region")
            opened = index
        elif marker.startswith(END):
            if opened is None:
                raise ReleaseError(f"{where}:{index + 1}: {END} without {BEGIN}")
            name = _exercise_name(module, functions, opened + 1, f"{where}:{opened + 1}")
            regions.append(Region(opened, index, name))
            opened = None
    if opened is not None:
        raise ReleaseError(f"{where}:{opened + 1}: {BEGIN} is never closed")
    return regions


def stub_source(source: str, module: str, where: str) -> str:
    """The lesson version of one solution module."""
    regions = find_regions(source, module, where)
    if regions and not re.search(r"^from course\.exercise import .*\btodo\b", source, re.MULTILINE):
        raise ReleaseError(f"{where}: has exercise regions, so it must import todo from course.exercise")
    lines = source.splitlines(keepends=True)
    out, cursor = [], 0
    for region in regions:
        out.extend(lines[cursor : region.first])
        cursor = region.last + 1
        body = lines[region.first + 1 : region.last]
        bug = [index for index, line in enumerate(body) if line.strip() == LESSON]
        if bug:
            out.extend(_uncomment(line) for line in body[bug[0] + 1 :])
            continue
        indent = lines[region.first][: len(lines[region.first]) - len(lines[region.first].lstrip())]
        out.append(f"{indent}# YOUR CODE HERE: exercise {region.exercise} "
                   "(delete the todo line when you start)\n")
        out.append(f'{indent}todo("{region.exercise}")\n')
    out.extend(lines[cursor:])
    return "".join(out)


def _uncomment(line: str) -> str:
    """'    # x = 1' -> '    x = 1': a defective line of a find-the-bug region."""
    stripped = line.lstrip()
    indent = line[: len(line) - len(stripped)]
    return indent + stripped.removeprefix("# ").removeprefix("#")


def _check_relative_imports(source: str, where: str) -> None:
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        if any(name == "solutions" or name.startswith("solutions.") for name in names):
            raise ReleaseError(
                f"{where}: imports solutions absolutely; use a relative import so that the lesson "
                "copy imports its own siblings"
            )


def render(solutions: Path) -> dict[Path, bytes]:
    """Every file of the lessons tree, by relative path, as the release would write it."""
    files = {}
    for path in sorted(solutions.rglob("*")):
        relative = path.relative_to(solutions)
        if path.is_dir() or "__pycache__" in relative.parts:
            continue
        if path.suffix != ".py":
            files[relative] = path.read_bytes()
            continue
        source = path.read_text()
        where = f"solutions/{relative.as_posix()}"
        _check_relative_imports(source, where)
        module = ".".join(relative.with_suffix("").parts)
        body = stub_source(source, module, where)
        files[relative] = (HEADER.format(path=relative.as_posix()) + body).encode()
    return files


def differences(solutions: Path = ROOT / "solutions", lessons: Path = ROOT / "lessons") -> list[str]:
    """Paths where lessons/ is not what a fresh release would write ([] when in sync)."""
    expected = render(solutions)
    present = {
        p.relative_to(lessons)
        for p in lessons.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    problems = [f"missing: lessons/{p.as_posix()}" for p in sorted(set(expected) - present)]
    problems += [f"not in solutions: lessons/{p.as_posix()}" for p in sorted(present - set(expected))]
    problems += [
        f"differs: lessons/{p.as_posix()}"
        for p in sorted(set(expected) & present)
        if (lessons / p).read_bytes() != expected[p]
    ]
    return problems


def release(solutions: Path = ROOT / "solutions", lessons: Path = ROOT / "lessons") -> list[Path]:
    """Rewrite lessons/ from solutions/; returns the files written."""
    files = render(solutions)
    if lessons.exists():
        shutil.rmtree(lessons)
    for relative, content in files.items():
        target = lessons / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return sorted(files)



def edited_exercises(solutions: Path = ROOT / "solutions", lessons: Path = ROOT / "lessons") -> list[str]:
    """Exercises whose todo line is gone from lessons/: a student's work that a release would erase."""
    edited = []
    for relative, content in render(solutions).items():
        target = lessons / relative
        if relative.suffix != ".py" or not target.exists():
            continue
        present = target.read_text()
        for line in content.decode().splitlines():
            if line.strip().startswith('todo("') and line.strip() not in present:
                edited.append(line.strip()[len('todo("'):-2])
    return edited
