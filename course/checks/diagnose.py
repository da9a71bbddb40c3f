"""Turn a wrong output into a sentence: which batch entry, row, column; expected vs got."""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
import torch

from course.core.launch import never_written

# Why a float output holds NaN, in the terms of the exercise's language: launchers fill outputs
# with NaN before the launch, and the simulator fills every shared and local array of a Numba
# kernel with NaN, so each likely cause leaves one.
NAN_CAUSES = (  # a Numba CUDA kernel
    "an output element the kernel never wrote (outputs start as NaN)",
    "a read of shared or local memory before anything was stored there: an accumulator "
    "not initialised (the simulator fills them with NaN)",
    "a missing cuda.syncthreads() between the stores to shared memory and the loads from it, "
    "or a thread that returns before the barrier so its part of the tile is never stored",
    "0/0 or inf - inf in the arithmetic, e.g. a softmax over a row with every key masked",
)
TRITON_NAN_CAUSES = (
    "an output element no program stored (outputs start as NaN): a tl.store whose mask leaves "
    "rows or columns out, or a grid whose program ids (tl.program_id) do not cover the output",
    "a tl.load whose mask leaves elements out with other=... giving NaN or -inf where they are "
    "used, or a block read at the wrong offsets",
    "0/0 or inf - inf in the arithmetic, e.g. exp2(-inf - (-inf)) for a row whose every key is "
    "masked so far, or a division by a running sum that is still 0",
)
TORCH_NAN_CAUSES = (
    "an output element the function never set (a tensor from torch.empty, or a slice the loop "
    "does not reach)",
    "0/0 or inf - inf in the arithmetic, e.g. exp(-inf - (-inf)) for a row whose every key is "
    "masked so far, or a division by a running sum that is still 0",
)
CAUSES_IN = {"numba": NAN_CAUSES, "triton": TRITON_NAN_CAUSES, "torch": TORCH_NAN_CAUSES}
# The language of the exercise being checked (set by `speaking_of`): messages name its terms.
_LANGUAGE: contextvars.ContextVar[str] = contextvars.ContextVar("language", default="numba")


@contextlib.contextmanager
def speaking_of(language: str):
    """Within the block, diagnoses speak of `language`'s terms: "numba", "triton" or "torch"."""
    if language not in CAUSES_IN:
        raise ValueError(f"language must be one of {', '.join(CAUSES_IN)}, got {language!r}")
    token = _LANGUAGE.set(language)
    try:
        yield
    finally:
        _LANGUAGE.reset(token)


def nan_causes() -> tuple[str, ...]:
    """The likely causes of a NaN output in the language of the exercise being checked."""
    return CAUSES_IN[_LANGUAGE.get()]


def simulator_poison(dtype: torch.dtype) -> int:
    """The value the simulator fills integer shared and local arrays with (course.core.simulator)."""
    info = np.iinfo(np.dtype(str(dtype).removeprefix("torch.")))
    return info.min // 2 if info.min < 0 else info.max // 2


def first_index(flags: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(flags)[0])


def compare_ints(got: torch.Tensor, expected: torch.Tensor, what: str, labels: tuple[str, ...]) -> str:
    """'' when equal, else where the first difference is and how many there are."""
    if got.shape != expected.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    got, expected = got.cpu(), expected.cpu()
    wrong = got != expected
    if not wrong.any():
        return ""
    where = first_index(wrong)
    place = ", ".join(f"{label} {i}" for label, i in zip(labels, where, strict=True))
    text = (f"{place}: {what} = {int(got[where])}, expected {int(expected[where])} "
            f"({int(wrong.sum())} wrong of {wrong.numel()})")
    return text + poison_hint(got, wrong, what)


def poison_hint(got: torch.Tensor, wrong: torch.Tensor, what: str) -> str:
    """Why wrong integers hold a poison value: never written, or copied from unset memory."""
    if got.dtype == torch.bool:
        return ""
    unwritten = wrong & (got == never_written(got.dtype))
    if unwritten.any():
        return (f"\n{int(unwritten.sum())} {what} values were never written: they still hold "
                f"{never_written(got.dtype)}, what the launcher fills outputs with (a thread that "
                "returned early, a loop that stops short, or a kernel that assumed zeros)")
    unset = wrong & (got == simulator_poison(got.dtype))
    if unset.any() and _LANGUAGE.get() == "numba":
        return (f"\n{int(unset.sum())} {what} values are {simulator_poison(got.dtype)}, the value "
                "the simulator fills shared and local arrays with: they were copied from "
                "memory that was read before anything was stored there (a missing "
                "initialisation or cuda.syncthreads())")
    return ""


