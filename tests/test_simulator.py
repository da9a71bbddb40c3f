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


@cuda.jit
def barrier_in_a_branch(x):
    i = cuda.threadIdx.x
    if i < 2:  # bug: threads 2 and 3 never reach the barrier
        cuda.syncthreads()
    x[i] = i


@cuda.jit
def barrier_after_a_return(x, out, n):
    i = cuda.threadIdx.x
    if i >= n:  # bug: threads past n leave before the barrier the others wait at
        return
    x[i] = i
    cuda.syncthreads()
    out[i] = x[n - 1 - i]


@cuda.jit
def two_barriers(x):
    i = cuda.threadIdx.x
    if i == 0:
        cuda.syncthreads()
    else:
        cuda.syncthreads()  # bug: a different barrier from thread 0's
    x[i] = i


def test_a_barrier_only_some_threads_reach_is_refused():
    only_some = (r"reached by only some threads of block \(0, 0, 0\): "
                 r"threads \(2, 0, 0\), \(3, 0, 0\) had finished")
    with pytest.raises(simulator.DivergentBarrier, match=only_some):
        launch.launch(barrier_in_a_branch, 1, 4, torch.zeros(4))
    with pytest.raises(simulator.DivergentBarrier, match="test_simulator.py"):
        launch.launch(barrier_after_a_return, 1, 4, torch.zeros(4), torch.zeros(4), 3)
    out = torch.zeros(4)
    launch.launch(barrier_after_a_return, 1, 4, torch.zeros(4), out, 4)  # every thread reaches it: fine
    assert out.tolist() == [3, 2, 1, 0]


def test_threads_at_different_barriers_are_refused():
    with pytest.raises(simulator.DivergentBarrier, match="wait at different barriers"):
        launch.launch(two_barriers, 1, 4, torch.zeros(4))
