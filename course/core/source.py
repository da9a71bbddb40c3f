"""Show kernels as source: a function's code, or the diff between two rungs of a ladder.

Notebooks show each rung's one change as a diff generated from the solution
modules, never pasted, so the text cannot drift from the code.
"""

from __future__ import annotations

import difflib
import inspect
import textwrap


def python_function(kernel):
    """The Python function behind a Numba kernel (py_func on a GPU, fn in the simulator)."""
    return getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel


def source_of(function) -> str:
    """The dedented source of a Python function or a Numba kernel."""
    plain = python_function(function)
    if not callable(plain):
        raise TypeError(f"function must be a function or a kernel, got {type(function).__name__}")
    return textwrap.dedent(inspect.getsource(plain))


def region(function) -> str:
    """The lines of a function's first exercise region (between `### BEGIN SOLUTION` and
    `### END SOLUTION`), dedented, without `### LESSON` lines: the reference answer, which
    notebooks print after their check."""
    lines = source_of(function).splitlines()
    begins = [n for n, line in enumerate(lines) if line.strip().startswith("### BEGIN SOLUTION")]
    if not begins:
        raise ValueError(f"{getattr(function, '__name__', function)!r} has no exercise region")
    first = begins[0]
    last = next(n for n in range(first, len(lines)) if lines[n].strip() == "### END SOLUTION")
    body = [line for line in lines[first + 1:last] if not line.strip().startswith("### LESSON")]
    return textwrap.dedent("\n".join(body)).strip("\n")


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
    # The exercise markers are the course's bookkeeping, not part of the change.
    old, new = (_without_markers(source_of(f)) for f in (before, after))
    name_old = getattr(before, "__qualname__", getattr(before, "__name__", "before"))
    name_new = getattr(after, "__qualname__", getattr(after, "__name__", "after"))
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), fromfile=name_old,
                                 tofile=name_new, n=context, lineterm="")
    return "\n".join(lines)


def _without_markers(source: str) -> str:
    return "".join(line for line in source.splitlines(keepends=True)
                   if not line.strip().startswith(("### BEGIN SOLUTION", "### END SOLUTION", "### LESSON")))
