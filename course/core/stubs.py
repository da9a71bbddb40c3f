"""What a lesson stub calls in place of the code a student still has to write."""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from pathlib import Path

from course.core.regions import ROOT
from course.core.source import python_function, source_of


class ExerciseNotImplemented(NotImplementedError):
    """Raised by every exercise stub until the student writes the code."""


def describe_hole(exercise: str, region: int | None = None, lines: int | None = None,
                  defines: str = "") -> str:
    """'exercise ladder_k4.tree_attention_kernel, region 3 (about 6 lines; defines key)': what a stub
    stands for, in the words the notebooks use."""
    text = f"exercise {exercise}"
    if region is not None:
        text += f", region {region}"
    details = [f"about {lines} line{'s' if lines != 1 else ''}"] if lines else []
    details += [f"defines {defines}"] if defines else []
    return text + (f" ({'; '.join(details)})" if details else "")


def _shown_path(filename: str) -> str:
    """lessons/ladder_k4.py rather than an absolute path, when the file is part of the course."""
    try:
        return Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return filename


def todo(exercise: str, region: int | None = None, lines: int | None = None, defines: str = ""):
    """Stand-in for an exercise region: fails loudly, naming the exercise, the region (numbered as
    the notebook numbers them), about how many lines go there and which names they must define
    for the code after them.

    In Python and in the CUDA simulator this raises at once. A real GPU compiles
    kernels before running them, and a raise inside a kernel is silently dropped
    there, so `course.core.launch` also refuses to launch a kernel whose source still
    calls todo() (see `kernel_stub_name`).
    """
    where = _shown_path(sys._getframe(1).f_code.co_filename)
    raise ExerciseNotImplemented(
        f"not implemented yet: {describe_hole(exercise, region, lines, defines)}. Open {where}, write "
        "the code where the todo(...) line stands, then delete that line."
    )


def kernel_stub_name(kernel) -> str | None:
    """The exercise a kernel's source still leaves undone, or None when it is written."""
    if hasattr(kernel, "remote_stub"):  # a kernel graded in a sandbox, read there (course.grading.proxy)
        return kernel.remote_stub
    call = _stub_in(python_function(kernel))
    return None if call is None else str(call.args[0].value)


@functools.cache  # parsing the source costs milliseconds, and launch() asks before every launch
def _stub_in(function) -> ast.Call | None:
    """The first todo(...) call in a function's source (top down), or None."""
    try:
        source = source_of(function)
    except (OSError, TypeError):
        return None
    stubs = [node for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "todo"
             and node.args and isinstance(node.args[0], ast.Constant)]
    # ast.walk goes breadth first; the student reads top down.
    return min(stubs, key=lambda node: node.lineno, default=None)


def _stub_description(call: ast.Call) -> str:
    """describe_hole() of a todo(...) call read from source (its arguments are literals)."""
    keywords = {k.arg: k.value.value for k in call.keywords if isinstance(k.value, ast.Constant)}
    return describe_hole(str(call.args[0].value), **keywords)


def require_written(*kernels) -> None:
    """Refuse to launch kernels whose source still calls todo(): a GPU would drop the raise
    (Numba) or refuse to compile the call (Triton), and Triton's interpreter would bury the
    stub's message inside its own error. Names the first missing exercise and its region."""
    for kernel in kernels:
        function = python_function(kernel)
        call = _stub_in(function)
        if call is not None:
            try:
                where = _shown_path(inspect.getsourcefile(function) or "the lessons/ file")
            except TypeError:
                where = "the lessons/ file"
            raise ExerciseNotImplemented(
                f"not implemented yet: {_stub_description(call)}. The kernel still calls todo(...): "
                f"write that code in {where} and delete the todo line."
            )
