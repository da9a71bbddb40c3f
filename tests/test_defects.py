"""One test per defect found by an independent suite: each failed before its fix."""

from __future__ import annotations

import pytest
import torch

from course.core import runtime
from course.core.impl import load
from pyspec_ref import sampling as spec

DEVICE = runtime.torch_device()


# --------------------------------------------------------------------------- r = 0 and p(x) = 0


def _forbidden_chain():
    """V = 16, q uniform, p = 0.5 at tokens 3 and 9: the draft token 5 has p(5) = 0."""
    vocabulary = 16
    q = [1 / vocabulary] * vocabulary
    p = [0.0] * vocabulary
    p[3] = p[9] = 0.5
    return q, p


def test_spec_rejects_a_token_the_target_forbids_even_with_r_zero():
    q, p = _forbidden_chain()
    assert not spec.accepts(0.0, 0.0, 1 / 16)
    accepted, emitted = spec.speculative_sampling([5], [q], [p, p], [0.0], [0.25, 0.25])
    assert accepted == 0 and emitted[0] in (3, 9)
    path, token = spec.tree_speculative_sampling([-1, 0], [0, 5], [q, q], [p, p], [0.0, 0.0], [0.25, 0.25])
    assert path == [0] and token in (3, 9)


def test_chain_kernel_rejects_a_token_the_target_forbids_even_with_r_zero():
    kernels = load("spec_sampling", "solutions")
    q, p = _forbidden_chain()
    accepted, emitted = kernels.speculative_sampling(
        torch.tensor([[5]], dtype=torch.int32, device=DEVICE),
        torch.tensor([[q]], dtype=torch.float32, device=DEVICE),
        torch.tensor([[p, p]], dtype=torch.float32, device=DEVICE),
        torch.tensor([[0.0]], dtype=torch.float32, device=DEVICE),
        torch.tensor([[0.25, 0.25]], dtype=torch.float32, device=DEVICE))
    assert int(accepted[0]) == 0
    assert int(emitted[0, 0]) in (3, 9) and p[int(emitted[0, 0])] > 0


def test_tree_kernel_rejects_a_token_the_target_forbids_even_with_r_zero():
    kernels = load("tree_verification", "solutions")
    q, p = _forbidden_chain()
    path, token = kernels.tree_speculative_sampling(
        torch.tensor([[-1, 0]], dtype=torch.int32, device=DEVICE),
        torch.tensor([[0, 5]], dtype=torch.int32, device=DEVICE),
        torch.tensor([[q, q]], dtype=torch.float32, device=DEVICE),
        torch.tensor([[p, p]], dtype=torch.float32, device=DEVICE),
        torch.zeros((1, 2), dtype=torch.float32, device=DEVICE),
        torch.full((1, 2), 0.25, dtype=torch.float32, device=DEVICE))
    assert path.tolist() == [[0, -1]]
    assert int(token[0]) in (3, 9)


# --------------------------------------------------------------------------- compaction of device-built moves


def test_compact_buffers_refuse_buffers_the_kernel_cannot_read_as_they_are():
    from course.topics.kvcache.launch import prepare_compact_buffers

    cache = torch.zeros((1, 2, 8, 16), device=DEVICE)
    int32 = dict(dtype=torch.int32, device=DEVICE)
    src, dst, counts = torch.zeros((1, 3), **int32), torch.zeros((1, 3), **int32), torch.zeros(1, **int32)
    with pytest.raises(TypeError, match="src must be a contiguous int32 tensor"):
        prepare_compact_buffers(cache, src.long(), dst, counts, impl="solutions")
    with pytest.raises(TypeError, match="dst must be a contiguous int32 tensor"):
        prepare_compact_buffers(cache, src, torch.zeros((1, 6), **int32)[:, ::2], counts, impl="solutions")
    with pytest.raises(ValueError, match=r"counts\[0\] = 4"):
        prepare_compact_buffers(cache, src, dst, counts + 4, impl="solutions")


# --------------------------------------------------------------------------- dense mask


def test_dense_rung_refuses_a_mask_row_with_no_visible_key():
    dense = load("ladder_dense", "solutions")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn((1, 1, 8, 32), generator=gen).to(DEVICE) for _ in range(3))
    mask = torch.tril(torch.ones((1, 8, 8), dtype=torch.bool)).to(DEVICE)
    mask[0, 3, :] = False
    with pytest.raises(ValueError, match=r"mask\[0, 3, :\] hides every key"):
        dense.tree_attention_dense(q, k, v, mask)


# --------------------------------------------------------------------------- wrong N


@pytest.mark.parametrize("module", ["ladder_k1", "ladder_k11", "ladder_dense", "triton_attention"])
def test_times_of_the_wrong_n_are_named_as_a_shape_error(module):
    kernels = load(module, "solutions")
    q = torch.zeros((1, 1, 8, 32), device=DEVICE)
    start = torch.tensor([[0, 1, 2, 3, 4, 5, 6]], dtype=torch.int32, device=DEVICE)
    end = torch.full((1, 7), 7, dtype=torch.int32, device=DEVICE)  # a chain of 8 nodes, cut to 7
    with pytest.raises(ValueError, match=r"start and end must have shape \(B, N\) = \(1, 8\) to match q, "
                       r"got \(1, 7\)"):
        kernels.tree_attention(q, q.clone(), q.clone(), start, end)


# --------------------------------------------------------------------------- DeFT block length


def test_flatten_refuses_a_block_whose_tile_a_gpu_cannot_compile():
    deft = load("deft", "solutions")
    with pytest.raises(ValueError, match=r"block_tokens must be .* got 48"):
        deft.flatten_blocks([-1, 0, 0], [40, 30, 20], [1, 2], 48, DEVICE)
    for good in (16, 32, 64, 80, 192):
        deft.flatten_blocks([-1, 0, 0], [40, 30, 20], [1, 2], good, DEVICE)
