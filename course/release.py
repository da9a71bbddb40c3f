"""Release: write the student copy `lessons/` from `solutions/`.

Every exercise region of a solution module, the lines from `### BEGIN SOLUTION`
to `### END SOLUTION`, becomes a stub that fails loudly and says what goes in:

    # YOUR CODE HERE: exercise ladder_k4.tree_attention_kernel, region 4 (delete the todo line ...)
    todo("ladder_k4.tree_attention_kernel", region=4, lines=6, defines="key")

Regions are numbered per exercise, from 1, in the order the notebooks list them; `lines`
counts the region's lines of code and `defines` names what it assigns that the code after
it reads. The exercise is named after the module and the function that holds the region, or
by the marker itself, `### BEGIN SOLUTION (module.function)`, for a helper that two kernels
share and whose region belongs to the exercise of the kernel a notebook introduces it with.

A ladder rung's kernel is the previous rung's with a few changes (`course.topics.ladder.rungs`), so outside
its own regions it holds the earlier rungs' answers. Those lines become stubs too, naming the
earlier rung's exercise and region: the student pastes their own code there. A release can
leave an exercise's regions filled instead (`solved`), so that a hand-out may give a later
rung with an earlier, closed one finished.

A find-the-bug exercise gives the student a defective kernel instead of a stub: its
region holds the correct code, then a `### LESSON` line, then the defective code
commented out; the lesson gets the defective lines uncommented (or nothing, for a
missing line) and no todo, so the kernel runs and the checks show the symptoms.
Everything outside the regions is copied unchanged, so a lesson module has the
same API as its solution and the checks can call either.

`handout(folder)` writes what an instructor hands out: the repository without
`solutions/` and `tests/`, with fresh stubs in `lessons/`, and notebooks that need
no solutions (see `handout_notebook`); `through` and `solved` pick the notebooks and
the exercises that come finished.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from course.checks import barriers
from course.core.regions import (
    BEGIN,
    END,
    LESSON,
    ROOT,
    TODO_LINE,
    Hole,
    Piece,
    Region,
    ReleaseError,
    bug_part,
    find_regions,
    functions_of,
    innermost,
    is_code,
    lesson_text,
)
from course.registry import EXERCISES, notebook_number
from course.topics.ladder.rungs import builds_on

HEADER = (
    "# Student copy, generated from solutions/{path} by `python -m course release`.\n"
    "# Write your code where a todo(...) line stands; everything else matches the solution.\n"
)
# Above a rung's lesson that keeps earlier rungs' answers (`course.carry` fills them;
# a hand-out, which has no solutions/ to find the student's lines by, cannot).
CARRY_HEADER = (
    "# The lines under `# COPY FROM YOUR lessons/{base}.py` hold your own {rung}'s code: run\n"
    "# `python -m course carry {module}` (or pass {rung}'s check) to fill {rung}'s parts\n"
    "# (in a hand-out, which cannot carry, copy them from your lessons/{base}.py).\n"
)


def _defines(tree: ast.AST, first: int, last: int) -> tuple[str, ...]:
    """Names assigned on lines first..last (0-based) that the enclosing function reads after them
    before assigning them again, in the order they are assigned: what the code after a hole needs."""
    function = innermost(functions_of(tree), first + 1)
    names = [n for n in ast.walk(function) if isinstance(n, ast.Name)] if function is not None else []
    assigned = sorted((n.lineno, n.col_offset, n.id) for n in names
                      if isinstance(n.ctx, ast.Store) and first < n.lineno <= last + 1)
    # On one line the right-hand side is read before the left is assigned.
    later = sorted((n for n in names if n.lineno > last + 1),
                   key=lambda n: (n.lineno, isinstance(n.ctx, ast.Store), n.col_offset))
    first_use = {}
    for name in later:
        first_use.setdefault(name.id, name.ctx)
    return tuple(dict.fromkeys(name for _, _, name in assigned if isinstance(first_use.get(name), ast.Load)))


def _own_holes(source: str, module: str, where: str, tree: ast.AST) -> list[Hole]:
    lines = source.splitlines()
    holes = []
    for region in find_regions(source, module, where):
        end = bug_part(lines, region) or region.last
        code = sum(is_code(line) for line in lines[region.first + 1 : end])
        holes.append(Hole(region.first, region.last, region, module, code,
                          _defines(tree, region.first, end)))
    return holes


# ----------------------------------------------------------------------- answers a lesson inherits

def _code_lines(source: str) -> list[tuple[int, str]]:
    """(line index, stripped text) of every line but the markers: what two rungs share."""
    return [(index, line.strip()) for index, line in enumerate(source.splitlines())
            if not line.strip().startswith((BEGIN, END))]


def answer_lines(module: str, sources: Mapping[str, str]) -> dict[int, tuple[str, Region]]:
    """Line index of `module`'s solution -> (module, region) whose answer that line is: its own
    regions, and the lines it keeps unchanged from the answers of the rung it builds on (and so,
    through that rung, from every earlier one)."""
    source = sources[module]
    answers = {}
    for region in find_regions(source, module, f"solutions/{module}.py"):
        for index in range(region.first + 1, region.last):
            answers[index] = (module, region)
    base = builds_on().get(module)
    if base is None:
        return answers
    if base not in sources:
        raise ReleaseError(f"solutions/{module}.py builds on {base}, whose solution the release needs "
                           "to leave its answers out of the lesson: pass it in `sources`")
    inherited = answer_lines(base, sources)
    for here, there in kept_lines(sources[base], source).items():
        if here not in answers and there in inherited:
            answers[here] = inherited[there]
    return answers


def kept_lines(old_source: str, new_source: str) -> dict[int, int]:
    """Line index of `new_source` -> the line of `old_source` it keeps unchanged (stripped, markers
    left out, blank lines not counted): where a rung stands on the rung it builds on."""
    old, new = _code_lines(old_source), _code_lines(new_source)
    matcher = difflib.SequenceMatcher(None, [text for _, text in old], [text for _, text in new],
                                      autojunk=False)
    return {new[block.b + offset][0]: old[block.a + offset][0]
            for block in matcher.get_matching_blocks() for offset in range(block.size)
            if new[block.b + offset][1]}


def _statement_lines(statement: ast.stmt) -> range:
    first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", []))])
    return range(first - 1, statement.end_lineno)


def _together(lines: list[str]) -> str:
    """Lines as one text to search in another: stripped, blank lines and markers left out."""
    kept = [line.strip() for line in lines if line.strip() and not line.strip().startswith((BEGIN, END))]
    return "\n" + "\n".join(kept) + "\n"


def _inherited_statements(body, lines, answers, is_open, base: str) -> list[tuple[ast.stmt, tuple]]:
    """The largest statements whose every line of code is one open inherited region's answer and
    which stand in one piece in the rung this one builds on (`base`, as `_together` writes it)."""
    found = []
    for statement in body:
        span = _statement_lines(statement)
        owners = {answers.get(i) for i in span if is_code(lines[i])}
        owner = next(iter(owners)) if len(owners) == 1 else None
        if owner is not None and is_open(owner[1].exercise) \
                and _together(lines[span.start : span.stop]) in base:
            found.append((statement, owner))
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(statement, field, None)
            if inner:
                found += _inherited_statements(inner, lines, answers, is_open, base)
    return found


def _inherited_holes(module: str, sources, tree, is_open, own: list[Hole]) -> list[Hole]:
    """Holes where `module`'s lesson would show an earlier rung's open answer: consecutive statements
    from one region become one hole, with the comments just above them, as long as they stand in one
    piece in the rung this one builds on (where the student copies them from)."""
    lines = sources[module].splitlines()
    answers = {i: owner for i, owner in answer_lines(module, sources).items() if owner[0] != module}
    if not answers:
        return []
    base = _together(sources[builds_on()[module]].splitlines())
    inside_own = {i for hole in own for i in range(hole.first, hole.last + 1)}
    spans: list[list] = []  # [first, last, owner, indent]
    for statement, owner in _inherited_statements(tree.body, lines, answers, is_open, base):
        span = _statement_lines(statement)
        first, last = span.start, span.stop - 1
        while first > 0 and not is_code(lines[first - 1]) and lines[first - 1].strip() \
                and answers.get(first - 1) == owner and first - 1 not in inside_own \
                and _together(lines[first - 1 : last + 1]) in base:
            first -= 1
        between = range(spans[-1][1] + 1, first) if spans else range(0)
        if spans and spans[-1][2] == owner and spans[-1][3] == statement.col_offset \
                and all(not is_code(lines[i]) and i not in inside_own for i in between) \
                and _together(lines[spans[-1][0] : last + 1]) in base:
            spans[-1][1] = last
        else:
            spans.append([first, last, owner, statement.col_offset])  # one hole stands at one depth
    return [Hole(first, last, owner[1], owner[0], sum(is_code(line) for line in lines[first : last + 1]),
                 _defines(tree, first, last)) for first, last, owner, _ in spans]


def lesson_holes(module: str, sources: Mapping[str, str],
                 is_open: Callable[[str], bool] = lambda exercise: True) -> list[Hole]:
    """Where `module`'s lesson has todo(...) lines, in order: its own open regions and the lines
    that hold an earlier rung's open answer. `is_open(exercise)` is False for an exercise whose
    answer the lesson may show (a closed one, in a hand-out that builds on it)."""
    where = f"solutions/{module}.py"
    tree = ast.parse(sources[module])
    own = [hole for hole in _own_holes(sources[module], module, where, tree) if is_open(hole.region.exercise)]
    holes = own + _inherited_holes(module, sources, tree, is_open, own)
    return sorted(holes, key=lambda hole: hole.first)


def _stub_lines(hole: Hole, module: str, indent: str) -> list[str]:
    """The comment and the todo(...) line of a hole. In a hole of an earlier rung's answer the
    student pastes their own lines, which stand at the same place in the rung this one builds on."""
    region = hole.region
    arguments = f'"{region.exercise}", region={region.number}, lines={hole.lines}'
    arguments += f', defines="{", ".join(hole.defines)}"' if hole.defines else ""
    if hole.module == module:
        comment = (f"# YOUR CODE HERE: exercise {region.exercise}, region {region.number} "
                   "(delete the todo line when you start)")
    else:
        comment = (f"# COPY FROM YOUR lessons/{builds_on()[module]}.py: the lines of region {region.number} "
                   f"of {region.exercise} that stand here")
    return [f"{indent}{comment}\n", f"{indent}todo({arguments})\n"]


def lesson_pieces(source: str, module: str, where: str, sources: Mapping[str, str] | None = None,
                  is_open: Callable[[str], bool] = lambda exercise: True) -> list[Piece]:
    """The lesson version of one solution module, as pieces in order. `sources` (module -> solution
    source) holds the rungs it builds on, whose open answers it must not show either; `is_open` as
    in lesson_holes."""
    regions = find_regions(source, module, where)
    if regions and not re.search(r"^from course\.core\.stubs import .*\btodo\b", source, re.MULTILINE):
        raise ReleaseError(f"{where}: has exercise regions, so it must import todo from course.core.stubs")
    sources = {**(sources or {}), module: source}
    lines = source.splitlines(keepends=True)
    holes = {hole.first: hole for hole in lesson_holes(module, sources, is_open)}
    pieces, copied, index = [], [], 0

    def stand_in(hole: Hole, stub: list[str]) -> None:
        if copied:
            pieces.append(Piece(tuple(copied)))
            copied.clear()
        pieces.append(Piece(tuple(stub), hole))

    while index < len(lines):
        stripped = lines[index].strip()
        hole = holes.get(index)
        if hole is not None and hole.module == module and bug_part(source.splitlines(), hole.region):
            lesson = bug_part(source.splitlines(), hole.region)
            stand_in(hole, [_uncomment(line) for line in lines[lesson + 1 : hole.last]])
            index = hole.last + 1
        elif hole is not None:
            indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
            stand_in(hole, _stub_lines(hole, module, indent))
            index = hole.last + 1
        elif stripped.startswith((BEGIN, END)):  # a solved region: its code stays, its markers go
            index += 1
        elif stripped == LESSON:  # a solved find-the-bug region: the correct code, not the defect
            index = next(i for i in range(index, len(lines)) if lines[i].strip().startswith(END)) + 1
        else:
            copied.append(lines[index])
            index += 1
    if copied:
        pieces.append(Piece(tuple(copied)))
    return pieces


def stub_source(source: str, module: str, where: str, sources: Mapping[str, str] | None = None,
                is_open: Callable[[str], bool] = lambda exercise: True) -> str:
    """The lesson version of one solution module (see lesson_pieces)."""
    return lesson_text(lesson_pieces(source, module, where, sources, is_open))



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


def render_pieces(solutions: Path,
                  is_open: Callable[[str], bool] = lambda exercise: True) -> dict[Path, bytes | list[Piece]]:
    """Every file of the lessons tree, by relative path: a module as its lesson's pieces (the header
    first, as copied lines), any other file as its bytes. Each open exercise (all of them, unless
    `is_open` says otherwise) is a stub wherever its answer would stand."""
    if not (solutions / "__init__.py").is_file():
        raise ReleaseError(
            f"solutions: {solutions} is not here. Releasing and grading need the course's own "
            "repository; a hand-out (`python -m course release --handout`) has no solutions/.")
    paths = [p for p in sorted(solutions.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    sources = {".".join(p.relative_to(solutions).with_suffix("").parts): p.read_text()
               for p in paths if p.suffix == ".py"}
    files = {}
    for path in paths:
        relative = path.relative_to(solutions)
        if path.suffix != ".py":
            files[relative] = path.read_bytes()
            continue
        where = f"solutions/{relative.as_posix()}"
        module = ".".join(relative.with_suffix("").parts)
        _check_relative_imports(sources[module], where)
        pieces = lesson_pieces(sources[module], module, where, sources, is_open)
        files[relative] = [lesson_header(relative, module, pieces), *pieces]
    return files


def lesson_header(relative: Path, module: str, pieces: list[Piece]) -> Piece:
    """The lines above a lesson: where it comes from, and, in a rung with holes of earlier rungs'
    answers, how to fill them from the student's previous rung."""
    from .topics.ladder.rungs import builds_on, rung_of

    text = HEADER.format(path=relative.as_posix())
    if any(piece.hole is not None and piece.hole.module != module for piece in pieces):
        base = builds_on()[module]
        text += CARRY_HEADER.format(base=base, rung=rung_of(base), module=module)
    return Piece(tuple(text.splitlines(keepends=True)))


