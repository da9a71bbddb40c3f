"""Bad input to a launcher gets a clear error naming the argument, never a kernel crash."""

import pytest
import torch

import course
from course import oracle
from course.core import inputs
from solutions import attention, trees

DEVICE = course.torch_device()
OTHER_DEVICE = "meta"  # neither the simulator's CPU nor a GPU


def _parents(*rows):
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("parents, message", [
    (_parents([0, 0, 1]), r"parents\[0, 0\] = 0: node 0 must be the root"),
    (_parents([-1, 0, -1]), r"parents\[0, 2\] = -1: every node's parent must be a node numbered before"),
    (_parents([-1, 2, 1]), r"parents\[0, 1\] = 2"),  # a cycle 1 -> 2 -> 1
    (_parents([-1, 0, 1], [-1, 0, 7]), r"parents\[1, 2\] = 7"),  # out of range, second tree
    (_parents([-1, 1, 0]), r"parents\[0, 1\] = 1"),  # its own parent
])
def test_malformed_trees_are_named(parents, message):
    with pytest.raises(ValueError, match=message):
        trees.dfs_times(parents)


@pytest.mark.parametrize("make, error, message", [
    (lambda: [[-1, 0]], TypeError, "parents must be a torch.Tensor"),
    (lambda: torch.tensor([[-1, 0]], dtype=torch.int64, device=DEVICE), TypeError,
     "parents must have dtype int32"),
    (lambda: _parents([-1, 0])[0], ValueError, "parents must have 2 dimensions"),
    (lambda: torch.empty((1, 0), dtype=torch.int32, device=DEVICE), ValueError,
     "parents must not be empty"),
    (lambda: torch.tensor([[-1, 0]], dtype=torch.int32, device=OTHER_DEVICE), ValueError,
     "parents must be on"),
    (lambda: _parents([-1, 0, 0, 1])[:, ::2], ValueError, "parents must be contiguous"),
])
def test_wrong_types_shapes_and_devices_are_named(make, error, message):
    with pytest.raises(error, match=message):
        trees.dfs_times(make())


def test_mask_launchers_check_their_times():
    start, end = inputs.dfs_times_tensors([inputs.chain(5)], DEVICE)
    for launcher in (trees.tree_mask, trees.tree_bitmask):
        with pytest.raises(ValueError, match="start and end must have the same shape"):
            launcher(start, end[:, :4].contiguous())
        with pytest.raises(ValueError, match=r"end must hold DFS times in \[0, 5\)"):
            launcher(start, end + 9)
        with pytest.raises(ValueError, match="start must not exceed end"):
            launcher(end, start)
        with pytest.raises(TypeError, match="start must have dtype int32"):
            launcher(start.float(), end)


