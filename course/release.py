"""Release: write the student copy `lessons/` from `solutions/`.

Every exercise region of a solution module, the lines from `### BEGIN SOLUTION`
to `### END SOLUTION`, becomes a stub that fails loudly:

    # YOUR CODE HERE: exercise trees.dfs_times (delete the todo line when you start)
    todo("trees.dfs_times")

The exercise is named after the module and the function that holds the region, or by
the marker itself, `### BEGIN SOLUTION (module.function)`, for a helper that two kernels
share and whose region belongs to the exercise of the kernel a notebook introduces it with.

A find-the-bug exercise gives the student a defective kernel instead of a stub: its
region holds the correct code, then a `### LESSON` line, then the defective code
commented out; the lesson gets the defective lines uncommented (or nothing, for a
missing line) and no todo, so the kernel runs and the checks show the symptoms.
Everything outside the regions is copied unchanged, so a lesson module has the
same API as its solution and the checks can call either.

`handout(folder)` writes what an instructor hands out: the repository without
`solutions/` and `tests/`, with fresh stubs in `lessons/`, and notebooks that need
no solutions (see `handout_notebook`).
"""

from __future__ import annotations

import ast
import json
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
            name = (_named_exercise(lines[opened].strip(), module, f"{where}:{opened + 1}")
                    or _exercise_name(module, functions, opened + 1, f"{where}:{opened + 1}"))
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
    if not (solutions / "__init__.py").is_file():
        raise ReleaseError(
            f"solutions: {solutions} is not here. Releasing and grading need the course's own "
            "repository; a hand-out (`python -m course release --handout`) has no solutions/.")
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


def handout_files(root: Path = ROOT) -> dict[Path, bytes]:
    """Every file of the hand-out, by relative path."""
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
                files[relative] = handout_notebook(found.read_text(), relative.as_posix()).encode()
            else:
                files[relative] = found.read_bytes()
    for relative, content in render(root / "solutions").items():
        files[Path("lessons") / relative] = content
    return files


def handout(folder: Path, root: Path = ROOT) -> list[Path]:
    """Write the hand-out into `folder` (new or empty); returns the files written."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ReleaseError(f"handout: {folder} exists and is not an empty folder; name a new one")
    inside = folder.resolve()
    if any(inside == (root / part).resolve() or (root / part).resolve() in inside.parents
           for part in (*HANDOUT_PARTS, "solutions", "lessons")):
        raise ReleaseError(f"handout: {folder} lies inside a folder the hand-out copies; pick another place")
    files = handout_files(root)
    for relative, content in files.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return sorted(files)
