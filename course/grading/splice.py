"""What grading runs of a submission: the course's own lesson modules with the student's code in the holes.

A lesson module is its solution with every exercise region turned into a stub (`course.release`);
a student writes code where a stub stands, and everything else in the file is the course's. So
grading does not run the student's file. It lines the file up with the lesson the release
writes (difflib over lines, `course.release.render_pieces`), takes the lines that stand where
each hole stood (between the unchanged lines around it), and writes them into its own copy of
the lesson: launchers, constants, imports and helpers all come from the grader, so a changed
launcher, a smaller `MASK_TILE` or an extra import outside the holes changes nothing (the
feedback says such changes were ignored).

Then each hole's code is read (ast) for what an exercise's code has no business doing: imports,
`global`, dunder names and underscore attributes, the names of the harness and its
specification (`course`, `pyspec_ref`, `oracle`, ...), builtins that reach outside the code
(`open`, `eval`, `getattr`, ...), modules reached through a module's attributes
(`torch.nn`, `np.lib`), library routines that compute an exercise's answer (`softmax`,
`logsumexp`), torch inside a kernel, assignments to anything the hole does not own. A refused
hole costs its exercise (tampering, with the reason); it is graded as the stub. The rules are
the same for every submission and for the solutions (tests/test_grade_splice.py checks that
every solution region passes them).
"""

from __future__ import annotations

import ast
import builtins
import difflib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..release import Piece, lesson_text

MAX_STUDENT_LINES = 50_000

# Names no exercise code uses: the harness, its specification, the answer key, and the ways out
# of a kernel (files, processes, introspection).
FORBIDDEN_NAMES = frozenset({
    "course", "pyspec_ref", "oracle", "solutions", "lessons", "spec", "sys", "os", "importlib", "builtins",
    "ctypes", "subprocess", "shutil", "pathlib", "socket", "gc", "inspect", "threading", "multiprocessing",
    "signal", "resource", "sqlite3", "pickle", "marshal", "io", "open", "eval", "exec", "compile",
    "getattr", "setattr", "delattr", "hasattr", "globals", "locals", "vars", "dir", "input", "breakpoint",
    "memoryview", "type", "object", "super", "classmethod", "staticmethod", "property", "help", "exit",
    "quit", "copyright", "credits", "license",
})
# The builtins exercise code may call (any other builtin is refused by name).
ALLOWED_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "divmod", "enumerate", "filter", "float", "int", "isinstance", "iter",
    "len", "list", "map", "max", "min", "next", "pow", "print", "range", "reversed", "round", "set",
    "slice", "sorted", "str", "sum", "tuple", "zip", "dict", "frozenset", "chr", "ord", "format", "repr",
    "True", "False", "None", "Ellipsis", "NotImplemented", "ArithmeticError", "AssertionError",
    "Exception", "IndexError", "KeyError", "NotImplementedError", "OverflowError", "RuntimeError",
    "StopIteration", "TypeError", "ValueError", "ZeroDivisionError", "FloatingPointError",
})
# Attributes no exercise reads: routines that compute an exercise's answer, ways to load or
# compile code, and frames (their globals lead anywhere).
FORBIDDEN_ATTRIBUTES = frozenset({
    "softmax", "log_softmax", "softmin", "logsumexp", "scaled_dot_product_attention", "load_inline",
    "from_file", "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "gi_frame", "gi_code",
    "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "tb_frame", "tb_next", "func_globals",
})
TORCH_FORBIDDEN = frozenset({"load", "save", "compile", "jit", "ops", "hub", "library", "classes",
                             "backends", "utils", "nn", "special", "fx", "func", "package"})
REFUSED_STATEMENTS = {
    ast.Import: "imports a module", ast.ImportFrom: "imports a module", ast.Global: "uses `global`",
    ast.Nonlocal: "uses `nonlocal`", ast.ClassDef: "defines a class",
    ast.AsyncFunctionDef: "defines a coroutine",
    ast.Await: "awaits", ast.Yield: "yields", ast.YieldFrom: "yields", ast.AsyncFor: "uses `async for`",
    ast.AsyncWith: "uses `async with`",
}
# Modules whose attributes exercise code may read: a kernel's (numba.cuda, triton.language, math,
# numpy's scalar types), or, in a module without kernels (notebook 02's PyTorch), torch's.
KERNEL_MODULES = ("math", "numpy", "numba", "numba.cuda", "triton", "triton.language")
HOST_MODULES = ("math", "torch")


