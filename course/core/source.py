"""Show kernels as source: a function's code, or the diff between two rungs of a ladder.

What notebooks show of the code is generated from the modules, never pasted, so the text cannot
drift from the code (`course.answers` shows a rung's change this way, once the check passed).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap

from course.core.regions import is_marker


def python_function(kernel):
    """The Python function behind a Numba kernel (py_func on a GPU, fn in the simulator)."""
    return getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel


def source_of(function) -> str:
    """The dedented source of a Python function or a Numba kernel."""
    plain = python_function(function)
    if not callable(plain):
        raise TypeError(f"function must be a function or a kernel, got {type(function).__name__}")
    return textwrap.dedent(inspect.getsource(plain))


def without_docstring(function) -> str:
    """A function's source with its docstring left out (the code alone, to read next to the text)."""
    source = source_of(function)
    quotes = '"' * 3
    start = source.index(quotes)
    end = source.index(quotes, start + 3) + 3
    return source[:start].rstrip() + "\n" + source[end:].lstrip("\n")


def diff(before, after, context: int = 3) -> str:
    """A unified diff from one function's source to another's, e.g. rung 3's kernel to rung 4's."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be a non-negative int, got {context!r}")
    name_old = getattr(before, "__qualname__", getattr(before, "__name__", "before"))
    name_new = getattr(after, "__qualname__", getattr(after, "__name__", "after"))
    return diff_sources(source_of(before), source_of(after), name_old, name_new, context)


def diff_sources(old: str, new: str, name_old: str, name_new: str, context: int = 3) -> str:
    """The unified diff of two functions' source texts, without the exercise markers."""
    # The exercise markers are the course's bookkeeping, not part of the change.
    old, new = _without_markers(old), _without_markers(new)
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), fromfile=name_old,
                                 tofile=name_new, n=context, lineterm="")
    return "\n".join(lines)


def function_in_file(text: str, name: str) -> str | None:
    """The dedented source of the first function called `name` in a module's text (decorators
    included), read without importing the module; None if there is none."""
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            last = node.end_lineno
            # Comments right after the last statement, indented into the body, are the function's
            # too (a closing `### END SOLUTION` is a comment, which the syntax tree does not hold).
            while last < len(lines) and lines[last].lstrip().startswith("#") \
                    and len(lines[last]) - len(lines[last].lstrip()) > node.col_offset:
                last += 1
            return textwrap.dedent("\n".join(lines[first - 1 : last]))
    return None


def _without_markers(source: str) -> str:
    return "".join(line for line in source.splitlines(keepends=True) if not is_marker(line))
