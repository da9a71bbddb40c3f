"""Turn an exception raised by a student's kernel or launcher into the place it happened.

In the simulator a Numba kernel runs as Python, and so does a Triton kernel under
Triton's interpreter, so the traceback holds a frame in the student's own file (for
Triton, in the error the interpreter's InterpreterError was raised from). We
name that file, line and source line, and for an out-of-bounds access read the
array and the index from the frame's variables, as a GPU debugger would.
"""

from __future__ import annotations

import ast
import linecache
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

# Files under these folders are the kernels students write (or their reference solutions).
STUDENT_FOLDERS = ("lessons", "solutions")
# The simulator prefixes a kernel's exception with the thread and block that raised it.
THREAD_PREFIX = re.compile(r"^tid=\[[^\]]*\] ctaid=\[[^\]]*\]:\s*")
# Index expressions we evaluate again to name the index: names, numbers and arithmetic only,
# so reading them cannot change anything.
SAFE_INDEX_NODES = (ast.Expression, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.BinOp,
                    ast.UnaryOp, ast.operator, ast.unaryop, ast.Attribute)


@dataclass(frozen=True)
class Crash:
    """What a check says about an exception: kept as text, so no kernel frame stays alive."""

    kind: str  # the exception's type, e.g. "IndexError"
    message: str  # its message without the simulator's thread prefix
    thread: str  # "tid=[14, 10, 0] ctaid=[0, 0, 0]" in the simulator, else ""
    place: str  # "lessons/trees.py:82 in tree_mask_kernel", or "" outside the student's files
    source: str  # the source line, stripped
    access: str  # "start[b, k] is start[0, 10], but start has shape (1, 1)", or ""
    traceback: str  # the whole traceback, for --verbose

    @property
    def key(self) -> tuple[str, ...]:
        """Crashes with the same key are the same error, met again in another case."""
        return (self.kind, self.place) if self.place else (self.kind, self.message)

    def lines(self) -> list[str]:
        """Where it happened, under the line that says what was raised."""
        where = [f"at {self.place}", f"    {self.source}"] if self.place else []
        access = [self.access] if self.access else []
        thread = [f"in the thread {self.thread}"] if self.thread else []
        return where + access + thread


def describe(raised: BaseException) -> Crash:
    remote = getattr(raised, "remote_crash", None)
    if isinstance(remote, Crash):  # raised in a grading child and described there (course.grading.proxy)
        return remote
    error = original_error(raised)
    message = str(error)
    thread_match = THREAD_PREFIX.match(message)
    thread = thread_match.group(0).rstrip(": \t") if thread_match else ""
    message = message[thread_match.end():] if thread_match else message
    tb = student_traceback(error.__traceback__)
    place = source = access = ""
    if tb is not None:
        frame, path = tb.tb_frame, Path(tb.tb_frame.f_code.co_filename)
        place = f"{path.parent.name}/{path.name}:{tb.tb_lineno} in {frame.f_code.co_name}"
        line = linecache.getline(str(path), tb.tb_lineno)
        source = line.strip()
        if isinstance(error, IndexError):
            indent = len(line) - len(line.lstrip())
            access = out_of_bounds_access(source, frame, _failing_columns(tb, indent), message)
    full = "".join(traceback.format_exception(type(raised), raised, raised.__traceback__))
    return Crash(type(error).__name__, message, thread, place, source, access, full)


def original_error(error: BaseException) -> BaseException:
    """The innermost error that a wrapper re-raised `from` (Triton's interpreter raises an
    InterpreterError from the kernel's own error) and that still passes through the student's
    file; else the error itself."""
    chain = [error]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain:
        chain.append(chain[-1].__cause__)
    in_student_file = [e for e in chain if student_traceback(e.__traceback__) is not None]
    return in_student_file[-1] if in_student_file else error


def student_traceback(tb):
    """The innermost traceback entry in a student's file: the kernel, else the launcher."""
    found = None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).parent.name in STUDENT_FOLDERS:
            found = tb
        tb = tb.tb_next
    return found


