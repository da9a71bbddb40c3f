"""What a lesson stub calls in place of the code a student still has to write."""

from __future__ import annotations

import ast
import functools

from course.core.source import python_function, source_of


class ExerciseNotImplemented(NotImplementedError):
    """Raised by every exercise stub until the student writes the code."""


def todo(exercise: str):
    """Stand-in for an exercise region: fails loudly, naming the exercise.

    In Python and in the CUDA simulator this raises at once. A real GPU compiles
    kernels before running them, and a raise inside a kernel is silently dropped
    there, so `course.core.launch` also refuses to launch a kernel whose source still
    calls todo() (see `kernel_stub_name`).
    """
    raise ExerciseNotImplemented(
        f"not implemented yet: exercise {exercise}. Open the lessons/ file, write the code "
        "where the todo(...) line stands, then delete that line."
    )


def kernel_stub_name(kernel) -> str | None:
    """The exercise a kernel's source still leaves undone, or None when it is written."""
    return _stub_in(python_function(kernel))


@functools.cache  # parsing the source costs milliseconds, and launch() asks before every launch
def _stub_in(function) -> str | None:
    try:
        source = source_of(function)
    except (OSError, TypeError):
        return None
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "todo"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            return str(node.args[0].value)
    return None


def require_written(*kernels) -> None:
    """Refuse to launch kernels whose source still calls todo(): a GPU would drop the raise
    (Numba) or refuse to compile the call (Triton), and Triton's interpreter would bury the
    stub's message inside its own error. Names the first missing exercise."""
    for kernel in kernels:
        stub = kernel_stub_name(kernel)
        if stub is not None:
            raise ExerciseNotImplemented(
                f"not implemented yet: exercise {stub}. The kernel still calls todo(...): write its "
                "body in the lessons/ file and delete that line."
            )
