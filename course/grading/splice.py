"""What grading runs of a submission: the course's own lesson modules with the student's code in the holes.

A lesson module is its solution with every exercise region turned into a stub (`course.release`);
a student writes code where a stub stands, and everything else in the file is the course's. So
grading does not run the student's file. It lines the file up with the lesson the release
writes (difflib over lines, `course.release.render_pieces`), takes the lines that stand where
each hole stood (between the unchanged lines around it), and writes them into its own copy of
the lesson: launchers, constants, imports and helpers all come from the grader, so a changed
launcher, a smaller `MASK_TILE` or an extra import outside the holes changes nothing (the
feedback says such changes were ignored).

Then each hole's code is read (ast) against an allowlist for its module's language (a Numba
CUDA kernel, a Triton kernel, host-side PyTorch), drawn from the solutions' own regions: the
statements and expressions kernel code uses, names its function binds, the module's constants and
kernel functions, a fixed set of builtins, module attributes (`cuda.threadIdx.x`, `tl.load`,
`math.exp`) and attributes of its own values (`.shape`). Anything else (a lambda, a comprehension,
a def, a class, an import, `with`, a module used as a value, code at module level) is refused: the
exercise scores zero (tampering, naming the node and the student's line) and is graded as the stub.
The rules are the same for every submission and for the solutions (tests/test_grade_splice.py
checks that every solution region passes them).
"""

from __future__ import annotations

import ast
import builtins
import difflib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.regions import Piece, lesson_text

MAX_STUDENT_LINES = 50_000

# ------------------------------------------------------------------------------------ the grammar
#
# A hole is accepted only if every node of its syntax tree is one that exercise code in its
# language uses (an allowlist, drawn from the solutions' own regions: tests/test_grade_splice.py
# checks that every one passes). Three languages: a Numba CUDA kernel, a Triton kernel, and
# host-side PyTorch (a module without kernels).

# Statements and expressions of every language; anything else (lambda, comprehension, def, class,
# decorator, global, nonlocal, import, with, try, del, raise, yield, await, f-string, :=, ...) is refused.
STATEMENTS = (ast.Assign, ast.AugAssign, ast.Expr, ast.If, ast.For, ast.While, ast.Break, ast.Continue,
              ast.Pass, ast.Return)
EXPRESSIONS = (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.keyword, ast.Name,
               ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List)
GRAMMAR = (*STATEMENTS, *EXPRESSIONS, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context)
NODE_NAMES = {ast.Lambda: "a lambda", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
              ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator expression",
              ast.FunctionDef: "a def", ast.AsyncFunctionDef: "a def", ast.ClassDef: "a class",
              ast.Global: "`global`", ast.Nonlocal: "`nonlocal`", ast.Import: "an import",
              ast.ImportFrom: "an import", ast.With: "`with`", ast.AsyncWith: "`with`", ast.Try: "`try`",
              ast.Delete: "`del`", ast.Raise: "`raise`", ast.Yield: "`yield`", ast.YieldFrom: "`yield`",
              ast.Await: "`await`", ast.JoinedStr: "an f-string", ast.NamedExpr: "`:=`",
              ast.Starred: "a starred value", ast.Dict: "a dict", ast.Set: "a set", ast.Assert: "`assert`",
              ast.AnnAssign: "an annotation", ast.Match: "`match`"}

# The module attributes each language may use, by the module's real name (the lesson's alias,
# such as `cuda`, `tl` or `np`, stands for it): the full dotted name, never a part of it.
_AXES = ("x", "y", "z")
_NUMPY_SCALARS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                  "float32", "float64", "bool_", "inf", "nan")
_MATH = ("exp", "exp2", "expm1", "log", "log2", "log1p", "log10", "sqrt", "floor", "ceil", "fabs", "trunc",
         "tanh", "isinf", "isnan", "isfinite", "copysign", "pow", "inf", "nan", "pi", "e")
