"""The outputs a call makes, from the grader's own launcher: their exact dtypes and shapes.

Before a call goes to the child, the grader runs the course's own launcher of that function (its
copy of the lesson, imported apart as SHAPES) on the call's arguments, with every kernel launch
a no-op and every output allocated on the meta device (`torch.empty(..., device="meta")`: a
shape, no memory). What it returns, when every tensor of it is such an output, is the list of
(dtype, shape) the reply must hold, tensor for tensor; the grader checks the reply's header
against it before it builds any tensor (course.grading.proxy). Where the launcher cannot run so
(its code is the exercise's own hole; it reads its kernel's results on the host, which a meta
tensor refuses; it works in place), nothing is expected and the reply's layout rules alone hold.
The dry run runs only the course's code, on the grader's own arguments: it validates them as the
launcher does, and allocates nothing of the outputs' size.
"""

from __future__ import annotations

import types

import torch

from ..core import blockread

SHAPES = "course_grading_shapes"


class _NoKernel:
    """A kernel whose launch does nothing: `kernel[grid](...)`, `launch(kernel, ...)`."""

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        return None


def _no_launch(*args, **kwargs) -> None:
    return None


def _meta_empty(shape, *, dtype, device=None):
    return torch.empty((shape,) if isinstance(shape, int) else tuple(shape), dtype=dtype, device="meta")


def dry_modules(modules: dict[str, types.ModuleType], kernels: dict[str, set[str]]) -> None:
    """The lesson modules (a copy imported as SHAPES) with their kernels and launches made no-ops."""
    for name, module in modules.items():
        for attribute, value in list(vars(module).items()):
            if attribute in kernels.get(name, ()) or (attribute.endswith("_kernel") and callable(value)):
                setattr(module, attribute, _NoKernel())
        for attribute, value in (("launch", _no_launch), ("poisoned_empty", _meta_empty),
                                 ("require_written", _no_launch), ("specialize", lambda kernel, **k: kernel)):
            if hasattr(module, attribute):
                setattr(module, attribute, value)


def expected(module: types.ModuleType | None, name: str, args: tuple, kwargs: dict) -> list | None:
    """[(dtype, shape)] of the outputs `module.name(*args, **kwargs)` makes, or None where unknown."""
    function = getattr(module, name, None) if module is not None else None
    if function is None:
        return None
    try:
        with torch.no_grad():
            result = function(*args, **kwargs)
    except Exception:  # noqa: BLE001  (a hole, a host read of a kernel's result, a refusal: unknown)
        return None
    outputs = blockread.tensors_in(result)
    if not outputs or any(t.device.type != "meta" for t in outputs):
        return None  # an argument or a tensor computed on the host: not an output the launcher allocated
    return [(t.dtype, tuple(t.shape)) for t in outputs]
