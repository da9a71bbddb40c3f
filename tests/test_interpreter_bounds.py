"""Triton's interpreter stops a load or store outside the launch's tensors, before it touches memory.

Left alone, the interpreter reads and writes any address: a store one element past a buffer
overwrites the Python heap, and the process dies later without a word. course.core.interpreter
checks every access's active lanes against the launch's tensor arguments and raises
OutOfBoundsAccess, naming the argument and the element. (The planted DeFT bugs in
tests/test_planted_bugs.py show the check's report of it, at the student's line.)
"""

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.errors import InterpreterError

from course.core import interpreter, runtime
from course.core.interpreter import OutOfBoundsAccess

pytestmark = pytest.mark.skipif(not runtime.SIMULATOR, reason="the check is the interpreter's; a GPU has "
                                "compute-sanitizer (python -m course sanitize)")

BLOCK = 16
GUARD = -7.0  # what the buffer around a kernel's output holds, and must still hold afterwards


@triton.jit
def copy_kernel(x, out, n, shift, BLOCK: tl.constexpr):
    """out[i] = x[i + shift] for i < n: with n past the end or a negative shift, out of bounds."""
    offsets = tl.arange(0, BLOCK)
    inside = offsets < n
    tl.store(out + offsets, tl.load(x + offsets + shift, mask=inside), mask=inside)


@triton.jit
def transpose_kernel(x, out, stride_row, stride_col, ROWS: tl.constexpr, COLS: tl.constexpr):
    """out = x read through its strides (x is a transposed view)."""
    rows = tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, COLS)[None, :]
    tl.store(out + rows * COLS + cols, tl.load(x + rows * stride_row + cols * stride_col))


interpreter.prepare(copy_kernel, transpose_kernel)


def guarded(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a buffer of GUARD with room on both sides, the view of `length` elements in its middle)."""
    buffer = torch.full((length + 2 * BLOCK,), GUARD)
    return buffer, buffer[BLOCK:BLOCK + length]


def stopped(error: pytest.ExceptionInfo) -> str:
    """The message of the OutOfBoundsAccess that the interpreter's InterpreterError was raised from."""
    assert isinstance(error.value.__cause__, OutOfBoundsAccess), repr(error.value.__cause__)
    return str(error.value.__cause__)


def test_a_store_one_element_past_the_end_is_stopped_before_it_writes():
    x = torch.randn(9)
    buffer, out = guarded(8)
    with pytest.raises(InterpreterError) as error:
        copy_kernel[(1,)](x, out, 9, 0, BLOCK=BLOCK)
    assert stopped(error) == ("tl.store out of bounds in 1 of its 9 active lanes: element 8 of out, which "
                              "spans elements 0 to 7 (float32, shape (8,)); nothing was written")
    assert (buffer == GUARD).all()  # not the stray lane, nor the eight good ones


def test_masked_off_lanes_past_the_end_are_fine():
    x = torch.randn(8)
    buffer, out = guarded(8)
    copy_kernel[(1,)](x, out, 8, 0, BLOCK=BLOCK)  # lanes 8 to 15 point past both tensors, masked off
    assert torch.equal(out, x)
    assert (buffer[:BLOCK] == GUARD).all() and (buffer[BLOCK + 8:] == GUARD).all()


def test_a_load_before_the_start_is_stopped():
    _, x = guarded(8)
    out = torch.zeros(8)
    with pytest.raises(InterpreterError) as error:
        copy_kernel[(1,)](x, out, 8, -1, BLOCK=BLOCK)
    assert stopped(error) == ("tl.load out of bounds in 1 of its 8 active lanes: element -1 of x, which "
                              "spans elements 0 to 7 (float32, shape (8,))")
    assert (out == 0).all()


def test_the_nearest_argument_is_named_with_the_elements_reached():
    x, out = torch.randn(4), torch.zeros(BLOCK)
    with pytest.raises(InterpreterError) as error:
        copy_kernel[(1,)](x, out, BLOCK, 2, BLOCK=BLOCK)  # reads x[2 ... 17]
    assert stopped(error).startswith("tl.load out of bounds in 14 of its 16 active lanes: elements 4 to 17 "
                                     "of x, which spans elements 0 to 3")


def test_a_strided_view_is_read_in_bounds():
    # x.t() spans the same bytes as x, in another order: every strided address lies inside it
    x = torch.randn(4, 8)
    out = torch.empty(8, 4)
    transpose_kernel[(1,)](x.t(), out, *x.t().stride(), ROWS=8, COLS=4)
    assert torch.equal(out, x.t())