MODULE_ATTRIBUTES = {
    "numba": frozenset(
        [f"numba.cuda.{group}.{axis}" for group in ("threadIdx", "blockIdx", "blockDim", "gridDim")
         for axis in _AXES]
        + [f"numba.cuda.{name}" for name in (
            "grid", "gridsize", "laneid", "warpsize", "syncthreads", "syncthreads_or", "syncthreads_and",
            "syncthreads_count", "syncwarp", "threadfence", "threadfence_block", "shared.array",
            "local.array", "const.array_like", "activemask", "all_sync", "any_sync", "ballot_sync",
            "shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "popc", "clz", "ffs", "brev",
            "fma", "cbrt")]
        + [f"numba.cuda.atomic.{name}" for name in ("add", "sub", "max", "min", "exch", "cas", "inc", "dec",
                                                    "and_", "or_", "xor", "compare_and_swap")]
        + [f"math.{name}" for name in _MATH] + [f"numpy.{name}" for name in _NUMPY_SCALARS]),
    "triton": frozenset(
        [f"triton.language.{name}" for name in (
            "program_id", "num_programs", "arange", "load", "store", "zeros", "zeros_like", "full", "where",
            "maximum", "minimum", "max", "min", "sum", "cumsum", "argmax", "argmin", "exp", "exp2", "log",
            "log2", "sqrt", "rsqrt", "abs", "fma", "cdiv", "dot", "trans", "reshape", "broadcast_to",
            "expand_dims", "static_range", "range", "debug_barrier", "multiple_of", "max_contiguous", "cast",
            "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg", "math.exp", "math.exp2",
            "math.log", "math.log2", "math.sqrt", "math.rsqrt", "math.fma", "float16", "bfloat16", "float32",
            "float64", "int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")]
        + [f"math.{name}" for name in _MATH] + [f"numpy.{name}" for name in _NUMPY_SCALARS]),
    "torch": frozenset(
        [f"torch.{name}" for name in (
            "exp", "log", "sqrt", "abs", "maximum", "minimum", "where", "isinf", "isnan", "isfinite",
            "logaddexp", "clamp", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty",
            "empty_like", "arange", "cat", "stack", "matmul", "float16", "bfloat16", "float32", "float64",
            "int32", "int64", "bool", "inf", "nan")]
        + [f"math.{name}" for name in _MATH]),
}
# The attributes each language may read from its own values (a tensor's shape, a Triton block's
# dtype): no module, no dunder, no routine that computes an exercise's answer (softmax,
# logsumexp, logcumsumexp, ...).
VALUE_ATTRIBUTES = {
    "numba": frozenset({"shape", "size", "ndim", "dtype"}),
    "triton": frozenset({"dtype", "to", "shape", "T"}),
    "torch": frozenset({
        "device", "dtype", "shape", "ndim", "size", "numel", "dim", "values", "indices", "T", "masked_fill",
        "max", "min", "amax", "amin", "sum", "exp", "log", "sqrt", "abs", "clamp", "transpose", "unsqueeze",
        "squeeze", "view", "reshape", "expand", "permute", "flatten", "contiguous", "clone", "to", "float",
        "item", "new_zeros", "new_full", "new_empty"}),
}
BUILTINS = {
    "numba": frozenset({"range", "min", "max", "abs", "int", "float", "bool", "len", "round", "print"}),
    "triton": frozenset({"range", "min", "max", "int", "float", "print"}),
    "torch": frozenset({"range", "len", "min", "max", "abs", "int", "float", "bool", "slice", "zip",
                        "enumerate", "tuple", "list", "print", "round"}),
}
# Values of the module a hole may name: the module's own constants and, in a kernel, its own
# kernel functions (a Numba device function, a Triton jit function).
CONSTANTS = (int, float, bool, str, complex, type(None))


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


