"""Triton's interpreter (TRITON_INTERPRET=1, the simulator's half for Triton kernels): three fixes.

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
3. The interpreter turns tl.load and tl.store into reads and writes of raw addresses in the
   Python process, unchecked: a store past the end of a buffer overwrites the heap, and the
   process dies later ("corrupted size vs. prev_size") without a word about the kernel. So
   every load, store and atomic first checks that its active lanes (those its mask lets
   through) address bytes of the launch's tensor arguments, and raises OutOfBoundsAccess at
   the kernel's line otherwise, before anything is written. On a GPU the same access is
   undefined behaviour, which `python -m course sanitize` (compute-sanitizer) catches.
4. While it runs a kernel, the interpreter swaps triton.language's functions and tl.tensor's
   methods (`__index__`, `__bool__`, ...) for its own, and puts them back when the launch ends.
   A @triton.jit helper called from plain Python (a test of the helper alone) swaps them too but
   never puts them back, so every later use of Triton in the process, a GPU compile included,
   meets the interpreter's versions ("'block_argument' object has no attribute 'data'"). Such a
   call puts them back as a launch does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course.core import runtime

_installed = False
NO_ADDRESS = np.iinfo(np.uint64).max  # above every address: the lowest of no lanes


class OutOfBoundsAccess(IndexError):
    """A Triton kernel, run by the interpreter, loaded or stored outside its tensor arguments."""


@dataclass(frozen=True)
class Argument:
    """A tensor argument of a launch, as the bytes it spans (a view spans its first to last element)."""

    name: str  # the kernel's parameter name
    start: int  # the address of its first byte
    end: int  # one past its last byte
    itemsize: int
    description: str  # "float32, shape (6, 2, 16)"

    def distance(self, addresses: np.ndarray, size: int) -> np.ndarray:
        """How many bytes each access [address, address + size) lies outside this argument."""
        return np.maximum(np.maximum(self.start - addresses, addresses + size - self.end), 0)

    def elements(self, addresses: np.ndarray) -> np.ndarray:
        """The element each address falls in, counted from the argument's first (negative before it)."""
        return (addresses - self.start) // self.itemsize

    def extent(self) -> str:
        count = (self.end - self.start) // self.itemsize
        elements = f"elements 0 to {count - 1}" if count else "no element"
        return f"which spans {elements} ({self.description})"


@dataclass(frozen=True, eq=False)
class LaunchMemory:
    """The memory a launch may touch: its tensor arguments, and their union as sorted disjoint
    byte ranges [starts[i], ends[i]), so that one binary search places any address."""

    arguments: tuple[Argument, ...]
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, arguments: tuple[Argument, ...]) -> LaunchMemory:
        merged: list[list[int]] = []
        for argument in sorted(arguments, key=lambda a: a.start):
            if argument.end == argument.start:
                continue
            if merged and argument.start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], argument.end)
            else:
                merged.append([argument.start, argument.end])
        bounds = np.array(merged, dtype=np.uint64).reshape(-1, 2)
        return cls(arguments, bounds[:, 0].copy(), bounds[:, 1].copy())

    def check(self, operation: str, pointers: np.ndarray, mask: np.ndarray | None, size: int) -> None:
        """Raise OutOfBoundsAccess unless every active lane's [pointer, pointer + size) lies in one
        argument. The common case costs a min, a max and one binary search; only an access whose
        lanes do not all lie in one range pays for a search per lane."""
        if mask is not None and mask.dtype != np.bool_:
            mask = mask != 0  # a mask held as integers: the interpreter's own load reads nonzero as true
        active = np.broadcast_to(mask, pointers.shape) if mask is not None else True
        lowest = pointers.min(where=active, initial=NO_ADDRESS)
        highest = pointers.max(where=active, initial=0)
        if lowest > highest:  # no lane is active
            return
        index = int(self.starts.searchsorted(lowest, side="right")) - 1
        if index >= 0 and int(highest) + size <= int(self.ends[index]):
            return
        addresses = pointers[active] if mask is not None else pointers.ravel()
        index = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        inside = (index >= 0) & (addresses + np.uint64(size) <= self.ends[np.maximum(index, 0)])
        if not inside.all():
            raise OutOfBoundsAccess(self.describe(operation, addresses[~inside].astype(np.int64),
                                                  addresses.size, size))

    def describe(self, operation: str, outside: np.ndarray, active: int, size: int) -> str:
        """Where the stray lanes went: into which elements of the argument nearest the first of them
        (counting only the lanes nearest that argument)."""
        if not self.arguments:
            return f"tl.{operation} in a kernel that has no tensor arguments"
        distances = np.stack([argument.distance(outside, size) for argument in self.arguments])
        closest = distances.argmin(axis=0)
        nearest = self.arguments[closest[0]]
        elements = nearest.elements(outside[closest == closest[0]])
        reached = (f"element {elements.min()}" if elements.min() == elements.max()
                   else f"elements {elements.min()} to {elements.max()}")
        lanes = "its only active lane" if active == 1 else f"{outside.size} of its {active} active lanes"
        written = "" if operation == "load" else "; nothing was written"
        return (f"tl.{operation} out of bounds in {lanes}: {reached} of {nearest.name}, "
                f"{nearest.extent()}{written}")


