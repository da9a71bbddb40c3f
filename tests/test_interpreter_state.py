"""Running a kernel under Triton's interpreter leaves Triton as it found it.

The interpreter swaps triton.language's functions and tl.tensor's methods for its own while it runs
a kernel. A @triton.jit helper called from plain Python used to leave them swapped, so that any later
GPU compile in the same process (tests/test_triton_globals.py's, say) failed with "'block_argument'
object has no attribute 'data'", depending on which tests had run before.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
import triton.language as tl

from course.core import interpreter, runtime

pytestmark = pytest.mark.skipif(not runtime.SIMULATOR, reason="the interpreter runs only without a GPU")

HELPERS = '''
import triton
import triton.language as tl


@triton.jit
def twice(x):
    return x * 2


@triton.jit
def twice_kernel(out, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    values = tl.load(out + offsets, mask=offsets < n)
    tl.store(out + offsets, twice(values), mask=offsets < n)
'''


def triton_state() -> dict:
    """What the interpreter patches: the attributes of tl.tensor and triton.language, as a lookup
    finds them (the interpreter's restore writes an inherited `__repr__` back onto tl.tensor itself,
    the same object as before)."""
    return {owner.__name__: {name: getattr(owner, name) for name in dir(owner) if name != "__annotations__"}
            for owner in (tl.tensor, tl, tl.core, tl.math)}


@pytest.fixture
def helpers(tmp_path, monkeypatch):
    (tmp_path / "interpreter_helpers.py").write_text(HELPERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("interpreter_helpers")
    interpreter.prepare(module.twice, module.twice_kernel)
    yield module
    sys.modules.pop("interpreter_helpers", None)


def test_a_helper_called_from_python_leaves_triton_as_it_was(helpers):
    before = triton_state()
    assert helpers.twice(21) == 42
    assert triton_state() == before


def test_a_launch_leaves_triton_as_it_was(helpers):
    before = triton_state()
    out = torch.arange(5, dtype=torch.int32)
    helpers.twice_kernel[(1,)](out, 5, BLOCK=8)
    assert out.tolist() == [0, 2, 4, 6, 8]
    assert triton_state() == before
