"""Which implementation the notebooks and checks use: `lessons/` (students) or `solutions/`."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from course.core import regions

IMPL_ENV = "COURSE_IMPL"
IMPLEMENTATIONS = ("lessons", "solutions")


class SolutionsMissing(ImportError):
    """solutions/ is not here: this is a hand-out (`python -m course release --handout`)."""


class TritonMissing(ImportError):
    """The module holds Triton kernels and Triton is not installed (it ships for Linux only)."""


def has_solutions() -> bool:
    """True in the course's own repository; False in a hand-out, which has no solutions/."""
    return (regions.ROOT / "solutions" / "__init__.py").is_file()


def bench_impl() -> str:
    """What benches time: the reference solutions where they are here, else (in a hand-out) the
    student's lessons/, whose times the notebooks then set beside the committed measurements."""
    return "solutions" if has_solutions() else "lessons"


def impl_name() -> str:
    """`lessons` by default (the copy students edit), `solutions` when COURSE_IMPL=solutions."""
    name = os.environ.get(IMPL_ENV, "lessons").strip() or "lessons"
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"{IMPL_ENV} must be one of {IMPLEMENTATIONS}, got {name!r}")
    return name


_IMPORTED_VERSION: dict[str, tuple[int, int]] = {}  # module name -> (mtime_ns, size) of the file imported


def _file_version(loaded: ModuleType) -> tuple[int, int] | None:
    try:
        status = os.stat(loaded.__file__)
    except (OSError, TypeError):
        return None
    return status.st_mtime_ns, status.st_size


def _import_fresh(name: str) -> ModuleType:
    """Import `name`, again if its file changed since: a student who edits lessons/trees.py and reruns a
    check cell gets their new code checked, without restarting the notebook's kernel."""
    loaded = sys.modules.get(name)
    if loaded is not None and _IMPORTED_VERSION.get(name) not in (None, _file_version(loaded)):
        loaded = importlib.reload(loaded)
    elif loaded is None:
        loaded = importlib.import_module(name)
    _IMPORTED_VERSION[name] = _file_version(loaded)
    return loaded


def load(module: str, impl: str | None = None) -> ModuleType:
    """Import `<impl>.<module>`, e.g. load("trees") -> lessons.trees or solutions.trees."""
    impl = impl or impl_name()
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if not module.isidentifier():
        raise ValueError(f"module must be a module name such as 'trees', got {module!r}")
    if impl == "solutions" and not has_solutions():
        raise SolutionsMissing(
            f"cannot load solutions.{module}: this copy of the course has no solutions/ (a hand-out "
            f"leaves them out). Use your own copy, course.impl.load({module!r}).")
    try:
        return _import_fresh(f"{impl}.{module}")
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        raise TritonMissing(
            f"{impl}.{module} holds Triton kernels, and Triton is not installed here: it publishes "
            "wheels for Linux only. On Windows run the course in WSL 2; on macOS use a Linux machine "
            "or a cloud notebook. The Numba notebooks (01-11c) run here.") from error