@dataclass(frozen=True)
class Problem:
    """Why exercises cannot be graded as written: their hole was not found, does not parse, or was
    refused (`tampering`: the exercise scores zero as a violation)."""

    exercises: tuple[str, ...]
    note: str
    tampering: bool = False


@dataclass
class Segment:
    """A run of adjacent holes of the lesson and what the student wrote there (None: not found)."""

    holes: tuple
    stub: list[str]
    written: list[str] | None = None
    student_first: int = 0  # 1-based line of the student's file where `written` starts
    used: bool = True  # False once refused or unparsable: graded as the stub

    @property
    def exercises(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(hole.region.exercise for hole in self.holes))

    def describe(self) -> str:
        return " and ".join(f"region {hole.region.number} of {hole.region.exercise}" for hole in self.holes)

    @property
    def lines(self) -> list[str]:
        return self.written if self.written is not None and self.used else self.stub


@dataclass
class SplicedModule:
    module: str
    text: str  # the module as graded
    handed_in: bool
    problems: list[Problem] = field(default_factory=list)
    ignored: str = ""  # the student's changes outside the holes, which grading ignores
    line_map: dict[int, int] = field(default_factory=dict)  # graded line -> the student's line (1-based)
    stubs: dict[str, str] = field(default_factory=dict)  # function -> the exercise its code still leaves open


@dataclass
class Spliced:
    """Every lesson module of one submission as graded, and the lessons tree to write."""

    modules: dict[str, SplicedModule]
    files: dict[Path, bytes]

    def problems(self, exercises) -> list[Problem]:
        wanted = set(exercises)
        return [p for m in self.modules.values() for p in m.problems if wanted & set(p.exercises)]


# ------------------------------------------------------------------------------------ lining up

def _key(line: str) -> str:
    return line.rstrip()


def _segments(pieces: list[Piece]) -> list[tuple[int, Segment | None]]:
    """(index of the piece where it starts, segment) per run of adjacent holes; text pieces as None."""
    out, index = [], 0
    while index < len(pieces):
        if pieces[index].hole is None:
            out.append((index, None))
            index += 1
            continue
        first, holes, stub = index, [], []
        while index < len(pieces) and pieces[index].hole is not None:
            holes.append(pieces[index].hole)
            stub += pieces[index].lines
            index += 1
        out.append((first, Segment(tuple(holes), stub)))
    return out


def _matched(lesson: list[str], student: list[str]) -> dict[int, int]:
    """Lesson line index -> the student's line index, where the two line up unchanged."""
    matcher = difflib.SequenceMatcher(lambda line: not line.strip(), [_key(x) for x in lesson],
                                      [_key(x) for x in student], autojunk=False)
    return {block.a + k: block.b + k for block in matcher.get_matching_blocks() for k in range(block.size)}


def _line_up(pieces: list[Piece], student: list[str]) -> tuple[list[Piece | Segment], set[int]]:
    """The lesson's pieces with each run of holes as a Segment holding the student's lines, and the
    student's line indices that stand outside every hole but differ from the lesson."""
    lesson = [line for piece in pieces for line in piece.lines]
    starts, at = [], 0
    for piece in pieces:
        starts.append(at)
        at += len(piece.lines)
    matched = _matched(lesson, student)
    out: list[Piece | Segment] = []
    inside: set[int] = set()
    for index, segment in _segments(pieces):
        if segment is None:
            out.append(pieces[index])
            continue
        before = starts[index] - 1
        after = starts[index] + len(segment.stub)
        first = matched.get(before) if before >= 0 else -1
        last = matched.get(after) if after < len(lesson) else len(student)
        if first is not None and last is not None and first < last:
            segment.written = student[first + 1 : last]
            segment.student_first = first + 2
            inside.update(range(first + 1, last))
        out.append(segment)
    outside_matched = {b for a, b in matched.items()}
    changed = {i for i in range(len(student)) if i not in inside and i not in outside_matched
               and student[i].strip()}
    return out, changed