def test_attention_inputs_are_checked():
    q = inputs.random_tensor((2, 5, 4), 1, torch.float64)
    with pytest.raises(ValueError, match="k must have d = 4"):
        attention.flash_attention(q, q[..., :3], q)
    with pytest.raises(TypeError, match="q, k and v must share a dtype"):
        attention.flash_attention(q, q.float(), q)
    with pytest.raises(ValueError, match="q contains NaN"):
        attention.flash_attention(q * float("nan"), q, q)
    with pytest.raises(ValueError, match="block_k must be a positive int"):
        attention.flash_attention(q, q, q, block_k=0)
    hidden = torch.zeros(2, 5, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask hides every key"):
        attention.flash_attention(q, q, q, hidden)
    with pytest.raises(ValueError, match="mask must have shape"):
        attention.flash_attention(q, q, q, hidden[:, :4])
    with pytest.raises(ValueError, match="block must be a positive int"):
        attention.online_softmax(q, -1)


def test_merge_inputs_are_checked():
    out = inputs.random_tensor((3, 4), 2, torch.float64)
    lse = inputs.random_tensor((3,), 3, torch.float64)
    with pytest.raises(ValueError, match="lse_b must have shape"):
        attention.merge_attention(out, lse, out, lse[:2])
    with pytest.raises(ValueError, match="lse_a contains NaN"):
        attention.merge_attention(out, lse * float("nan"), out, lse)
    with pytest.raises(ValueError, match="out_b has NaN or inf in a row whose lse_b is finite"):
        attention.merge_attention(out, lse, out * float("nan"), lse)


def test_inputs_generators_validate_and_are_random():
    with pytest.raises(ValueError, match="n must be a positive int"):
        inputs.chain(0)
    with pytest.raises(ValueError, match="order must be"):
        inputs.random_tree(5, __import__("random").Random(0), order="inorder")
    with pytest.raises(ValueError, match="same size"):
        inputs.batch_of_trees([inputs.chain(3), inputs.chain(4)])
    values = inputs.random_tensor((64,), 0)
    assert values.std() > 0.5 and (values != 0).all()


def test_oracle_agrees_with_pyspec_ref():
    import pyspec_ref

    cases = inputs.edge_case_trees(8)
    for case in cases:
        start, end = inputs.dfs_times_tensors([case])
        mask = oracle.dense_tree_mask(start, end)[0].tolist()
        assert mask == pyspec_ref.tree_mask(list(case.parents)), case.name
    case = cases[5]
    q, k, v = (inputs.random_tensor((1, 1, case.n, 4), s, torch.float64) for s in range(3))
    start, end = inputs.dfs_times_tensors([case])
    out, lse = oracle.tree_attention(q, k, v, start, end)
    want_out, want_lse = pyspec_ref.tree_attention(q[0, 0].tolist(), k[0, 0].tolist(), v[0, 0].tolist(),
                                                   start[0].tolist(), end[0].tolist())
    assert torch.allclose(out[0, 0], torch.tensor(want_out, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(lse[0, 0], torch.tensor(want_lse, dtype=torch.float64), atol=1e-12)


def test_triton_guards():
    from course.core.validate import require_dot_block, require_interpretable_dtype

    require_dot_block(BLOCK_M=16, BLOCK_N=64)
    with pytest.raises(ValueError, match="BLOCK_K must be a power of two >= 16"):
        require_dot_block(BLOCK_K=24)
    with pytest.raises(ValueError, match="BLOCK_N must be a power of two >= 16"):
        require_dot_block(BLOCK_N=8)
    require_interpretable_dtype(torch.empty(2, dtype=torch.float16), "q")
    if course.SIMULATOR:
        with pytest.raises(TypeError, match="q is bfloat16"):
            require_interpretable_dtype(torch.empty(2, dtype=torch.bfloat16), "q")


def test_oracle_tile_mask_agrees_with_pyspec_ref():
    import pyspec_ref

    for case in inputs.edge_case_trees(8):
        start, end = inputs.dfs_times_tensors([case])
        got = oracle.tile_mask(start, end, 8)[0].tolist()
        assert got == pyspec_ref.tile_mask(start[0].tolist(), end[0].tolist(), 8), case.name


def test_tile_visibility_checks_its_times():
    from solutions import ladder_k10

    start, end = inputs.dfs_times_tensors([[-1, 0, 0]], DEVICE)
    with pytest.raises(TypeError, match="start must have dtype int32"):
        ladder_k10.tile_visibility(start.long(), end)
    with pytest.raises(ValueError, match="start and end must have the same shape"):
        ladder_k10.tile_visibility(start, end[:, :2])
    with pytest.raises(ValueError, match="end must hold DFS times"):
        ladder_k10.tile_visibility(start, end + 5)


def test_kernels_of_relaunches_every_kernel_of_a_launcher():
    from course.core.launch import kernels_of
    from solutions import ladder_k10

    start, end = inputs.dfs_times_tensors([[-1, 0, 0, 1]], DEVICE)
    q = k = v = inputs.random_tensor((1, 1, 4, 32), 0, torch.float32, DEVICE)
    out = {}
    relaunch = kernels_of(lambda: out.setdefault("first", ladder_k10.tree_attention(q, k, v, start, end)))
    kernels = [launch.kernel.py_func.__name__ for launch in relaunch.launches]
    assert kernels == ["tile_visibility_kernel", "tree_attention_kernel"]
    with pytest.raises(RuntimeError, match="launched no kernel"):
        kernels_of(lambda: None)