def _anchor(lesson: list[str], matched: dict[int, int], index: int, step: int) -> int:
    """The lesson line that bounds a hole: the one next to it, or past blank lines the student
    removed or changed (a whitespace change around a hole costs nothing)."""
    while 0 <= index < len(lesson) and index not in matched and not lesson[index].strip():
        index += step
    return index


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
        before = _anchor(lesson, matched, starts[index] - 1, -1)
        after = _anchor(lesson, matched, starts[index] + len(segment.stub), 1)
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
    """What one module's holes may reach: its globals (from the grader's own lesson module) and its
    language ("numba", "triton" or "torch", which picks the grammar)."""

    module: str
    globals: Mapping[str, object]
    language: str = "torch"


def context_of(module: str, trusted: types.ModuleType) -> Context:
    values = vars(trusted)
    roots = {v.__name__.split(".")[0] for v in values.values() if isinstance(v, types.ModuleType)}
    language = "triton" if "triton" in roots else "numba" if "numba" in roots else "torch"
    return Context(module, dict(values), language)


def _bound_names(function: ast.AST | None) -> set[str]:
    """Names a function binds: its arguments and what it assigns or loops over."""
    if function is None:
        return set()
    bound = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
    return bound


def _enclosing(tree: ast.Module, line: int) -> ast.AST | None:
    """The innermost function whose `def` stands before `line` and whose body reaches it."""
    holders = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.lineno < line <= (n.end_lineno or n.lineno)]
    return max(holders, key=lambda n: n.lineno) if holders else None


def _root(node: ast.AST) -> ast.Name | None:
    """The Name an attribute/subscript/call chain starts from."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node if isinstance(node, ast.Name) else None


def _chain(node: ast.Attribute) -> tuple[ast.AST, list[str]]:
    """The value an attribute chain starts from and the attributes read from it, in order."""
    attributes = []
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    return node, attributes[::-1]


def _constant(value) -> bool:
    """One of the module's own constants: a number, a string, a numpy scalar, a Numba type, or a
    tuple of them."""
    import numpy as np

    if isinstance(value, tuple):
        return all(_constant(item) for item in value)
    owner = type(value).__module__ or ""
    return isinstance(value, (*CONSTANTS, np.generic)) or owner.startswith("numba.core.types")


def _kernel_function(value, language: str) -> bool:
    """A Numba device function or a Triton jit function of the module (what a kernel may call)."""
    owner = type(value).__module__ or ""
    return language in ("numba", "triton") and owner.startswith(language) and callable(value)


class _Rules:
    """The grammar of one hole: `check(node)` gives why a node is refused ('' when it is not)."""

    def __init__(self, tree: ast.Module, function: ast.AST | None, context: Context, last: int):
        self.context, self.language, self.last = context, context.language, last
        self.local = _bound_names(function)
        self.body = {id(n) for statement in (function.body if function is not None else [])
                     for n in ast.walk(statement)}
        self.parent = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def check(self, node: ast.AST) -> str:
        if id(node) not in self.body:
            return "stands outside its function (module-level code)"
        if getattr(node, "end_lineno", None) and node.end_lineno > self.last:
            return "runs on past the end of its region"
        if not isinstance(node, GRAMMAR):
            what = NODE_NAMES.get(type(node), f"a {type(node).__name__}")
            return f"uses {what}, which exercise code does not"
        if isinstance(node, ast.keyword) and node.arg is None:
            return "unpacks a dict into a call (**)"
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            root = _root(node)
            if root is None or root.id not in self.local:
                return f"changes {ast.unparse(node)[:60]}, which belongs to the module"
        return ""

    def _name(self, node: ast.Name) -> str:
        name = node.id
        if name.startswith("__"):
            return f"uses the name {name}"
        if name in self.local:
            return ""
        if name in self.context.globals:
            value = self.context.globals[name]
            if isinstance(value, types.ModuleType):
                parent = self.parent.get(id(node))
                if isinstance(parent, ast.Attribute) and parent.value is node:
                    return ""  # checked as a whole with its attributes (_attribute)
                return f"uses the module {name} as a value"
            if name == "todo" or _constant(value) or _kernel_function(value, self.language):
                return ""
            return f"uses {name}, which is not one of the module's constants or kernel functions"
        if hasattr(builtins, name):
            return "" if name in BUILTINS[self.language] else f"uses the builtin {name}"
        return ""  # a name nothing binds: a NameError when it runs, a failed case

    def _attribute(self, node: ast.Attribute) -> str:
        if not isinstance(node.ctx, ast.Load):
            return f"changes the attribute {ast.unparse(node)[:60]}"
        parent = self.parent.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return ""  # checked as part of the longer chain
        base, attributes = _chain(node)
        if isinstance(base, ast.Name) and base.id not in self.local and isinstance(
                self.context.globals.get(base.id), types.ModuleType):
            dotted = ".".join([self.context.globals[base.id].__name__, *attributes])
            if dotted in MODULE_ATTRIBUTES[self.language]:
                return ""
            return f"uses {'.'.join([base.id, *attributes])}, which is not {self._kind} code"
        refused = [a for a in attributes if a not in VALUE_ATTRIBUTES[self.language]]
        return f"reads the attribute .{refused[0]}, which {self._kind} code does not" if refused else ""

    @property
    def _kind(self) -> str:
        return {"numba": "Numba kernel", "triton": "Triton kernel", "torch": "exercise"}[self.language]


def refusals(tree: ast.Module, first: int, last: int, context: Context,
             line_of=lambda line: line) -> list[str]:
    """Why the code on graded lines first..last (1-based) is not exercise code ([] when it is);
    `line_of` turns a graded line into the line the student sees. Every node of the hole must be
    one its language's grammar holds, inside the function the hole stands in."""
    nodes = [n for n in ast.walk(tree) if first <= getattr(n, "lineno", 0) <= last]
    if not nodes:
        return []
    rules = _Rules(tree, _enclosing(tree, min(n.lineno for n in nodes)), context, last)
    reasons, inside_refused = [], set()
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
        if id(node) in inside_refused:
            continue
        why = rules.check(node)
        if why:  # one reason per refused part: not again for each node inside it
            inside_refused |= {id(n) for n in ast.walk(node)}
        text = f"{why} (`{type(node).__name__}`, line {line_of(node.lineno)})" if why else ""
        if text and text not in reasons:
            reasons.append(text)
    return reasons


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
        spliced = _splice_safely(module, content, student, contexts.get(module, Context(module, {})))
        modules[module] = spliced
        files[relative] = spliced.text.encode()
    return Spliced(modules, files)


