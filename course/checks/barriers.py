"""Barriers the simulator and the interpreter cannot see: is each of the solution's still there?

Triton's interpreter runs a block's lanes together, one statement at a time, and Numba's simulator
lets a thread that skipped `cuda.syncthreads()` still read what the others wrote by the time it
looks: a kernel whose barrier was removed passes every case on the CPU and races on a GPU. So this
check reads the kernels instead. A kernel is a sequence of memory accesses (a `tl.load` or
`tl.store` of a pointer argument; a read or write of a kernel argument or a shared array) and
barriers (`tl.debug_barrier()`, `cuda.syncthreads()`), in the order the code lists them. Each of
the solution's barriers stands between two accesses, say "the load of cache" and "the store to
cache"; the student's kernel must have a barrier between the same two. A missing one is reported
at the student's line that the barrier should precede.

The solution's barriers are read once, by `python -m course release`, into barriers.json beside
this file (a hand-out has no solutions/); `python -m course release --check` says when it is stale.
On a GPU, `python -m course check <exercise> --racecheck` runs compute-sanitizer's racecheck, which
sees the races themselves.
"""

from __future__ import annotations

import ast
import json
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).with_name("barriers.json")
BARRIER = "barrier"
# The calls that are a barrier, by their last two names (`tl.debug_barrier()`, `cuda.syncthreads()`,
# and the block-wide votes, which are barriers too).
BARRIER_CALLS = {("tl", "debug_barrier"), ("cuda", "syncthreads"), ("cuda", "syncthreads_or"),
                 ("cuda", "syncthreads_and"), ("cuda", "syncthreads_count")}
TRITON_ACCESSES = {"load": "load", "store": "store", "atomic_add": "store", "atomic_max": "store",
                   "atomic_min": "store", "atomic_xchg": "store", "atomic_cas": "store",
                   "atomic_and": "store", "atomic_or": "store", "atomic_xor": "store"}


@dataclass(frozen=True)
class Event:
    """One access ("load" or "store" of an argument or shared array) or a barrier, at a line."""

    kind: str
    name: str
    line: int