# The memory of the launch that is running, None outside a launch (or for one that passes a
# pointer of unknown size, which we cannot check).
_launch: LaunchMemory | None = None


def tensor_arguments(name: str, value) -> list[Argument] | None:
    """The tensors that `value`, passed as `name`, hands the kernel ([] for a number or a constexpr),
    or None for an object with a pointer but no size we know."""
    import torch
    from triton.runtime.jit import TensorWrapper
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(value, tuple):
        parts = [tensor_arguments(f"{name}[{i}]", item) for i, item in enumerate(value)]
        return None if None in parts else [a for part in parts for a in part]
    if isinstance(value, TensorDescriptor):
        return tensor_arguments(f"{name}.base", value.base)
    if isinstance(value, TensorWrapper):
        value = value.base
    if isinstance(value, torch.Tensor):
        return [_tensor_argument(name, value)]
    return None if hasattr(value, "data_ptr") else []


def _tensor_argument(name: str, tensor) -> Argument:
    """The bytes from the tensor's first element to its last (a strided view skips some between)."""
    last = sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride(), strict=True))
    span = 0 if tensor.numel() == 0 else (last + 1) * tensor.element_size()
    dtype = str(tensor.dtype).removeprefix("torch.")
    return Argument(name, tensor.data_ptr(), tensor.data_ptr() + span, tensor.element_size(),
                    f"{dtype}, shape {tuple(tensor.shape)}")


def launch_memory(arguments: dict) -> LaunchMemory | None:
    found = [tensor_arguments(name, value) for name, value in arguments.items()]
    if None in found:
        return None
    return LaunchMemory.of(tuple(a for part in found for a in part))


def _element_bytes(pointers) -> int:
    # int1's bit width is 1, but it takes a byte, as in the interpreter's own pointer arithmetic
    return max(1, pointers.get_element_ty().primitive_bitwidth // 8)


def _check(operation: str, pointers, mask) -> None:
    if _launch is not None:
        # a block pointer's or a descriptor's mask comes as a bare NumPy array, other masks in a handle
        lanes = None if mask is None else mask if isinstance(mask, np.ndarray) else mask.data
        _launch.check(operation, pointers.data, lanes, _element_bytes(pointers))


def _install_bounds_check(interpreter) -> None:
    """Check every access of a launch against its tensor arguments: the host copies the interpreter
    runs on (the arguments themselves for CPU tensors) are known once `_init_args_hst` made them."""
    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    init_args_hst, run = executor._init_args_hst, executor.__call__
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store
    atomic_rmw, atomic_cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def init_args_hst_checked(self, args_dev, kwargs):
        global _launch
        args_hst, kwargs_hst = init_args_hst(self, args_dev, kwargs)
        _launch = launch_memory({**dict(zip(self.arg_names, args_hst, strict=False)), **kwargs_hst})
        return args_hst, kwargs_hst

    def run_checked(self, *args, **kwargs):
        global _launch
        try:
            return run(self, *args, **kwargs)
        finally:
            _launch = None

    def create_masked_load(self, ptrs, mask, *rest):
        _check("load", ptrs, mask)
        return masked_load(self, ptrs, mask, *rest)

    def create_masked_store(self, ptrs, value, mask, *rest):
        _check("store", ptrs, mask)
        return masked_store(self, ptrs, value, mask, *rest)

    def create_atomic_rmw(self, op, ptr, value, mask, *rest):
        _check("atomic", ptr, mask)
        return atomic_rmw(self, op, ptr, value, mask, *rest)

    def create_atomic_cas(self, ptr, *rest):
        _check("atomic_cas", ptr, None)
        return atomic_cas(self, ptr, *rest)

    executor._init_args_hst, executor.__call__ = init_args_hst_checked, run_checked
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = create_atomic_rmw, create_atomic_cas


def _install_scalar_fix(interpreter) -> None:
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch_lang_tensor


def _install_helper_call_restore(interpreter) -> None:
    """A @triton.jit helper called outside a launch undoes its patches of triton.language when it
    returns (inside a launch it puts back the launch's own, which the launch undoes in turn)."""

    def call(self, *args, **kwargs):
        scope = interpreter._patch_lang(self.fn)
        try:
            function = self.rewrite()
            try:
                return function(*args, **kwargs)
            except Exception as error:
                raise interpreter.InterpreterError(repr(error)) from error
        finally:
            scope.restore()

    interpreter.InterpretedFunction.__call__ = call


def _install() -> None:
    global _installed
    if _installed:
        return
    from triton.runtime import interpreter

    _install_scalar_fix(interpreter)
    _install_bounds_check(interpreter)
    _install_helper_call_restore(interpreter)
    _installed = True


def prepare(*kernels) -> None:
    """Make `kernels` (@triton.jit functions, helpers included) ready for the interpreter;
    nothing on a GPU."""
    if not runtime.SIMULATOR:
        return
    _install()
    from triton.runtime import interpreter

    for kernel in kernels:
        namespace = kernel.fn.__globals__
        for key, value in vars(interpreter).items():
            namespace.setdefault(key, value)