def _splice_safely(module: str, pieces: list[Piece], student_text: str | None,
                   context: Context) -> SplicedModule:
    """splice_module, where code nested too deeply to read (RecursionError, MemoryError, or a
    parser's "too many nested parentheses") leaves the module's exercises as stubs, with a note."""
    try:
        return splice_module(module, pieces, student_text, context)
    except (RecursionError, MemoryError, SyntaxError, ValueError) as error:
        why = "nested too deeply" if not isinstance(error, ValueError) else "holds a null byte"
        text = lesson_text(pieces)
        exercises = tuple(dict.fromkeys(p.hole.region.exercise for p in pieces if p.hole is not None))
        problem = Problem(exercises, f"lessons/{module}.py could not be read ({why}): not graded")
        return SplicedModule(module, text, True, [problem], stubs=_stubs(text))


def _read(path: Path | None) -> str | None:
    if path is None or path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes().decode("utf-8", errors="replace")


def written_holes(pieces: list[Piece], student_text: str) -> list[Segment]:
    """Each run of adjacent holes of a lesson (`pieces`, as the release writes it) with the lines the
    student's file holds there (`written` None where the lines around it were changed), in order:
    what grading lines up, for a caller that reads the student's code hole by hole (a ladder rung
    carried into the next one: `course.carry`)."""
    student = student_text.replace("\r\n", "\n").splitlines(keepends=True)
    parts, _ = _line_up(pieces, student)
    return [part for part in parts if isinstance(part, Segment)]
