"""The region model: how a solution marks the code a student writes, and what a lesson puts there.

A solution module marks each exercise region with `### BEGIN SOLUTION` and `### END SOLUTION`
(a find-the-bug region also holds `### LESSON`, then the defect, commented out). A `Region` is one
such span; a `Hole` is the lines of a lesson that stand for an open exercise's answer (a region of
its own module, or an earlier rung's answer it inherits); a `Piece` is a run of a lesson's lines,
copied from the solution or standing in a hole. The release writes lessons from these
(`course.release`), grading finds a student's code in the holes (`course.grading.splice`), and the
notebooks show the answers between the markers (`course.answers`). `ROOT` is the repository
whose solutions/ and lessons/ these regions live in.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "### BEGIN SOLUTION"
LESSON = "### LESSON"
END = "### END SOLUTION"
# A todo(...) line of a lesson; group 1 is the exercise it names.
TODO_LINE = re.compile(r'^\s*todo\("([\w.]+)"')


class ReleaseError(ValueError):
    """The solutions cannot be turned into lessons (unbalanced markers, a missing import...)."""


@dataclass(frozen=True)
class Region:
    first: int  # 0-based line index of the BEGIN marker
    last: int  # 0-based line index of the END marker
    exercise: str
    number: int = 1  # its place among its exercise's regions, counted from 1 as the notebooks count


@dataclass(frozen=True)
class Hole:
    """Lines of a lesson that hold an open exercise's answer, and what the todo(...) there says."""
    first: int  # 0-based first line replaced (a BEGIN marker for the module's own region)
    last: int  # 0-based last line replaced
    region: Region  # whose answer the lines are: a region of this module or of a rung it builds on
    module: str  # the module that holds `region`
    lines: int  # lines of code it replaces
    defines: tuple[str, ...]  # names it assigns that the code after it reads


def functions_of(tree: ast.AST) -> list[ast.FunctionDef]:
    """Every function of a syntax tree, nested ones too."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def innermost(functions, line_number: int):
    """The innermost of `functions` whose lines hold `line_number` (1-based), or None."""
    holders = [f for f in functions if f.lineno <= line_number <= (f.end_lineno or f.lineno)]
    return max(holders, key=lambda f: f.lineno) if holders else None


def _exercise_name(module: str, functions, line_number: int, where: str) -> str:
    holder = innermost(functions, line_number)
    if holder is None:
        raise ReleaseError(f"{where}: a solution region must sit inside a function")
    return f"{module}.{holder.name}"


def _named_exercise(marker: str, module: str, where: str) -> str | None:
    """The exercise a region names after its marker, as in `### BEGIN SOLUTION (deft.deft_node_kernel)`:
    the region of a helper that two kernels call belongs to the exercise of the kernel the
    notebook introduces it with. None for a plain marker (the enclosing function names it)."""
    named = marker[len(BEGIN):].strip()
    if not named:
        return None
    match = re.fullmatch(r"\((\w+)\.(\w+)\)", named)
    if match is None or match.group(1) != module:
        raise ReleaseError(f"{where}: a region names its exercise as ({module}.<function>), got {named!r}")
    return f"{module}.{match.group(2)}"


def find_regions(source: str, module: str, where: str) -> list[Region]:
    """The exercise regions of one solution module, in order."""
    functions = functions_of(ast.parse(source))
    lines = source.splitlines()
    regions, opened, counts = [], None, {}
    for index, line in enumerate(lines):
        marker = line.strip()
        if marker.startswith(BEGIN):
            if opened is not None:
                raise ReleaseError(f"{where}:{index + 1}: {BEGIN} inside another region")
            opened = index
        elif marker.startswith(END):
            if opened is None:
                raise ReleaseError(f"{where}:{index + 1}: {END} without {BEGIN}")
            name = (_named_exercise(lines[opened].strip(), module, f"{where}:{opened + 1}")
                    or _exercise_name(module, functions, opened + 1, f"{where}:{opened + 1}"))
            counts[name] = counts.get(name, 0) + 1
            regions.append(Region(opened, index, name, counts[name]))
            opened = None
    if opened is not None:
        raise ReleaseError(f"{where}:{opened + 1}: {BEGIN} is never closed")
    return regions


def region_functions(source: str, module: str, where: str) -> dict[str, tuple[str, ...]]:
    """Exercise -> the names of the functions that hold its regions, in order (a helper's region
    that names another exercise counts for that exercise)."""
    functions = functions_of(ast.parse(source))
    holders: dict[str, dict[str, None]] = {}
    for region in find_regions(source, module, where):
        holders.setdefault(region.exercise, {})[innermost(functions, region.first + 1).name] = None
    return {exercise: tuple(names) for exercise, names in holders.items()}


def is_code(line: str) -> bool:
    """A line that is neither blank nor a comment."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def bug_part(lines: list[str], region: Region) -> int | None:
    """Index of a find-the-bug region's `### LESSON` line, or None for an ordinary region."""
    return next((i for i in range(region.first + 1, region.last) if lines[i].strip() == LESSON), None)


@dataclass(frozen=True)
class Piece:
    """A run of a lesson's lines: copied from the solution (`hole` None), or what stands in a hole
    (its stub, or a find-the-bug region's defective lines). Grading lines a student's file up with
    these to find what the student wrote in each hole (`course.grading.splice`)."""
    lines: tuple[str, ...]
    hole: Hole | None = None


def lesson_text(pieces: list[Piece]) -> str:
    """A lesson module's text from its pieces."""
    return "".join(line for piece in pieces for line in piece.lines)



def is_marker(line: str) -> bool:
    """A line that marks a region (BEGIN, END or a find-the-bug region's LESSON), not code."""
    return line.strip().startswith((BEGIN, END, LESSON))


def marked_lines(source: str) -> str:
    """The regions of a function's source, markers included, separated by '...': the answer's lines."""
    kept, inside = [], False
    for line in source.splitlines():
        inside = inside or line.strip().startswith(BEGIN)
        if inside:
            kept.append(line)
        if line.strip().startswith(END):
            inside = False
            kept.append("...")
    return "\n".join(kept[:-1])