def _ranges(lines: set[int]) -> str:
    """'3, 17-19' for 0-based {2, 16, 17, 18}, as 1-based line numbers."""
    spans, ordered = [], sorted(lines)
    for n in ordered:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    shown = [f"{a + 1}" if a == b else f"{a + 1}-{b + 1}" for a, b in spans[:8]]
    return ", ".join(shown) + (", ..." if len(spans) > 8 else "")


# ------------------------------------------------------------------------------------ the text

def _assemble(parts: list[Piece | Segment]) -> tuple[str, dict[int, int], dict[int, tuple[int, int]]]:
    """(module text, graded line -> student's line for the written holes, id(segment) -> its 1-based
    first and last graded lines)."""
    lines, line_map, spans = [], {}, {}
    for part in parts:
        if isinstance(part, Segment):
            first = len(lines) + 1
            for offset, line in enumerate(part.lines):
                lines.append(line if line.endswith("\n") else line + "\n")
                if part.written is not None and part.used:
                    line_map[len(lines)] = part.student_first + offset
            spans[id(part)] = (first, len(lines))
        else:
            lines.extend(part.lines)
    return "".join(lines), line_map, spans


def _written(parts) -> list[Segment]:
    return [p for p in parts if isinstance(p, Segment) and p.written is not None and p.used
            and [_key(x) for x in p.written] != [_key(x) for x in p.stub]]


def _syntax_problems(parts, module: str) -> list[Problem]:
    """Holes whose code does not parse with the lesson around it: each graded as its stub."""
    problems = []
    for segment in _written(parts):
        trial = [p if not isinstance(p, Segment) or p is segment else _as_stub(p) for p in parts]
        text, line_map, _ = _assemble(trial)
        try:
            ast.parse(text)
        except SyntaxError as error:
            where = line_map.get(error.lineno or 0)
            at = f" (line {where} of lessons/{module}.py)" if where else ""
            problems.append(Problem(segment.exercises,
                                    f"{segment.describe()} does not parse: {error.msg}{at}"))
            segment.used = False
    text, _, _ = _assemble(parts)
    try:
        ast.parse(text)
    except SyntaxError as error:  # each parses alone, not together: grade them all as stubs
        for segment in _written(parts):
            segment.used = False
            note = f"{segment.describe()} does not parse with your other regions: {error.msg}"
            problems.append(Problem(segment.exercises, note))
    return problems


def _as_stub(segment: Segment) -> Segment:
    return Segment(segment.holes, segment.stub)


# ------------------------------------------------------------------------------------ the rules

@dataclass(frozen=True)
class Context:
    """What one module's holes may reach: its globals (from the grader's own solution module)."""

    module: str
    globals: Mapping[str, object]
    kernels: bool  # the module holds Numba or Triton kernels: torch is not for its holes

    @property
    def allowed_modules(self) -> tuple[str, ...]:
        return KERNEL_MODULES if self.kernels else HOST_MODULES

    def module_allowed(self, value: types.ModuleType) -> bool:
        name = value.__name__
        return name in self.allowed_modules or (self.kernels and name.startswith("triton.language."))


def context_of(module: str, trusted: types.ModuleType) -> Context:
    values = vars(trusted)
    kernels = any(isinstance(v, types.ModuleType) and v.__name__.split(".")[0] in ("numba", "triton")
                  for v in values.values())
    return Context(module, dict(values), kernels)


def _bound_names(function: ast.AST | None) -> set[str]:
    """Names a function binds: its arguments, what it assigns, loops over, catches or defines."""
    if function is None:
        return set()
    bound = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not function:
            if isinstance(node, ast.FunctionDef):
                bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return bound


def _enclosing(tree: ast.Module, line: int) -> ast.AST | None:
    holders = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return max(holders, key=lambda n: n.lineno) if holders else None