def _failing_columns(tb, indent: int) -> tuple[int, int] | None:
    """The columns of the expression that raised, in the stripped line (Python 3.11 records them)."""
    positions = list(tb.tb_frame.f_code.co_positions())
    index = tb.tb_lasti // 2
    if index >= len(positions):
        return None
    line, _, start, end = positions[index]
    if line != tb.tb_lineno or start is None or end is None:
        return None
    return start - indent, end - indent


# NumPy's message for an index past the end: which axis, and its size.
NUMPY_OUT_OF_BOUNDS = re.compile(r"index (-?\d+) is out of bounds for axis (\d+) with size (\d+)")


def out_of_bounds_access(source: str, frame, columns: tuple[int, int] | None, message: str) -> str:
    """'' unless a subscript on the line indexes past its array's shape: then which, and with what.

    Of several such subscripts, the one the traceback points at wins, else the one that fits
    NumPy's message (index, axis, size), else the first.
    """
    try:
        tree = ast.parse(_as_statement(source))
    except SyntaxError:  # a statement over several lines: say nothing rather than guess
        return ""
    found = [access for node in ast.walk(tree)
             if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
             for access in [_out_of_bounds(node, frame)] if access is not None]
    if not found:
        return ""
    numpy = NUMPY_OUT_OF_BOUNDS.search(message)
    for access in found:
        if columns == access.columns:
            return access.text()
    for access in found:
        if numpy and access.fits(*(int(g) for g in numpy.groups())):
            return access.text()
    return found[0].text()


def _as_statement(source: str) -> str:
    """The line as a statement Python parses, its columns unchanged: a header such as
    `if start[b, k] <= start[b, q]:` gets a body, and `elif` becomes an `if` of the same width."""
    if not source.endswith(":"):
        return source
    header = "if  " + source[4:] if source.startswith("elif ") else source
    return header + " pass"


@dataclass(frozen=True)
class Access:
    """One subscript on the failing line, evaluated in the kernel thread's frame."""

    array: str
    index_text: str
    index: tuple[int, ...]
    shape: tuple[int, ...]
    columns: tuple[int, int]

    def fits(self, index: int, axis: int, size: int) -> bool:
        return axis < len(self.index) and self.index[axis] == index and self.shape[axis] == size

    def text(self) -> str:
        values = ", ".join(str(i) for i in self.index)
        return (f"{self.array}[{self.index_text}] is {self.array}[{values}], "
                f"but {self.array} has shape {self.shape}")


def _out_of_bounds(node: ast.Subscript, frame) -> Access | None:
    name = node.value.id
    array = frame.f_locals.get(name, frame.f_globals.get(name))
    shape = tuple(int(n) for n in getattr(array, "shape", ()) or ())
    index = _evaluate(node.slice, frame)
    if not shape or index is None:
        return None
    parts = index if isinstance(index, tuple) else (index,)
    if not all(isinstance(p, int) for p in parts):
        return None
    if not any(p < 0 or p >= extent for p, extent in zip(parts, shape, strict=False)):
        return None
    index_text = ast.unparse(node.slice)
    if isinstance(node.slice, ast.Tuple) and index_text.startswith("("):
        index_text = index_text[1:-1]
    return Access(name, index_text, parts, shape, (node.col_offset, node.end_col_offset))


def _evaluate(expression: ast.expr, frame):
    """The value of an index expression in the frame, or None if it is more than arithmetic."""
    tree = ast.Expression(expression)
    if not all(isinstance(n, SAFE_INDEX_NODES) for n in ast.walk(tree)):
        return None
    try:
        value = eval(compile(tree, "<index>", "eval"), frame.f_globals, dict(frame.f_locals))
    except Exception:
        return None
    if isinstance(value, tuple):
        return tuple(_as_int(v) for v in value)
    return _as_int(value)


def _as_int(value):
    try:
        return int(value) if not isinstance(value, bool) and float(value).is_integer() else value
    except (TypeError, ValueError):
        return value