def render(solutions: Path, is_open: Callable[[str], bool] = lambda exercise: True) -> dict[Path, bytes]:
    """Every file of the lessons tree, by relative path, as the release would write it (see
    render_pieces)."""
    return files_of(render_pieces(solutions, is_open))


def files_of(rendered: Mapping[Path, bytes | list[Piece]]) -> dict[Path, bytes]:
    """render_pieces' tree as the files' bytes."""
    return {relative: content if isinstance(content, bytes) else lesson_text(content).encode()
            for relative, content in rendered.items()}


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
    if lessons == ROOT / "lessons" and barriers.DATA.read_text() != barriers.rendered(solutions, EXERCISES):
        problems.append(f"differs: {barriers.DATA.relative_to(ROOT).as_posix()} (the solutions' barriers)")
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
    if lessons == ROOT / "lessons":  # where the solutions' barriers stand, for checks without solutions/
        barriers.DATA.write_text(barriers.rendered(solutions, EXERCISES))
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
            stub = TODO_LINE.match(line)
            if stub and line.strip() not in present:
                edited.append(stub.group(1))
    return list(dict.fromkeys(edited))


# ------------------------------------------------------------------------------------------ hand-out

HANDOUT_TAG = "reference"  # a notebook cell that needs solutions/: the hand-out leaves it out
# What a hand-out holds besides lessons/ (rendered fresh): never solutions/, never tests/ (the
# course's own suite tests the solutions, and tests/submissions holds sample student code).
HANDOUT_PARTS = ("course", "pyspec_ref", "notebooks", "results", "README.md", "LICENSE", "pyproject.toml",
                 "environment.yml", "Makefile", ".gitignore")