def compare_floats(got: torch.Tensor, expected: torch.Tensor, what: str, labels: tuple[str, ...],
                   atol: float, rtol: float) -> str:
    """'' when close, else the row with the largest error and its worst column."""
    if got.shape != expected.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    got, expected = got.detach().cpu().double(), expected.detach().cpu().double()
    if torch.isnan(got).any():
        where = first_index(torch.isnan(got))
        place = ", ".join(f"{label} {i}" for label, i in zip(labels, where, strict=True))
        causes = "\n".join(f"  - {cause}" for cause in nan_causes())
        return (f"{place}: {what} is NaN ({int(torch.isnan(got).sum())} NaN values of "
                f"{got.numel()}){nan_extent(torch.isnan(got), labels)}. Likely causes:\n{causes}")
    error = (got - expected).abs()
    bad = error > atol + rtol * expected.abs()
    if not bad.any():
        return ""
    where = first_index(error == error.max())
    place = ", ".join(f"{label} {i}" for label, i in zip(labels, where, strict=True))
    return (f"{place}: {what} = {float(got[where]):.6g}, expected {float(expected[where]):.6g} "
            f"(max |got - expected| = {float(error.max()):.3g}; {int(bad.sum())} of {bad.numel()} "
            f"values off by more than {atol:g} + {rtol:g}·|expected|)")


def nan_extent(nan: torch.Tensor, labels: tuple[str, ...]) -> str:
    """', only in row 16 to 30, column 32 to 63': the indices along each axis that hold a NaN, for
    the axes where some index holds none (a missing stage of loads, an unwritten chunk)."""
    parts = []
    for axis, label in enumerate(labels):
        others = tuple(a for a in range(nan.dim()) if a != axis)
        hit = torch.nonzero(nan.any(dim=others) if others else nan).flatten().tolist()
        if len(hit) < nan.shape[axis]:
            parts.append(f"{label} {_ranges(hit)}")
    return f", only in {', '.join(parts)}" if parts else ""


def _ranges(indices: list[int], shown: int = 3) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0 to 2, 5, 7 to 8' (the first few runs, then 'and more')."""
    runs = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a} to {b}" if b > a else f"{a}" for a, b in runs[:shown])
    return text + (" and more" if len(runs) > shown else "")


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
    how = explain_pair(bool(got[b, q, k]), b, q, k, start, end)
    return f"batch {b}: {how}; {int(wrong.sum())} wrong entries of {wrong.numel()}"


def explain_pair(shown: bool, b: int, q: int, k: int, start: torch.Tensor, end: torch.Tensor) -> str:
    """Why query q should (not) see key k: their DFS intervals (FlashSpecInfer §5.1)."""
    sq, eq, sk, ek = (int(t[b, i]) for t, i in ((start, q), (end, q), (start, k), (end, k)))
    intervals = f"key {k} has [start, end] = [{sk}, {ek}], query {q} has [{sq}, {eq}]"
    if shown:
        return f"the mask let query {q} see key {k}, which is not its ancestor ({intervals})"
    return f"the mask hid key {k} from query {q}, but it is an ancestor-or-self ({intervals})"


def compare_out_and_lse(out, want_out, lse, want_lse, labels: tuple[str, ...],
                        lse_labels: tuple[str, ...], out_tolerance, lse_tolerance) -> str:
    """Compare the output and the log-sum-exp separately, and say which of the two is right:
    the LSE depends only on the scores, their running max and sum, the output also on how P.V
    is accumulated, so one right and the other wrong points at a part of the kernel."""
    out_problem = compare_floats(out, want_out, "out", labels, *out_tolerance)
    lse_problem = compare_floats(lse, want_lse, "lse", lse_labels, *lse_tolerance)
    if out_problem and not lse_problem:
        return (f"{out_problem}\nthe LSE is right, the output is wrong: the scores, running max and "
                "sum are right, so look at the output accumulator (not rescaled by exp(m_old - m_new) "
                "when the max rises? a wrong V row? divided by the wrong sum?)")
    if lse_problem and not out_problem:
        return (f"{lse_problem}\nthe output is right, the LSE is wrong: the softmax is right, so "
                "look at how the LSE is formed from it (m + log(l) in natural log; the max left "
                "out, or a log2 where log belongs?)")
    return "\n".join(problem for problem in (out_problem, lse_problem) if problem)