def _dotted(node: ast.expr) -> tuple[str, ...]:
    """('tl', 'load') for tl.load, ('cuda', 'shared', 'array') for cuda.shared.array."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return tuple(reversed(parts))


class _Reader:
    """The events of one kernel's body, in the order the code lists them (an assignment's value before
    its target, a loop's bounds before its body)."""

    def __init__(self, definition: ast.FunctionDef):
        arguments = definition.args
        self.tracked = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
        self.aliases: dict[str, ast.expr] = {}  # a local name -> the expression last assigned to it
        self.events: list[Event] = []
        for statement in definition.body:
            self.statement(statement)

    def base(self, expression: ast.expr, depth: int = 0) -> str | None:
        """The argument or shared array a pointer or index expression is built on, through locals."""
        for node in ast.walk(expression):
            if isinstance(node, ast.Name):
                if node.id in self.tracked:
                    return node.id
                if node.id in self.aliases and depth < 8:
                    found = self.base(self.aliases[node.id], depth + 1)
                    if found is not None:
                        return found
        return None

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign):
            self.expression(node.value)
            for target in node.targets:
                self.target(target, node.value)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.expression(node.value)
                self.target(node.target, node.value)
        elif isinstance(node, ast.AugAssign):
            self.expression(node.value)
            if isinstance(node.target, ast.Subscript):
                self.subscript(node.target, "load")
            self.target(node.target, node.value)
        elif isinstance(node, ast.For):
            self.expression(node.iter)
            self.block(node.body + node.orelse)
        elif isinstance(node, (ast.While, ast.If)):
            self.expression(node.test)
            self.block(node.body + node.orelse)
        elif isinstance(node, ast.With):
            self.block(node.body)
        elif isinstance(node, (ast.Expr, ast.Return)) and node.value is not None:
            self.expression(node.value)

    def block(self, statements: Iterable[ast.stmt]) -> None:
        for statement in statements:
            self.statement(statement)

    def target(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Subscript):
            self.expression(target.slice)
            self.subscript(target, "store")
        elif isinstance(target, ast.Name):
            if isinstance(value, ast.Call) and _dotted(value.func)[-3:] == ("cuda", "shared", "array"):
                self.tracked.add(target.id)
            elif target.id not in self.tracked:
                self.aliases[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.target(element, value)

    def subscript(self, node: ast.Subscript, kind: str) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.tracked:
            self.events.append(Event(kind, node.value.id, node.lineno))

    def expression(self, node: ast.expr) -> None:
        """Calls and reads inside an expression, arguments before the call that takes them."""
        if isinstance(node, ast.Call):
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                self.expression(argument)
            name = _dotted(node.func)
            if name[-2:] in BARRIER_CALLS:
                self.events.append(Event(BARRIER, "", node.lineno))
            elif len(name) >= 2 and name[-2] == "tl" and name[-1] in TRITON_ACCESSES and node.args:
                base = self.base(node.args[0])
                if base is not None:
                    self.events.append(Event(TRITON_ACCESSES[name[-1]], base, node.lineno))
            return
        if isinstance(node, ast.Subscript):
            self.expression(node.slice)
            if isinstance(node.ctx, ast.Load):
                self.subscript(node, "load")
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expression(child)


def events(source: str) -> list[Event]:
    """The accesses and barriers of a kernel's source (its first function), in order; lines count from
    the source's first line."""
    definition = next(n for n in ast.parse(textwrap.dedent(source)).body if isinstance(n, ast.FunctionDef))
    return _Reader(definition).events


def _label(event: Event | None) -> str:
    return "start" if event is None else f"{event.kind} {event.name}"


def placements(found: list[Event]) -> list[tuple[str, str]]:
    """Each barrier as (the access before it, the access after it): "load cache", "store cache";
    "start" or "start" where none is. Barriers in a row count once."""
    accesses = [i for i, e in enumerate(found) if e.kind != BARRIER]
    pairs = []
    for index, event in enumerate(found):
        if event.kind != BARRIER or (index and found[index - 1].kind == BARRIER):
            continue
        before = max((i for i in accesses if i < index), default=None)
        after = min((i for i in accesses if i > index), default=None)
        pairs.append((_label(None if before is None else found[before]),
                      "end" if after is None else _label(found[after])))
    return pairs


def _sides(found: list[Event]) -> list[tuple[set[str], set[str]]]:
    """For each barrier (barriers in a row count once), the accesses of the stretch of code before it
    and of the stretch after it, up to the neighbouring barriers ("start" and "end" at the ends)."""
    stretches: list[set[str]] = [{"start"}]
    for index, event in enumerate(found):
        if event.kind != BARRIER:
            stretches[-1].add(_label(event))
        elif not index or found[index - 1].kind != BARRIER:
            stretches.append(set())
    stretches[-1].add("end")
    return list(zip(stretches, stretches[1:], strict=False))


def missing(expected: Iterable[tuple[str, str]], source: str, first_line: int, path: str) -> list[str]:
    """One line per barrier of `expected` (placements of the solution's kernel) that `source` (the
    student's kernel, which starts at `first_line` of `path`) lacks, at the student's line. A
    barrier of the student's stands for one of the solution's when the access before the solution's
    comes in the stretch of code before it, and the access after in the stretch after it: the
    student may order the accesses between two barriers as they like."""
    found = events(source)
    call = "tl.debug_barrier()" if "@triton.jit" in source else "cuda.syncthreads()"
    unused = _sides(found)
    problems = []
    for before, after in expected:
        match = next((i for i, (ahead, behind) in enumerate(unused) if before in ahead and after in behind),
                     None)
        if match is not None:
            del unused[match]
            continue
        where = _unguarded(found, before, after)
        line = first_line + (where.line if where is not None else 1) - 1
        reached = " Your kernel goes on to this access without one." if where is not None else ""
        problems.append(
            f"{path}:{line}: a barrier ({call}) is missing between {_spoken(before)} and {_spoken(after)}: "
            f"the solution's threads wait there for each other.{reached} The CPU cannot show this race; "
            "a GPU can (`--racecheck`).")
    return problems


def _spoken(label: str) -> str:
    if label in ("start", "end"):
        return f"the kernel's {label}"
    kind, name = label.split(" ", 1)
    return f"the {kind} {'of' if kind == 'load' else 'to'} {name}"


def _unguarded(found: list[Event], before: str, after: str) -> Event | None:
    """The first access labelled `after` that follows one labelled `before` (or the kernel's start)
    with no barrier between them."""
    seen = before == "start"
    for event in found:
        if event.kind == BARRIER:
            seen = False
        elif _label(event) == after and seen:
            return event
        elif _label(event) == before:
            seen = True
    return None


# ------------------------------------------------------------------------------------ the data


def read() -> dict[str, list[tuple[str, str]]]:
    """The committed placements of the solutions' barriers: exercise id -> [(before, after), ...]."""
    if not DATA.is_file():
        return {}
    recorded = json.loads(DATA.read_text())
    return {exercise: [tuple(pair) for pair in pairs] for exercise, pairs in recorded.items()}


def of_solutions(exercises: Iterable[str], sources: Mapping[str, str]) -> dict[str, list[list[str]]]:
    """The placements of the barriers of each exercise's solution kernel that has any; `sources`
    maps a solutions module's name to its text."""
    from course.core.source import function_in_file

    found = {}
    for exercise in sorted(exercises):
        module, function = exercise.split(".", 1)
        text = sources.get(module)
        kernel = function_in_file(text, function) if text is not None else None
        pairs = placements(events(kernel)) if kernel is not None else []
        if pairs:
            found[exercise] = [list(pair) for pair in pairs]
    return found


def rendered(solutions: Path, exercises: Iterable[str]) -> str:
    """barriers.json as the solutions in `solutions` make it, for the exercises (ids) named."""
    sources = {p.stem: p.read_text() for p in solutions.glob("*.py")}
    found = of_solutions(exercises, sources)
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in found.items()) + "\n}\n"


# ------------------------------------------------------------------------------------ in a check

def race_note(exercise: str) -> str:
    """What a passing Triton check says it cannot show, and how the course checks it instead."""
    compared = (": the check compared your kernel's barriers with the solution's instead"
                if exercise in read() else "")
    return (f"(Triton's interpreter runs a block's threads in step, so no check on the CPU can show a race "
            f"between them{compared}. On a GPU, `python -m course check {exercise} --racecheck` runs "
            "compute-sanitizer's racecheck, which sees races through shared memory.)")


def kernel_problems(exercise: str, module) -> list[str]:
    """The solution's barriers that the kernel of `exercise` in `module` (a lessons or solutions
    module) lacks, each at its line."""
    import inspect

    from course.core.regions import ROOT
    from course.core.source import python_function

    expected = read().get(exercise)
    kernel = getattr(module, exercise.split(".", 1)[1], None)
    if not expected or kernel is None:
        return []
    function = python_function(kernel)
    try:
        lines, first_line = inspect.getsourcelines(function)
        path = Path(inspect.getsourcefile(function)).resolve()
    except (OSError, TypeError):
        return []
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    return missing(expected, "".join(lines), first_line, where)


def is_triton(exercise: str, module) -> bool:
    kernel = getattr(module, exercise.split(".", 1)[1], None)
    return type(kernel).__module__.startswith("triton")
