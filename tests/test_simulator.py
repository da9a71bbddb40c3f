"""The simulator's blind spots are covered: stale shared memory, negative indices, local arrays."""

import numpy as np
import pytest
import torch
from numba import cuda

import course
from course.core import launch, simulator
from course.core.source import python_function

pytestmark = pytest.mark.skipif(course.on_gpu(), reason="simulator-only behaviour")
TILE = 4


@cuda.jit
def copy_through_shared(x, out, load):
    tile = cuda.shared.array(TILE, dtype=np.float32)
    i = cuda.threadIdx.x
    g = cuda.blockIdx.x * TILE + i
    if load or cuda.blockIdx.x == 0:  # with load=False only block 0 fills its tile
        tile[i] = x[g]
    cuda.syncthreads()
    out[g] = tile[i]


def test_each_block_gets_fresh_poisoned_shared_memory():
    x = torch.rand(2 * TILE)
    out = torch.empty_like(x)
    launch.launch(copy_through_shared, 2, TILE, x, out, True)
    assert torch.equal(out, x)
    launch.launch(copy_through_shared, 2, TILE, x, out, False)
    # Without the poison, block 1 would read block 0's stale tile and look plausible.
    assert torch.isnan(out[TILE:]).all() and torch.equal(out[:TILE], x[:TILE])


@cuda.jit
def read_before(x, out):
    i = cuda.threadIdx.x
    out[i] = x[i - 1]  # bug: thread 0 reads x[-1]


def test_negative_indices_raise_instead_of_wrapping():
    x, out = torch.rand(4), torch.empty(4)
    with pytest.raises(simulator.SimulatorIndexError, match="negative index -1"):
        launch.launch(read_before, 1, 4, x, out)


@cuda.jit
def runtime_sized_local(x, n):
    scratch = cuda.local.array(n, dtype=np.float32)
    scratch[0] = x[0]


def test_runtime_sized_local_arrays_are_rejected():
    with pytest.raises(simulator.KernelLintError, match="'n'"):
        launch.launch(runtime_sized_local, 1, 1, torch.rand(2), 2)


WIDTH = 32


@cuda.jit
def arithmetic_sized_shared(x):
    padded = cuda.shared.array((WIDTH, WIDTH + 1), dtype=np.float32)  # GPU: WIDTH + 1 is an int64
    padded[0, 0] = x[0]


def test_arithmetic_in_array_shapes_is_rejected():
    with pytest.raises(simulator.KernelLintError, match="'WIDTH \\+ 1' is arithmetic"):
        launch.launch(arithmetic_sized_shared, 1, 1, torch.rand(2))


def test_a_specialized_kernel_uses_its_own_constants():
    plain = python_function(arithmetic_sized_shared)
    assert python_function(launch.specialize(plain, WIDTH=8)).__globals__["WIDTH"] == 8
    assert plain.__globals__["WIDTH"] == 32  # the module's own value is untouched
    with pytest.raises(ValueError, match="not found: HEIGHT"):
        launch.specialize(plain, HEIGHT=8)


def test_launch_rejects_bad_configurations_and_devices():
    x = torch.rand(4)
    with pytest.raises(ValueError, match="block has 2048 threads"):
        launch.launch(read_before, 1, (2048,), x, x)
    with pytest.raises(ValueError, match="grid must be"):
        launch.launch(read_before, 0, 4, x, x)
    with pytest.raises(ValueError, match="x must be a CPU tensor"):
        launch.kernel_argument(torch.rand(2, device="meta"), "x")