_SKIPPED = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache", ".hypothesis"}
# A notebook's top-level `name = course.core.impl.load("module", "solutions")`: in a hand-out, the
# student's copy.
_SOLUTIONS_LOAD = re.compile(r'^(\w+ = course\.core\.impl\.load\("\w+"), "solutions"\)(.*)$')
_OWN_COPY = "  # your own copy: a hand-out has no solutions/"


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _parse_cell(source: str):
    """The cell's AST, IPython magics and shell lines blanked; None if it still does not parse."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names |= {t.id for t in types if isinstance(t, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _needs_solutions(source: str) -> bool:
    """Whether a code cell still names "solutions" as a string (an impl, a folder) or looks for the
    `### BEGIN SOLUTION` marker, outside a `try` that catches the ImportError `course.core.impl.load`
    raises when solutions/ is missing."""
    tree = _parse_cell(source)
    if tree is None:
        return bool(re.search(r"""["']solutions["']""", source)) or BEGIN in source
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and _catches_import_error(node):
            guarded |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    # A cell that looks for the exercise markers reads a solution: lessons/ has none.
    return any(isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in guarded
               and (node.value == "solutions" or BEGIN in node.value) for node in ast.walk(tree))


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell binds, names it reads) at a glance: enough to see a dropped cell's results used."""
    tree = _parse_cell(source)
    if tree is None:
        return set(), set()
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return bound, read


