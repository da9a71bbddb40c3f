"""Launching Numba CUDA kernels on torch tensors, the same way on a GPU and in the simulator.

On a GPU a torch CUDA tensor is handed to Numba without a copy
(`numba.cuda.as_cuda_array`); in the simulator a CPU tensor is handed over as a
NumPy view of the same memory, so what the kernel writes lands in the tensor.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course.core import runtime, simulator
from course.core.stubs import require_written

MAX_THREADS_PER_BLOCK = 1024


def never_written(dtype):
    """What an output holds before its kernel writes it: NaN for floats, the most negative
    value for signed integers, the largest for unsigned ones, True for bools.

    Fresh GPU memory often holds zeros, and a kernel that assumed so (a DFS that adds into
    end[] without first setting it) passes by luck; a sentinel makes every unwritten or
    assumed-zero element show up in the check, on a GPU as in the simulator.
    """
    import torch

    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True  # no value is free; True makes an unwritten mask entry a visible key
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def poisoned_empty(shape, *, dtype, device):
    """A new tensor for a kernel to write, filled with `never_written(dtype)`: launchers
    allocate their outputs with this, so a check sees any element the kernel left alone."""
    import torch

    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return torch.full(shape, never_written(dtype), dtype=dtype, device=device)


def _as_dims(dims, name: str) -> tuple[int, ...]:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not 1 <= len(dims) <= 3 or not all(isinstance(x, int) and x >= 1 for x in dims):
        raise ValueError(f"{name} must be 1 to 3 positive integers, got {dims!r}")
    return dims


def kernel_argument(value, name: str = "argument"):
    """A torch tensor as the array a Numba kernel takes; anything else unchanged."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    if runtime.SIMULATOR:
        if value.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor in the simulator, got device {value.device}")
        return value.detach().numpy()
    if value.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor on a GPU, got device {value.device}")
    from numba import cuda

    return cuda.as_cuda_array(value.detach())


def launch(kernel, grid, block, *args, names: Sequence[str] | None = None) -> None:
    """Launch `kernel[grid, block](*args)`, converting torch tensors.

    Refuses a kernel that is still an exercise stub (a GPU would silently skip the
    raise inside it) and, in the simulator, one that a GPU could not compile.
    """
    grid, block = _as_dims(grid, "grid"), _as_dims(block, "block")
    threads = 1
    for extent in block:
        threads *= extent
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"block has {threads} threads; CUDA allows at most {MAX_THREADS_PER_BLOCK}")
    require_written(kernel)
    if runtime.SIMULATOR:
        simulator.install()
        simulator.lint_kernel(kernel)
    names = list(names) if names is not None else [f"argument {i}" for i in range(len(args))]
    converted = [kernel_argument(arg, name) for arg, name in zip(args, names, strict=True)]
    global _last
    _last = Launch(kernel, grid, block, tuple(converted))
    if _recording is not None:
        _recording.append(_last)
    _last()


@dataclass(frozen=True)
class Launch:
    """One kernel launch with its arguments already converted: calling it launches it again."""

    kernel: object
    grid: tuple[int, ...]
    block: tuple[int, ...]
    arguments: tuple

    def __call__(self) -> None:
        self.kernel[self.grid, self.block](*self.arguments)


_last: Launch | None = None
_recording: list[Launch] | None = None


def last_launch() -> Launch:
    """The most recent launch, to time the kernel alone, without its launcher's argument checks.

    A launcher checks its inputs (which waits for the GPU) and allocates its output; a
    benchmark that wants the kernel's own time calls the launcher once, then times this.
    """
    if _last is None:
        raise RuntimeError("no kernel has been launched yet")
    return _last


def kernels_of(call) -> Callable[[], None]:
    """Run `call()` once and return a function that relaunches every kernel it launched,
    in order, with the same arguments: the kernels' own time, without the launcher's checks
    (for a launcher that runs more than one kernel, where `last_launch` would time one).
    """
    global _recording
    if _recording is not None:
        raise RuntimeError("kernels_of cannot be nested")
    _recording = []
    try:
        call()
        recorded = tuple(_recording)
    finally:
        _recording = None
    if not recorded:
        raise RuntimeError("the call launched no kernel")

    def relaunch() -> None:
        for one in recorded:
            one()
    relaunch.launches = recorded
    return relaunch


def specialize(function, **constants):
    """Compile a copy of a kernel function in which some module constants take other values.

    CUDA needs shared- and local-array sizes when the kernel compiles, and Numba
    freezes a kernel's module globals as compile-time constants; so a kernel written
    for "head dimension D" is compiled once per D this way. (Numbers captured from
    an enclosing function would not do: Numba types them as run-time integers.)
    """
    from numba import cuda

    missing = sorted(set(constants) - set(function.__globals__))
    if missing:
        raise ValueError(f"constants must already be module constants of {function.__name__}; "
                         f"not found: {', '.join(missing)}")
    copy = types.FunctionType(function.__code__, {**function.__globals__, **constants},
                              function.__name__, function.__defaults__, function.__closure__)
    copy.__qualname__, copy.__doc__ = function.__qualname__, function.__doc__
    return cuda.jit(copy)
