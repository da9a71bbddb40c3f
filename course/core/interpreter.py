"""Triton's interpreter (TRITON_INTERPRET=1, the simulator's half for Triton kernels): two fixes.

Every course module with Triton kernels calls `prepare(kernel, ...)` once, after defining
them; on a GPU it does nothing.

1. A run-time loop bound (`for j in range(0, count)` with `count` loaded from memory)
   fails in Triton 3.6's interpreter under NumPy >= 2.4: the interpreter holds the scalar
   as a one-element array and converts it with int(), which NumPy 2.4 refuses ("only
   0-dimensional arrays can be converted"; triton-lang/triton issue 9171, fixed upstream
   after 3.6). We convert the one element with .item(), which is what the upstream fix does.
2. The first time it runs a kernel or a @triton.jit helper, the interpreter copies every
   global of its own module (triton.runtime.interpreter) into the function's module, where
   they stay (`FunctionRewriter._compile_and_exec`). A module's names would then differ
   before and after a run, and a lesson's from its solution's; we make that copy once, at
   import, for every module that holds a kernel.
"""

from __future__ import annotations

from course.core import runtime

_scalar_fix_installed = False


def _install_scalar_fix() -> None:
    global _scalar_fix_installed
    if _scalar_fix_installed:
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _scalar_fix_installed = True


def prepare(*kernels) -> None:
    """Make `kernels` (@triton.jit functions, helpers included) ready for the interpreter;
    nothing on a GPU."""
    if not runtime.SIMULATOR:
        return
    _install_scalar_fix()
    from triton.runtime import interpreter

    for kernel in kernels:
        namespace = kernel.fn.__globals__
        for key, value in vars(interpreter).items():
            namespace.setdefault(key, value)
