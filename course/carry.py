"""Carrying a rung forward: a rung's lesson filled with your own code of the rung it builds on.

A rung's kernel is the previous rung's with a few changes (`rungs`), so its lesson has two kinds of
holes: this rung's own (`# YOUR CODE HERE`) and the lines it keeps of the earlier rungs' answers
(`# COPY FROM YOUR lessons/ladder_k3.py`). Carrying fills the second kind from your previous rung's
file, so the lesson you open reads as one kernel with only this rung's holes:

    python -m course carry ladder_k4

It runs by itself when the previous rung's check passes and the next lesson is still as released.

How your lines are found: grading's line-up (`course.grading.splice.written_holes`) gives what you
wrote in each run of holes of your previous rung's lesson. Inside such a run, the lines this rung
keeps are told apart from the lines it changes by the code lines of ours that stand around them:
where yours read the same, the lines between are yours to carry. Where they do not (you wrote that
part your own way), the hole keeps its todo line and carrying says so: copy that part by hand. Only
your code is carried; ours only marks where it stands, and a hand-out, which has no solutions/,
cannot carry at all (it says so).

Carrying never overwrites your work: a hole of this rung that no longer holds its todo line is left
as you wrote it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from course.core.regions import ROOT, TODO_LINE, Hole, Piece, lesson_text
from course.core.regions import is_code as _is_code
from course.grading.splice import Segment, written_holes
from course.release import kept_lines, lesson_header, lesson_pieces
from course.topics.ladder.rungs import builds_on, rung_of

# A stub's comment, which a student may keep above their code: never carried.
STUB_COMMENT = re.compile(r"^\s*# (YOUR CODE HERE: exercise |COPY FROM YOUR )")


class CarryError(ValueError):
    """Nothing can be carried (an unknown rung, a previous rung still holding stubs, no solutions/)."""


@dataclass(frozen=True)
class Unit:
    """Adjacent holes of a rung's lesson that keep earlier answers, and where those lines stand in
    the previous rung: in its lesson's group of holes `group` (_groups), code lines `first`..`last`
    of ours."""
    holes: tuple[Hole, ...]
    group: int
    first: int
    last: int
    shift: int  # columns to indent the lines by: the rung may hold them deeper than the previous one
    # Our comments just above these lines in the previous rung that this rung moves or drops: the
    # student's copies of them are not carried.
    moved: frozenset[str] = frozenset()

    def describe(self) -> str:
        return " and ".join(dict.fromkeys(f"region {hole.region.number} of {hole.region.exercise}"
                                          for hole in self.holes))


@dataclass(frozen=True)
class Plan:
    """What carrying `base` into `module` needs: both lessons as released, the code lines of ours in
    each group of holes of the base lesson (where the student's lines stand), and the units to fill."""
    module: str
    base: str
    base_pieces: list[Piece]
    pieces: list[Piece]
    ours: list[list[str]]  # per group of runs of holes of the base lesson (_groups): our code lines there
    groups: list[range]
    units: list[Unit]
    unplaced: list[tuple[Hole, ...]]  # holes whose lines the previous rung does not hold in one piece


@dataclass
class Outcome:
    """What carrying did: the lesson's new text and, by description, the parts filled, the parts the
    student had written already, and the parts left to copy by hand."""
    text: str  # the rung's lesson, carried
    carried: list[str]
    kept: list[str]  # holes the student has already written: left alone
    by_hand: list[str]  # holes whose lines could not be told apart: copy them by hand

    def report(self, module: str) -> str:
        base = builds_on()[module]
        lines = [f"carried your lessons/{base}.py into lessons/{module}.py: {len(self.carried)} "
                 f"part{'s' * (len(self.carried) != 1)} filled"
                 + (f" ({'; '.join(dict.fromkeys(self.carried))})" if self.carried else "")]
        if self.kept:
            lines.append("already written, left as they are: " + "; ".join(dict.fromkeys(self.kept)))
        if self.by_hand:
            lines.append(f"copy by hand from lessons/{base}.py (your code there is not laid out as the "
                         "lines this rung keeps): " + "; ".join(dict.fromkeys(self.by_hand)))
        return "\n".join(lines)


def _runs(pieces: list[Piece]) -> list[list[Hole]]:
    """The holes of a lesson, run by run (adjacent holes form one run, as grading lines them up)."""
    runs, previous = [], None
    for piece in pieces:
        if piece.hole is not None:
            if previous is None or previous.hole is None:
                runs.append([])
            runs[-1].append(piece.hole)
        previous = piece
    return runs


def _groups(pieces: list[Piece]) -> list[range]:
    """The runs of holes of a lesson (numbered as _runs numbers them) that only comments and blank
    lines separate: a later rung may keep their lines as one piece."""
    groups, run, open_group = [], -1, False
    for index, piece in enumerate(pieces):
        if piece.hole is not None:
            if index == 0 or pieces[index - 1].hole is None:
                run += 1
                if open_group:
                    groups[-1] = range(groups[-1].start, run + 1)
                else:
                    groups.append(range(run, run + 1))
            open_group = True
        elif any(_is_code(line) for line in piece.lines):
            open_group = False
    return groups


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _lesson(module: str, sources: Mapping[str, str], is_open: Callable[[str], bool]) -> list[Piece]:
    """The module's lesson as the release writes it, header first, as pieces."""
    pieces = lesson_pieces(sources[module], module, f"solutions/{module}.py", sources, is_open)
    return [lesson_header(Path(f"{module}.py"), module, pieces), *pieces]


def plan(module: str, sources: Mapping[str, str],
         is_open: Callable[[str], bool] = lambda exercise: True) -> Plan:
    """Where each hole of `module`'s lesson that keeps an earlier answer stands in the previous rung,
    from the solutions (`sources`: module -> solution source)."""
    base = builds_on()[module]
    base_pieces, pieces = (_lesson(name, sources, is_open) for name in (base, module))
    base_lines, lines = sources[base].splitlines(), sources[module].splitlines()
    kept = kept_lines(sources[base], sources[module])
    ours, place = [], {}  # place: base line -> (group, position among the group's code lines)
    runs = _runs(base_pieces)
    for number, group in enumerate(_groups(base_pieces)):
        first_hole, last_hole = runs[group.start][0], runs[group.stop - 1][-1]
        code = [i for i in range(first_hole.first, last_hole.last + 1) if _is_code(base_lines[i])]
        place.update({line: (number, position) for position, line in enumerate(code)})
        ours.append([base_lines[i].strip() for i in code])
    units, unplaced = [], []
    for holes in _runs(pieces):
        for hole in (h for h in holes if h.module != module):
            code = [i for i in range(hole.first, hole.last + 1) if _is_code(lines[i])]
            where = [place.get(kept.get(i, -1)) for i in code]
            if not where or None in where or len({group for group, _ in where}) != 1 \
                    or [p for _, p in where] != list(range(where[0][1], where[-1][1] + 1)):
                unplaced.append((hole,))
                continue
            group, first, last = where[0][0], where[0][1], where[-1][1]
            previous = units[-1] if units else None
            if previous is not None and previous.holes[-1] is _before(holes, hole) \
                    and previous.group == group and previous.last + 1 == first:
                units[-1] = Unit((*previous.holes, hole), group, previous.first, last, previous.shift,
                                 previous.moved)
                continue
            base_line = next(i for i, at in place.items() if at == (group, first))
            units.append(_unit(hole, group, first, last, lines, code[0], base_lines, base_line))
    return Plan(module, base, base_pieces, pieces, ours, _groups(base_pieces), units, unplaced)


def _unit(hole: Hole, group: int, first: int, last: int, lines: list[str], line: int, base_lines: list[str],
          base_line: int) -> Unit:
    """A unit of one hole whose first code line, `line` of the rung, is `base_line` of the previous one."""
    above = base_line
    while above > 0 and not _is_code(base_lines[above - 1]):
        above -= 1
    comments = {text.strip() for text in base_lines[above:base_line] if text.strip()}
    moved = comments - {text.strip() for text in lines[hole.first : hole.last + 1]}
    return Unit((hole,), group, first, last, _indent(lines[line]) - _indent(base_lines[base_line]),
                frozenset(moved))


def _before(holes: list[Hole], hole: Hole) -> Hole | None:
    """The hole just before `hole` in its run (None for the first)."""
    index = holes.index(hole)
    return holes[index - 1] if index else None


# ------------------------------------------------------------------------------------ the student's lines

def _yours(unit: Unit, ours: list[str], written: list[str]) -> list[str] | None:
    """The student's lines that stand where `unit`'s lines of ours stand, in a run of holes where the
    student wrote `written`; None when the code of ours around them is not found in theirs."""
    written = [line for line in written if not STUB_COMMENT.match(line)]
    theirs = [line.strip() if _is_code(line) else f"\0{index}" for index, line in enumerate(written)]
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    at = {block.a + k: block.b + k for block in matcher.get_matching_blocks() for k in range(block.size)}
    start = 0 if unit.first == 0 else at.get(unit.first - 1, -2) + 1
    stop = len(written) if unit.last == len(ours) - 1 else at.get(unit.last + 1)
    if start < 0 or stop is None or start >= stop:
        return None
    chosen = written[start:stop]
    while chosen and (not chosen[0].strip() or chosen[0].strip() in unit.moved):
        chosen.pop(0)
    while chosen and not _is_code(chosen[-1]):  # a comment after the last line is the next line's
        chosen.pop()
    if not any(_is_code(line) for line in chosen):
        return None
    return _shifted(chosen, unit.shift)


def _shifted(lines: list[str], shift: int) -> list[str] | None:
    if shift < 0 and any(line.strip() and not line.startswith(" " * -shift) for line in lines):
        return None
    moved = [(" " * shift + line if shift > 0 else line[-shift:]) if line.strip() else line for line in lines]
    return [line if line.endswith("\n") else line + "\n" for line in moved]


def previous_code(base_plan: Plan, base_text: str) -> list[list[str]]:
    """What the student wrote in each group of runs of holes of the previous rung's lesson (the lines
    between a group's runs too). Raises CarryError when a run cannot be found or still holds a todo
    line."""
    runs = written_holes(base_plan.base_pieces, base_text)
    for segment in runs:
        if segment.written is None:
            raise CarryError(f"lessons/{base_plan.base}.py: could not find {segment.describe()} (the lines "
                             "around it were changed or removed), so nothing was carried")
        stubbed = [TODO_LINE.match(line) for line in segment.written if TODO_LINE.match(line)]
        if stubbed:
            base, first = base_plan.base, stubbed[0].group(1)
            step = (f"write {rung_of(base)} first (its check passes)" if first.startswith(f"{base}.")
                    else f"carry its own previous rung into it first (`python -m course carry {base}`)")
            raise CarryError(f"lessons/{base}.py still holds stubs (`todo(\"{first}\", ...)`): {step}, "
                             f"then carry it into lessons/{base_plan.module}.py")
    lines = base_text.replace("\r\n", "\n").splitlines(keepends=True)
    return [lines[runs[g.start].student_first - 1 : runs[g.stop - 1].student_first - 1
                  + len(runs[g.stop - 1].written)] for g in base_plan.groups]


# ------------------------------------------------------------------------------------ the rung's lesson

def carried(rung_plan: Plan, base_text: str, text: str) -> Outcome:
    """`text` (the student's lessons/<module>.py) with each hole that keeps an earlier answer, and still
    holds its todo line, filled with the student's lines from `base_text` (their previous rung)."""
    written = previous_code(rung_plan, base_text)
    lines = text.replace("\r\n", "\n").splitlines(keepends=True)
    stubs = {piece.hole: list(piece.lines) for piece in rung_plan.pieces if piece.hole is not None}
    where = _stub_places(written_holes(rung_plan.pieces, text), stubs)
    outcome = Outcome("", [], [], [])
    left = [(where[holes[0]][0], " and ".join(_names(holes))) for holes in rung_plan.unplaced
            if holes[0] in where]  # (the student's line index, what): holes to copy by hand
    changes = []
    for unit in rung_plan.units:
        spans = [where.get(hole) for hole in unit.holes]
        if None in spans or any(a[1] != b[0] for a, b in zip(spans, spans[1:], strict=False)):
            outcome.kept.append(unit.describe())
            continue
        yours = _yours(unit, rung_plan.ours[unit.group], written[unit.group])
        if yours is None:
            left.append((spans[0][0], unit.describe()))
            continue
        changes.append((spans[0][0], spans[-1][1], yours))
        outcome.carried.append(unit.describe())
    for start, stop, yours in sorted(changes, reverse=True):
        lines[start:stop] = yours
    outcome.text = "".join(lines)
    for index, what in sorted(left):  # where its todo stands once the others are filled
        moved = sum(len(yours) - (stop - start) for start, stop, yours in changes if stop <= index)
        outcome.by_hand.append(f"{what}, at line {index + moved + 2}")
    return outcome


def _names(holes: tuple[Hole, ...]) -> list[str]:
    return [f"region {hole.region.number} of {hole.region.exercise}" for hole in holes]


def _stub_places(segments: list[Segment], stubs: dict[Hole, list[str]]) -> dict[Hole, tuple[int, int]]:
    """Hole -> the student's line indices [start, stop) where its stub still stands whole (a hole the
    student has written, or whose run could not be found, is absent)."""
    places = {}
    for segment in segments:
        if segment.written is None:
            continue
        stub = [line.rstrip() for line in segment.stub]
        matcher = difflib.SequenceMatcher(None, stub, [line.rstrip() for line in segment.written],
                                          autojunk=False)
        at = {block.a + k: block.b + k for block in matcher.get_matching_blocks() for k in range(block.size)}
        offset = 0
        for hole in segment.holes:
            size = len(stubs[hole])
            mine = [at.get(offset + k) for k in range(size)]
            if size and None not in mine and mine == list(range(mine[0], mine[0] + size)):
                begin = segment.student_first - 1 + mine[0]
                places[hole] = (begin, begin + size)
            offset += size
    return places


# ------------------------------------------------------------------------------------ the command

def _sources(root: Path) -> dict[str, str]:
    if not (root / "solutions" / "__init__.py").is_file():
        raise CarryError(
            "carrying needs the course's repository: it finds your lines by ours around them, and this "
            "copy has no solutions/ (a hand-out). Copy the lines under each `# COPY FROM YOUR` comment "
            "from your previous rung by hand")
    folder = root / "solutions"
    return {path.stem: path.read_text() for path in folder.glob("*.py")}


def carry(module: str, root: Path | None = None) -> Outcome:
    """Fill lessons/<module>.py's holes that keep earlier answers from the student's previous rung,
    in place (`root`: the course's folder, by default this one); returns what was done. Raises
    CarryError when nothing can be carried."""
    root = root or ROOT
    rungs = builds_on()
    if module not in rungs:
        raise CarryError(f"carry: module must be a ladder rung that builds on another ({', '.join(rungs)}), "
                         f"got {module!r}")
    rung_plan = plan(module, _sources(root))
    base_path, path = root / "lessons" / f"{rung_plan.base}.py", root / "lessons" / f"{module}.py"
    for needed in (base_path, path):
        if not needed.is_file():
            raise CarryError(f"carry: {needed.relative_to(root)} is missing")
    base_text = base_path.read_text()
    if base_text == lesson_text(rung_plan.base_pieces):
        raise CarryError(f"lessons/{rung_plan.base}.py is as released: write {rung_of(rung_plan.base)} "
                         f"first (its check passes), then carry it into lessons/{module}.py")
    outcome = carried(rung_plan, base_text, path.read_text())
    if outcome.carried:
        path.write_text(outcome.text)
    return outcome


def carry_after_pass(passed_module: str, root: Path | None = None) -> list[str]:
    """After a passing check of `passed_module`'s code: carry it into each rung that builds on it and
    whose lesson is still as released (never into one the student has started). Returns what to tell."""
    root, told = root or ROOT, []
    for module in (m for m, base in builds_on().items() if base == passed_module):
        path = root / "lessons" / f"{module}.py"
        try:
            rung_plan = plan(module, _sources(root))
            if not path.is_file() or path.read_text() != lesson_text(rung_plan.pieces):
                continue
            told.append(carry(module, root).report(module))
        except (ValueError, OSError):  # a check's pass stands whatever carrying meets
            continue
    return told


def check(exercise: str, **options):
    """`course.registry.check` (same options), and after a pass on your lessons/ your code carried into
    the next ladder rung's lesson while that lesson is still as released (`carry_after_pass`): what
    `course.check` in a notebook and `python -m course check` run."""
    from course.core.impl import impl_name
    from course.registry import check as check_only
    from course.registry import get

    report = check_only(exercise, **options)
    if report.passed and (options.get("impl") or impl_name()) == "lessons":
        told = carry_after_pass(get(exercise).module)
        if told and not options.get("quiet"):
            print("\n".join(told))
    return report
