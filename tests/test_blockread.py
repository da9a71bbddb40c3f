"""The watch on x that online_softmax's check hands the function (course.core.blockread).

Honest streams in several spellings must pass it, and every way of computing the softmax from x
whole must fail it, naming the operation; in grading the grader marks x and the child watches its
own copy (`lift`, `watch_marked`).
"""

from __future__ import annotations

import pytest
import torch

from course.core.blockread import BlockReadError, ReadInBlocks, lift, plain, watch_marked, watched
from course.core.validate import require_tensor
from solutions.attention import online_softmax

COLUMNS = 37
BLOCKS = (1, 4, 16, COLUMNS, COLUMNS + 5)


def _x() -> torch.Tensor:
    return torch.randn(5, COLUMNS, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 3


def split_tiles(x, block):
    """The stream over x.split, statistics with amax and `[..., None]`, the last pass block by block."""
    m = x.new_full(x.shape[:-1], float("-inf"))
    l = torch.zeros_like(m)
    for tile in x.split(block, dim=-1):
        m_new = torch.maximum(m, tile.amax(-1))
        l = l * (m - m_new).exp() + (tile - m_new[..., None]).exp().sum(-1)
        m = m_new
    out = torch.empty_like(x)
    for first in range(0, x.shape[-1], block):
        out[..., first:first + block] = torch.exp(x[..., first:first + block] - m[..., None]) / l[..., None]
    return out


def narrow_and_cat(x, block):
    """The stream over x.narrow, a block's sum through logsumexp, the last pass as a cat of blocks."""
    m = torch.full_like(x[..., 0], float("-inf"))
    l = torch.zeros_like(m)
    for first in range(0, x.size(-1), block):
        tile = x.narrow(-1, first, min(block, x.size(-1) - first))
        m_new = torch.max(m, tile.max(dim=-1).values)
        l = l * torch.exp(m - m_new) + torch.logsumexp(tile - m_new.unsqueeze(-1), -1).exp()
        m = m_new
    return torch.cat([torch.exp(t - m.unsqueeze(-1)) for t in x.split(block, -1)], -1) / l.unsqueeze(-1)


@pytest.mark.parametrize("stream", [online_softmax, split_tiles, narrow_and_cat], ids=lambda f: f.__name__)
@pytest.mark.parametrize("block", BLOCKS)
def test_a_stream_of_column_blocks_passes_the_watch(stream, block):
    x = _x()
    got = plain(stream(watched(x, block, "online_softmax"), block))
    assert type(got) is torch.Tensor
    assert torch.allclose(got, torch.softmax(x, dim=-1))


WHOLE = {  # a softmax computed from x whole: the operation the report must name
    "torch.softmax": lambda x: torch.softmax(x, dim=-1),
    "torch.nn.functional.softmax": lambda x: torch.nn.functional.softmax(x, dim=-1),
    "Tensor.log_softmax": lambda x: x.log_softmax(-1).exp(),
    "Tensor.sum": lambda x: torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True),
    "Tensor.max": lambda x: torch.exp(x - x.max(-1, keepdim=True).values),
    "torch.logsumexp": lambda x: torch.exp(x - torch.logsumexp(x, -1, keepdim=True)),
    "Tensor.matmul": lambda x: torch.exp(x) @ torch.ones(COLUMNS, 1, dtype=x.dtype),
    "Tensor.tolist": lambda x: torch.tensor(x.tolist()),
    "Tensor.amax": lambda x: x.reshape(-1).amax(),  # a reshape does not make x narrower
    "Tensor.softmax": lambda x: x.clone().softmax(-1),  # nor does a copy
}


@pytest.mark.parametrize("op", sorted(WHOLE))
@pytest.mark.parametrize("block", BLOCKS)
def test_a_reduction_over_x_whole_fails_at_every_block_size(op, block):
    with pytest.raises(BlockReadError, match=rf"^online_softmax applied {op} to x whole \(all 37 columns\)"):
        WHOLE[op](watched(_x(), block, "online_softmax"))


def test_a_reduction_over_more_columns_than_a_block_fails_and_says_how_many():
    x = watched(_x(), 4, "online_softmax")
    with pytest.raises(BlockReadError, match="Tensor.sum to 8 of x's 37 columns at once: .* block = 4"):
        x[..., 0:8].sum(-1)
    with pytest.raises(BlockReadError, match="applied Tensor.max to 8 of x's 37 columns at once"):
        torch.cat([x[..., 0:4], x[..., 4:8]], dim=-1).max()  # joined blocks span both
    with pytest.raises(BlockReadError, match="applied Tensor.softmax to 37 of x's 37 columns"):
        x[0].softmax(-1)  # a row is every column of it
    assert float(x[..., 4:8].exp().sum()) > 0  # a block of 4 may be reduced, after elementwise steps
    one_block = watched(_x(), COLUMNS + 5, "online_softmax")
    assert one_block[..., 0:COLUMNS + 5].max() == _x().max()  # a block that holds the whole row is one


def test_the_launchers_validation_and_metadata_read_nothing_the_rule_counts():
    x = watched(_x(), 4, "online_softmax")
    assert require_tensor(x, "x", ndim=2, dtypes=(torch.float64,), on_kernel_device=False) is x
    assert (x.shape, x.dtype, x.device, x.ndim, x.size(-1), len(x)) == ((5, 37), torch.float64,
                                                                        torch.device("cpu"), 2, 37, 5)
    assert type(torch.zeros_like(x)) is torch.Tensor and type(x.new_full((2,), 1.0)) is torch.Tensor


def test_the_watched_x_is_x_itself_not_a_copy():
    x = _x()
    seen = watched(x, 4, "online_softmax")
    assert plain(seen).data_ptr() == x.data_ptr()
    seen[..., 0:1] = 0.0  # a write into it is a write into x (grading then fails the case: input changed)
    assert bool((x[:, 0] == 0).all())


def test_grading_marks_x_and_the_child_watches_its_own_copy():
    x = _x()
    args, marks = lift((watched(x, 4, "online_softmax"), 4), {})
    assert marks == [[0, 4]] and type(args[0]) is torch.Tensor and args[0].data_ptr() == x.data_ptr()
    copy = x.clone()  # what the child decodes from the bytes
    again = watch_marked([copy, 4], marks, "online_softmax")
    assert isinstance(again[0], ReadInBlocks) and again[1] == 4
    with pytest.raises(BlockReadError, match="online_softmax applied torch.softmax to x whole"):
        torch.softmax(again[0], -1)
    # marks that do not name a tensor argument by position with a positive block are ignored
    for bad in ([[1, 4]], [[0, 0]], [[0, True]], [["0", 4]], [[5, 4]], "0", [[0]]):
        assert not any(isinstance(a, ReadInBlocks) for a in watch_marked([copy, 4], bad, "online_softmax"))
    with pytest.raises(TypeError, match="positional argument of its own"):
        lift((x,), {"x": watched(x, 4, "online_softmax")})
    with pytest.raises(TypeError, match="positional argument of its own"):
        lift(([watched(x, 4, "online_softmax")],), {})