def _root(node: ast.AST) -> tuple[ast.Name | None, list[str]]:
    """The Name an attribute/subscript chain starts from, and the attributes read from it in order."""
    attributes = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute):
            attributes.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            attributes.clear()  # an item of a module's attribute is no longer the module's
            node = node.value
        else:
            attributes.clear()
            node = node.func
    return (node if isinstance(node, ast.Name) else None), attributes[::-1]


def _harness_value(value) -> bool:
    owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "") or ""
    return isinstance(owner, str) and owner.split(".")[0] in ("course", "pyspec_ref")


def _global_problem(name: str, context: Context) -> str:
    value = context.globals[name]
    if name == "todo":
        return ""
    if isinstance(value, types.ModuleType):
        if value.__name__ == "torch" and context.kernels:
            return "uses torch inside a kernel"
        return "" if context.module_allowed(value) else f"uses the module {value.__name__}"
    if _harness_value(value):
        return f"uses the harness's {name}"
    return ""


def _chain_problem(root: ast.Name, attributes: list[str], context: Context) -> str:
    """A module global's attributes: every module they reach must be one exercise code may use."""
    value = context.globals[root.id]
    dotted = root.id
    for attribute in attributes:
        if not isinstance(value, types.ModuleType):
            return ""
        if value.__name__ == "torch" and attribute in TORCH_FORBIDDEN:
            return f"uses torch.{attribute}"
        try:
            value = getattr(value, attribute)
        except AttributeError:
            return ""  # an AttributeError when it runs, not a way out
        dotted += f".{attribute}"
        if isinstance(value, types.ModuleType) and not context.module_allowed(value):
            return f"reaches the module {value.__name__} through {dotted}"
        if dotted.startswith(("np.", "numpy.")) and dotted.count(".") == 1 and not _kernel_numpy(value):
            return f"uses {dotted}, which is not a kernel operation"
        if _harness_value(value) and not isinstance(value, types.ModuleType):
            return f"uses the harness's {dotted}"
    return ""


def _kernel_numpy(value) -> bool:
    """numpy's scalar types, ufuncs and constants: what a Numba kernel may call."""
    import numpy as np

    return ((isinstance(value, type) and issubclass(value, np.generic))
            or isinstance(value, (np.ufunc, float)) or value in (np.iinfo, np.finfo, np.dtype))


def refusals(tree: ast.Module, first: int, last: int, context: Context,
             line_of=lambda line: line) -> list[str]:
    """Why the code on graded lines first..last (1-based) is not exercise code ([] when it is);
    `line_of` turns a graded line into the line the student sees."""
    function = _enclosing(tree, first)
    local = _bound_names(function)
    reasons = []

    def refuse(reason: str, node: ast.AST) -> None:
        text = f"{reason} (line {line_of(node.lineno)})"
        if text not in reasons:
            reasons.append(text)

    nodes = [n for n in ast.walk(tree) if first <= getattr(n, "lineno", 0) <= last]
    for node in nodes:
        for kind, why in REFUSED_STATEMENTS.items():
            if isinstance(node, kind):
                refuse(why, node)
        if isinstance(node, ast.FunctionDef) and node.decorator_list:
            refuse("decorates a function", node)
        if isinstance(node, ast.Name):
            refuse_name = _name_problem(node, local, context)
            if refuse_name:
                refuse(refuse_name, node)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                refuse(f"reads the attribute {node.attr}", node)
            elif node.attr in FORBIDDEN_ATTRIBUTES:
                refuse(f"uses {node.attr}", node)
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            root, _ = _root(node)
            if root is not None and root.id not in local:
                refuse(f"changes {ast.unparse(node)}, which belongs to the module", node)
        if isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            root, attributes = _root(node)
            if root is not None and root.id not in local and root.id in context.globals and attributes:
                problem = _chain_problem(root, attributes, context)
                if problem:
                    refuse(problem, node)
    return reasons


