"""Cover the blind spots of Numba's CUDA simulator, so that bugs a GPU would expose fail here too.

The simulator runs each CUDA thread as a Python thread over NumPy arrays. Left as
it is, it differs from a GPU in ways that let wrong kernels pass:

1. Shared memory persists from one block to the next, so a block that forgets to
   load a tile reads the previous block's tile and still gets the right answer.
   We give every block fresh shared (and local) arrays filled with poison: NaN for
   floats, a huge negative number for integers.
2. Negative indices wrap around (NumPy semantics) instead of reading out of bounds.
   We make every index into a kernel argument, shared or local array raise.
3. Array sizes of `cuda.local.array` / `cuda.shared.array` may be run-time values
   there, while a GPU needs compile-time constants. `lint_kernel` rejects them.
4. A `cuda.syncthreads()` that only some threads of a block reach (one inside an `if` on the
   thread index, or after some threads returned) lets the others go on as if all had arrived,
   while on a GPU it is undefined (a hang, or a barrier that waits for nobody). We raise
   DivergentBarrier, naming the barrier's line and the threads that did not reach it. So do
   threads of one block waiting at different barriers (two `cuda.syncthreads()` lines).

Races show up only as run-to-run differences: the checks run kernels twice.
Warp shuffles are not implemented by the simulator: course kernels do not use them.
"""

from __future__ import annotations

import ast
import sys
import threading

import numpy as np

from course.core.source import python_function, source_of

_installed = False


class SimulatorIndexError(IndexError):
    """A kernel used a negative index, which a GPU would turn into an out-of-bounds access."""


class DivergentBarrier(RuntimeError):
    """A barrier that only some threads of a block reached: undefined on a GPU."""


def _reject_negative(index, where: str):
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if isinstance(part, (int, np.integer)) and not isinstance(part, bool) and part < 0:
            raise SimulatorIndexError(
                f"negative index {int(part)} into {where}: the simulator would wrap it around, "
                "a GPU reads or writes out of bounds"
            )


class StrictArray(np.ndarray):
    """A NumPy array that refuses negative indices, like device memory would."""

    _where = "a kernel array"

    def __getitem__(self, index):
        _reject_negative(index, self._where)
        return super().__getitem__(index)

    def __setitem__(self, index, value):
        _reject_negative(index, self._where)
        super().__setitem__(index, value)

    def __repr__(self):  # NumPy's printer indexes with -1; print the plain array instead
        return repr(self.view(np.ndarray))

    def __str__(self):
        return str(self.view(np.ndarray))


