"""Which implementation the notebooks and checks use: `lessons/` (students) or `solutions/`."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

IMPL_ENV = "COURSE_IMPL"
IMPLEMENTATIONS = ("lessons", "solutions")


def impl_name() -> str:
    """`lessons` by default (the copy students edit), `solutions` when COURSE_IMPL=solutions."""
    name = os.environ.get(IMPL_ENV, "lessons").strip() or "lessons"
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"{IMPL_ENV} must be one of {IMPLEMENTATIONS}, got {name!r}")
    return name


def load(module: str, impl: str | None = None) -> ModuleType:
    """Import `<impl>.<module>`, e.g. load("trees") -> lessons.trees or solutions.trees."""
    impl = impl or impl_name()
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if not module.isidentifier():
        raise ValueError(f"module must be a module name such as 'trees', got {module!r}")
    return importlib.import_module(f"{impl}.{module}")
