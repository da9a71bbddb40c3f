"""The ladder's lessons: rung k's stub is rung k-1's kernel with holes exactly where rung k changes it.

A student who skipped a rung can do the next one, and no hole hides code that did not
change (nor does any change sit outside a hole, given away).
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import pytest

from course.release import BEGIN, END
from course.topics.ladder.rungs import edits

KERNEL = "tree_attention_kernel"  # every rung's kernel has this name (built per head dimension)
SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"


def kernel_lines(module: str) -> tuple[list[str], list[bool]]:
    """The lines of a rung's kernel without markers, and whether each sits in a region."""
    source = (SOLUTIONS / f"{module}.py").read_text()
    kernel = next(node for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.FunctionDef) and node.name == KERNEL)
    lines, in_region, inside = [], [], False
    for line in source.splitlines()[kernel.lineno - 1 : kernel.end_lineno]:
        if line.strip().startswith(BEGIN):
            inside = True
        elif line.strip().startswith(END):
            inside = False
        else:
            lines.append(line)
            in_region.append(inside)
    return lines, in_region


def uncovered_changes(previous: str, current: str) -> list[str]:
    """Lines of `current` that differ from `previous` but sit outside a region, and
    regions of `current` that hold no change at all. (Lines that `current` deletes give
    nothing away: the lesson simply lacks them.)"""
    old, _ = kernel_lines(previous)
    new, in_region = kernel_lines(current)
    changed = [False] * len(new)
    problems = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        for j in range(j1, j2):
            changed[j] = True
            # The kernel's signature is the launcher's business, and the launcher is given.
            if not in_region[j] and not new[j].strip().startswith("def "):
                problems.append(f"{current}: changed line outside a region: {new[j].strip()!r}")
    region_changed, region_start = False, None
    for j, inside in enumerate([*in_region, False]):
        if inside and region_start is None:
            region_start, region_changed = j, False
        if inside:
            region_changed |= changed[j]
        elif region_start is not None:
            if not region_changed:
                problems.append(f"{current}: a region without a change: {new[region_start].strip()!r}")
            region_start = None
    return problems


@pytest.mark.parametrize("previous, current", edits())
def test_each_lesson_is_the_previous_rung_with_holes(previous, current):
    assert uncovered_changes(previous, current) == []