def poisoned(shape, dtype, where: str) -> StrictArray:
    """A fresh array full of poison: NaN for floats, a large negative number for integers."""
    dtype = np.dtype(dtype)
    array = np.empty(shape, dtype).view(StrictArray)
    array._where = where
    if dtype.kind == "f":
        array.fill(np.nan)
    elif dtype.kind in "iu":
        array.fill(np.iinfo(dtype).min // 2 if dtype.kind == "i" else np.iinfo(dtype).max // 2)
    elif dtype.kind == "b":
        array.fill(True)
    return array


_shared_lock = threading.Lock()


def install() -> None:
    """Patch the simulator once. Call only when the simulator is in use."""
    global _installed
    if _installed:
        return
    from course.core.runtime import SIMULATOR

    if not SIMULATOR:
        return
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator import kernelapi
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray

    def as_numpy_dtype(dtype):
        if isinstance(dtype, kernelapi.types.Type):
            return kernelapi.numpy_support.as_dtype(dtype)
        return dtype

    original_shared = kernelapi.FakeCUDAShared.array

    def shared_array(self, shape, dtype, alignment=None):
        if shape == 0:  # dynamic shared memory: keep the simulator's own buffer
            return original_shared(self, shape, dtype, alignment)
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        frame = sys._getframe(1)  # the simulator keys shared arrays by the line that declares them
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with _shared_lock:  # the block's threads run concurrently: all must get the same array
            found = self._allocations.get(caller)
            if found is None:
                found = poisoned(shape, as_numpy_dtype(dtype), "shared memory")
                self._allocations[caller] = found
        return found

    def local_array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        return poisoned(shape, as_numpy_dtype(dtype), "a local array")

    original_syncthreads = sim_kernel.BlockThread.syncthreads

    def syncthreads(self):
        self.barrier_line = _kernel_line()
        return original_syncthreads(self)

    def run_block(self, grid_point, *args):
        context = sim_kernel._get_kernel_context()
        if context is not None:
            context.shared._allocations.clear()  # each block starts with fresh, poisoned shared memory
        return _run_block(sim_kernel.BlockThread, self, grid_point, *args)

    def checked_getitem(self, index):
        _reject_negative(index, "a kernel argument")
        return original_getitem(self, index)

    def checked_setitem(self, index, value):
        _reject_negative(index, "a kernel argument")
        return original_setitem(self, index, value)

    original_getitem = FakeWithinKernelCUDAArray.__getitem__
    original_setitem = FakeWithinKernelCUDAArray.__setitem__
    kernelapi.FakeCUDAShared.array = shared_array
    kernelapi.FakeCUDALocal.array = local_array
    sim_kernel.BlockManager.run = run_block
    sim_kernel.BlockThread.syncthreads = syncthreads
    FakeWithinKernelCUDAArray.__getitem__ = checked_getitem
    FakeWithinKernelCUDAArray.__setitem__ = checked_setitem
    _installed = True


def _kernel_line() -> str:
    """'file.py:42', the kernel's line that called a barrier: the first frame outside the simulator."""
    frame = sys._getframe(1)
    while frame is not None and ("numba" in frame.f_code.co_filename or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return "an unknown line" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _threads(threads) -> str:
    """'threads (0, 0, 0), (1, 0, 0) and 3 more', by threadIdx."""
    names = sorted(tuple(t.threadIdx) for t in threads)
    shown = ", ".join(str(n) for n in names[:4])
    return f"threads {shown}" + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _divergence(threads, waiting) -> str:
    """Why the barrier that `waiting` (every live thread) waits at is not one every thread reached:
    '' when it is."""
    lines: dict[str, list] = {}
    for thread in waiting:
        lines.setdefault(thread.barrier_line, []).append(thread)
    block = f"block {tuple(next(iter(threads)).blockIdx)}"
    if len(lines) > 1:
        where = "; ".join(f"{_threads(group)} at {line}" for line, group in sorted(lines.items()))
        return (f"cuda.syncthreads(): the threads of {block} wait at different barriers ({where}). "
                "On a GPU every thread of a block must reach the same barrier.")
    gone = [t for t in threads if t not in waiting]
    if gone:
        return (f"cuda.syncthreads() at {next(iter(lines))} was reached by only some threads of {block}: "
                f"{_threads(gone)} had finished the kernel without reaching it (a barrier inside an `if` "
                "that not all threads take, or after an early return?). On a GPU that is undefined.")
    return ""


def _run_block(thread_class, manager, grid_point, *args):
    """The simulator's BlockManager.run: start a thread per threadIdx, release them together at each
    barrier, raise the first thread's exception; and refuse a barrier not every thread reached."""
    threads = []
    for index in np.ndindex(*manager._block_dim):
        thread = thread_class(lambda: manager._f(*args), manager, grid_point, index, manager._debug)
        thread.start()
        threads.append(thread)

    def stop_all():
        for thread in threads:  # the others unblock, see the abort flag, and raise out of the kernel
            thread.abort = True
            thread.syncthreads_blocked = False
            thread.syncthreads_event.set()

    live = set(threads)
    while live:
        # Every thread, the ended ones too: a thread that crashed (an index out of bounds) has left the
        # live set, and its crash, not the barrier the others then wait at alone, is the student's bug.
        failed = next((t for t in threads if t.exception and not t.syncthreads_blocked), None)
        if failed is not None:
            stop_all()
            raise failed.exception[0].with_traceback(failed.exception[1])
        waiting = {t for t in live if t.syncthreads_blocked}
        if waiting and waiting == live:
            problem = _divergence(threads, waiting)
            if problem:
                stop_all()
                raise DivergentBarrier(problem)
            for thread in waiting:
                thread.syncthreads_blocked = False
                thread.syncthreads_event.set()
        live = {t for t in live if t.is_alive()}
    for thread in threads:
        if thread.exception:
            raise thread.exception[0].with_traceback(thread.exception[1])


class KernelLintError(ValueError):
    """A kernel uses a construct that the simulator accepts but a GPU rejects."""


def lint_kernel(kernel) -> None:
    """Reject run-time sized local/shared arrays, which pass in the simulator and fail on a GPU."""
    py_func = python_function(kernel)
    try:
        source = source_of(kernel)
    except (OSError, TypeError):
        return
    constants = {
        name
        for name, value in py_func.__globals__.items()
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    }
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if not (
            node.func.attr == "array"
            and isinstance(owner, ast.Attribute)
            and owner.attr in ("local", "shared")
            and node.args
        ):
            continue
        shape = node.args[0]
        for extent in shape.elts if isinstance(shape, ast.Tuple) else [shape]:
            _lint_extent(extent, constants, f"kernel {py_func.__name__}: cuda.{owner.attr}.array")


def _lint_extent(extent: ast.expr, constants: set[str], where: str) -> None:
    """One extent of an array shape: an int literal or the name of a module-level int constant.

    Numba does not fold arithmetic in a shape: (TILE + 1) is a run-time int64 on a GPU.
    """
    if isinstance(extent, ast.Constant) and isinstance(extent.value, int):
        return
    if isinstance(extent, ast.Name) and extent.id in constants:
        return
    text = ast.unparse(extent)
    why = ("is arithmetic, which Numba does not fold at compile time: give it a module-level "
           "name" if not isinstance(extent, ast.Name) else "is not a module-level integer constant")
    raise KernelLintError(f"{where} size {text!r} {why}. The simulator accepts it, but a GPU "
                          "needs every size at compile time.")