def handout_notebook(text: str, where: str) -> str:
    """A notebook as handed out: cells tagged HANDOUT_TAG dropped (reference diffs and sources, cells
    that show or run the solutions), each top-level `x = course.core.impl.load("m", "solutions")` turned
    into the student's own copy `course.core.impl.load("m")`, outputs cleared. Raises ReleaseError
    naming the cell when a kept cell would still need solutions/ or a dropped cell's variables."""
    notebook = json.loads(text)
    kept, dropped_names, defined = [], {}, set()
    for index, cell in enumerate(notebook["cells"]):
        source = _cell_source(cell)
        tags = cell.get("metadata", {}).get("tags", [])
        if HANDOUT_TAG in tags:
            if cell.get("cell_type") == "code":
                for name in _names(source)[0] - defined:
                    dropped_names.setdefault(name, index)
            continue
        if cell.get("cell_type") == "code":
            lines = []
            for line in source.splitlines(keepends=True):
                body, newline = line.rstrip("\n"), line[len(line.rstrip("\n")):]
                match = _SOLUTIONS_LOAD.match(body)
                lines.append(f"{match.group(1)}){_OWN_COPY}{newline}" if match else line)
            source = "".join(lines)
            if _needs_solutions(source):
                raise ReleaseError(
                    f"{where}: cell {index} needs solutions/, which a hand-out leaves out: tag it "
                    f"{HANDOUT_TAG!r} (cell metadata) so that the hand-out drops it, or load the student's "
                    "copy instead")
            bound, read = _names(source)
            stale = sorted(name for name in read - defined - bound if name in dropped_names)
            if stale:
                raise ReleaseError(
                    f"{where}: cell {index} uses {', '.join(stale)} from cell {dropped_names[stale[0]]}, "
                    f"which is tagged {HANDOUT_TAG!r} and left out of the hand-out")
            defined |= bound
            cell = dict(cell, source=source, outputs=[], execution_count=None)
        kept.append(cell)
    notebook["cells"] = kept
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class Selection:
    """What a hand-out gives: the notebooks up to `through` (all when None) with their lessons, and the
    exercises of notebooks up to `solved` (none when None) already written, so that a later rung can
    build on a closed one. Every other exercise is a stub wherever its answer would stand."""
    through: str | None = None
    solved: str | None = None

    def validate(self, notebooks: list[str]) -> None:
        numbers = sorted(notebook_number(n) for n in notebooks)
        for option, value in (("through", self.through), ("solved", self.solved)):
            if value is not None and value not in numbers:
                raise ReleaseError(f"handout: --{option} must be a notebook number ({', '.join(numbers)}), "
                                   f"got {value!r}")
        if self.through is not None and self.solved is not None and self.solved > self.through:
            raise ReleaseError(f"handout: --solved {self.solved} lies past --through {self.through}: a "
                               "hand-out cannot finish exercises of notebooks it leaves out")

    def gives(self, notebook: str) -> bool:
        return self.through is None or notebook_number(notebook) <= self.through

    def is_open(self, exercise: str) -> bool:
        return self.solved is None or notebook_number(EXERCISES[exercise].notebook) > self.solved

    def gives_lesson(self, module: str) -> bool:
        """A lesson module comes with the first notebook that has one of its exercises."""
        notebooks = [e.notebook for e in EXERCISES.values() if e.module == module]
        return not notebooks or self.gives(min(notebooks, key=notebook_number))