def _name_problem(node: ast.Name, local: set[str], context: Context) -> str:
    name = node.id
    if name.startswith("__"):
        return f"uses the name {name}"
    if name in FORBIDDEN_NAMES:
        return f"uses {name}"
    if name in local:
        return ""
    if name in context.globals:
        return _global_problem(name, context)
    if hasattr(builtins, name) and name not in ALLOWED_BUILTINS:
        return f"uses the builtin {name}"
    return ""


def _refusal_problems(parts, context: Context) -> list[Problem]:
    problems = []
    text, line_map, spans = _assemble(parts)
    tree = ast.parse(text)
    for segment in _written(parts):
        first, last = spans[id(segment)]
        reasons = refusals(tree, first, last, context, lambda line: line_map.get(line, line))
        if reasons:
            segment.used = False
            shown = "; ".join(reasons[:4]) + ("; ..." if len(reasons) > 4 else "")
            problems.append(Problem(segment.exercises, f"{segment.describe()} was refused: it {shown}",
                                    tampering=True))
    return problems


def _stubs(text: str) -> dict[str, str]:
    """Top-level function -> the exercise its code still stubs (the first todo(...) call in it)."""
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            calls = sorted((c for c in ast.walk(node) if isinstance(c, ast.Call)
                            and isinstance(c.func, ast.Name) and c.func.id == "todo" and c.args
                            and isinstance(c.args[0], ast.Constant)), key=lambda c: c.lineno)
            if calls:
                found[node.name] = str(calls[0].args[0].value)
    return found


# ------------------------------------------------------------------------------------ a module

def splice_module(module: str, pieces: list[Piece], student_text: str | None,
                  context: Context) -> SplicedModule:
    """One lesson module as graded: the lesson's text with the student's code in the holes it can use."""
    if student_text is None:
        text = lesson_text(pieces)
        return SplicedModule(module, text, False, stubs=_stubs(text))
    student = student_text.replace("\r\n", "\n").splitlines(keepends=True)
    if len(student) > MAX_STUDENT_LINES:
        text = lesson_text(pieces)
        exercises = tuple(dict.fromkeys(p.hole.region.exercise for p in pieces if p.hole is not None))
        problem = Problem(exercises, f"lessons/{module}.py has more than {MAX_STUDENT_LINES} lines: "
                          "not graded")
        return SplicedModule(module, text, True, [problem], stubs=_stubs(text))
    parts, changed = _line_up(pieces, student)
    problems = [Problem(p.exercises, f"could not find {p.describe()} in lessons/{module}.py: the lines "
                        "around it were changed or removed (grading finds your code between the lines the "
                        "lesson has before and after each todo)")
                for p in parts if isinstance(p, Segment) and p.written is None]
    problems += _syntax_problems(parts, module)
    problems += _refusal_problems(parts, context)
    text, line_map, _ = _assemble(parts)
    ignored = ""
    if changed:
        ignored = (f"lessons/{module}.py: your changes outside the exercise regions (lines "
                   f"{_ranges(changed)}) were ignored: grading runs the course's own code there")
    return SplicedModule(module, text, True, problems, ignored, line_map, _stubs(text))


def splice(lessons: Path | None, rendered: Mapping[Path, bytes | list[Piece]],
           contexts: Mapping[str, Context]) -> Spliced:
    """Every lesson module of a submission (whose lessons/ folder is `lessons`; None: nothing handed
    in) as graded; `rendered` is the release's lessons tree (`course.release.render_pieces`), and
    only the modules in `contexts` take the student's code (the others stay stubs). Call it in the
    main thread (ast.parse: see course.grading.grade)."""
    modules, files = {}, {}
    for relative, content in rendered.items():
        if isinstance(content, bytes):
            files[relative] = content
            continue
        module = ".".join(relative.with_suffix("").parts)
        student = _read(lessons / relative) if lessons is not None and module in contexts else None
        spliced = splice_module(module, content, student, contexts.get(module, Context(module, {}, False)))
        modules[module] = spliced
        files[relative] = spliced.text.encode()
    return Spliced(modules, files)


def _read(path: Path | None) -> str | None:
    if path is None or path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes().decode("utf-8", errors="replace")
