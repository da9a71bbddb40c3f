"""Turn a wrong output into a sentence: which batch entry, row, column; expected vs got."""

from __future__ import annotations

import torch


def first_index(flags: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(flags)[0])


def compare_ints(got: torch.Tensor, expected: torch.Tensor, what: str, labels: tuple[str, ...]) -> str:
    """'' when equal, else where the first difference is and how many there are."""
    if got.shape != expected.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    wrong = got.cpu() != expected.cpu()
    if not wrong.any():
        return ""
    where = first_index(wrong)
    place = ", ".join(f"{label} {i}" for label, i in zip(labels, where, strict=True))
    return (f"{place}: {what} = {int(got.cpu()[where])}, expected {int(expected.cpu()[where])} "
            f"({int(wrong.sum())} wrong of {wrong.numel()})")


def compare_floats(got: torch.Tensor, expected: torch.Tensor, what: str, labels: tuple[str, ...],
                   atol: float, rtol: float) -> str:
    """'' when close, else the row with the largest error and its worst column."""
    if got.shape != expected.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    got, expected = got.detach().cpu().double(), expected.detach().cpu().double()
    if torch.isnan(got).any():
        where = first_index(torch.isnan(got))
        place = ", ".join(f"{label} {i}" for label, i in zip(labels, where, strict=True))
        return f"{place}: {what} is NaN ({int(torch.isnan(got).sum())} NaN values): unwritten or 0/0?"
    error = (got - expected).abs()
    bad = error > atol + rtol * expected.abs()
    if not bad.any():
        return ""
    where = first_index(error == error.max())
    place = ", ".join(f"{label} {i}" for label, i in zip(labels, where, strict=True))
    return (f"{place}: {what} = {float(got[where]):.6g}, expected {float(expected[where]):.6g} "
            f"(max |got - expected| = {float(error.max()):.3g}; {int(bad.sum())} of {bad.numel()} "
            f"values off by more than {atol:g} + {rtol:g}·|expected|)")


def compare_mask(got: torch.Tensor, expected: torch.Tensor, start: torch.Tensor,
                 end: torch.Tensor) -> str:
    """'' when equal, else which (query, key) pair was wrongly visible or hidden, and why."""
    if got.shape != expected.shape:
        return f"mask has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    got, expected = got.cpu().bool(), expected.cpu().bool()
    wrong = got != expected
    if not wrong.any():
        return ""
    b, q, k = first_index(wrong)
    sq, eq, sk, ek = (int(t[b, i]) for t, i in ((start, q), (end, q), (start, k), (end, k)))
    intervals = f"key {k} has [start, end] = [{sk}, {ek}], query {q} has [{sq}, {eq}]"
    if got[b, q, k]:
        how = f"the mask let query {q} see key {k}, which is not its ancestor ({intervals})"
    else:
        how = f"the mask hid key {k} from query {q}, but it is an ancestor-or-self ({intervals})"
    return f"batch {b}: {how}; {int(wrong.sum())} wrong entries of {wrong.numel()}"