def handout_files(root: Path = ROOT, selection: Selection = Selection()) -> dict[Path, bytes]:
    """Every file of the hand-out, by relative path."""
    selection.validate([p.name for p in (root / "notebooks").glob("*.ipynb")])
    files = {}
    for part in HANDOUT_PARTS:
        path = root / part
        if path.is_file():
            files[Path(part)] = path.read_bytes()
        for found in sorted(path.rglob("*")) if path.is_dir() else []:
            relative = found.relative_to(root)
            if found.is_dir() or found.is_symlink() or _SKIPPED & set(relative.parts) \
                    or found.suffix == ".pyc":
                continue
            if found.suffix == ".ipynb":
                if selection.gives(found.name):
                    files[relative] = handout_notebook(found.read_text(), relative.as_posix()).encode()
            else:
                files[relative] = found.read_bytes()
    for relative, content in render(root / "solutions", selection.is_open).items():
        if relative.suffix != ".py" or selection.gives_lesson(".".join(relative.with_suffix("").parts)):
            files[Path("lessons") / relative] = content
    return files


def handout(folder: Path, root: Path = ROOT, selection: Selection = Selection()) -> list[Path]:
    """Write the hand-out into `folder` (new or empty); returns the files written."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ReleaseError(f"handout: {folder} exists and is not an empty folder; name a new one")
    inside = folder.resolve()
    if any(inside == (root / part).resolve() or (root / part).resolve() in inside.parents
           for part in (*HANDOUT_PARTS, "solutions", "lessons")):
        raise ReleaseError(f"handout: {folder} lies inside a folder the hand-out copies; pick another place")
    files = handout_files(root, selection)
    for relative, content in files.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return sorted(files)
