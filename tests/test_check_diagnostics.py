"""A check names the student's line when a kernel raises, and says why an output is NaN or unwritten.

Each test plants one bug of tests/test_planted_bugs.py's table in a copy of a solution module
written under a folder named `lessons/`, as a student's file would be, and runs a few of the
exercise's cases on it, to look at how the report is laid out.
"""

import itertools
import re

import pytest
import torch

from course.__main__ import main
from course.checks import CaseResult, run_cases
from course.checks.diagnose import NAN_CAUSES, TRITON_NAN_CAUSES, compare_floats, speaking_of
from course.checks.diagnose_attention import most_values_wrong
from course.core import impl as implementations
from course.core import runtime
from course.core.launch import never_written, poisoned_empty
from course.registry import get
from tests.test_planted_bugs import mutant, planted

# An index out of bounds raises, at the student's line, only in the simulator and the interpreter: on a
# GPU the access is undefined (it may read garbage or end the process's CUDA context).
raises_in_simulator = pytest.mark.skipif(not runtime.SIMULATOR,
                                         reason="out-of-bounds accesses raise only in the simulator")


def first_cases(exercise: str, module, count: int):
    return run_cases(exercise, itertools.islice(get(exercise).cases(module, 0), count))


# The ragged last tile no longer stops at N: threads past the tree index start[] out of bounds.
OUT_OF_BOUNDS = planted("trees.tree_mask_kernel", "the ragged tile's bound past N")
MASK_LINE = "mask[b, q, k] = start[b, k] <= start[b, q] and end[b, q] <= end[b, k]"


@pytest.fixture
def out_of_bounds_mask(tmp_path):
    module, line = mutant(tmp_path, "trees", OUT_OF_BOUNDS.original, OUT_OF_BOUNDS.planted)
    return module, line + 1  # the access is on the line after the planted condition


@raises_in_simulator
def test_out_of_bounds_is_reported_once_with_file_line_source_and_array(out_of_bounds_mask):
    module, line = out_of_bounds_mask
    report = first_cases("trees.tree_mask_kernel", module, 2)  # N = 1 and N = 2: both ragged
    text = report.text()
    assert not report.passed and len(report.results) == 2
    assert text.count("raised IndexError") == 1, text
    assert "the same error in all 2 cases" in text
    assert f"at lessons/trees.py:{line} in tree_mask_kernel" in text
    assert MASK_LINE in text
    # which thread raises first varies: (q, k) = (1, 0) fails at start[b, q], (0, 1) at start[b, k]
    assert re.search(r"start\[b, [qk]\] is start\[0, 1\], but start has shape \(1, 1\)", text), text
    assert "index 1 is out of bounds for axis 1 with size 1" in text
    assert "tid=" in text and "--verbose" in text
    assert "Traceback" not in text


@raises_in_simulator
def test_verbose_shows_the_whole_traceback(out_of_bounds_mask, monkeypatch, capsys):
    module, line = out_of_bounds_mask
    monkeypatch.setattr(implementations, "load", lambda name, impl=None: module)
    assert main(["check", "trees.tree_mask_kernel", "--verbose"]) == 1
    printed = capsys.readouterr().out
    assert printed.count("raised IndexError") == 1
    assert "Traceback (most recent call last)" in printed
    assert f'lessons/trees.py", line {line}, in tree_mask_kernel' in printed


@raises_in_simulator
def test_a_crash_in_some_cases_lists_them(tmp_path):
    # Only trees of more than 16 nodes reach the second key tile, where the planted index breaks.
    bug = planted("trees.tree_mask_kernel", "a key index that wraps at the 16-key tile")
    module, line = mutant(tmp_path, "trees", bug.original, bug.planted)
    report = first_cases("trees.tree_mask_kernel", module, 4)  # N = 1, 2, a chain of 32, a star of 17
    text = report.text()
    assert text.count("raised IndexError") == 1, text
    assert "in 2 of 4 cases: chain N=32, star N=17" in text
    assert f"lessons/trees.py:{line}" in text


@raises_in_simulator
def test_a_crash_inside_a_triton_kernel_names_the_kernel_line(tmp_path):
    # Triton's interpreter wraps the kernel's error; the report still finds the student's line.
    bug = planted("triton_attention.online_softmax_step", "a reduction over an axis the tile lacks")
    module, line = mutant(tmp_path, "triton_attention", bug.original, bug.planted)
    report = first_cases("triton_attention.online_softmax_step", module, 2)
    text = report.text()
    assert text.count("raised InterpreterError") == 1, text
    assert "axis 2 out of bounds" in text and "the same error in all 2 cases" in text
    assert f"at lessons/triton_attention.py:{line} in online_softmax_step" in text
    assert bug.planted.strip() in text


def test_an_unwritten_integer_is_reported_as_never_written(tmp_path):
    # The root's start time is never stored: fresh memory often holds 0, so torch.empty could pass.
    bug = planted("trees.dfs_times_kernel", "the root's start time never stored")
    module, _ = mutant(tmp_path, "trees", bug.original, bug.planted)
    report = first_cases("trees.dfs_times_kernel", module, 2)
    text = report.text()
    sentinel = torch.iinfo(torch.int32).min
    assert not report.passed
    assert f"batch 0, node 0: start = {sentinel}, expected 0" in text
    assert "never written" in text


def test_an_unwritten_float_row_is_nan_with_its_causes(tmp_path):
    # The last query row's output is never stored.
    bug = planted("ladder_k2.tree_attention_kernel", "the last row never stored")
    module, _ = mutant(tmp_path, "ladder_k2", bug.original, bug.planted)
    report = first_cases("ladder_k2.tree_attention_kernel", module, 2)
    text = report.text()
    assert not report.passed and "is NaN" in text, text
    for cause in NAN_CAUSES:
        assert cause in text


def test_nan_message_names_uninitialised_memory_barriers_and_unwritten_outputs():
    got = torch.zeros(2, 3)
    got[1, 2] = float("nan")
    text = compare_floats(got, torch.zeros(2, 3), "out", ("row", "column"), 1e-5, 1e-5)
    assert text.startswith("row 1, column 2: out is NaN (1 NaN values of 6)")
    for words in ("never wrote", "shared or local memory", "cuda.syncthreads()", "0/0"):
        assert words in text


@pytest.mark.parametrize("language, words, absent", [
    ("triton", ("tl.store", "tl.program_id", "tl.load"), ("cuda.syncthreads", "shared or local memory")),
    ("torch", ("torch.empty",), ("cuda.syncthreads", "tl.store")),
    ("numba", ("cuda.syncthreads()", "shared or local memory"), ("tl.store",)),
])
def test_the_nan_message_speaks_the_exercises_language(language, words, absent):
    got = torch.full((2, 3), float("nan"))
    with speaking_of(language):
        text = compare_floats(got, torch.zeros(2, 3), "out", ("row", "column"), 1e-5, 1e-5)
    assert all(word in text for word in words) and not any(word in text for word in absent), text


def test_a_triton_exercise_is_checked_in_triton_terms():
    assert get("triton_attention.online_softmax_step").language == "triton"
    assert get("ladder_k1.tree_attention_kernel").language == "numba"
    assert get("attention.flash_attention").language == "torch"

    def nan_case():
        got = torch.full((1, 2), float("nan"))
        problem = compare_floats(got, torch.zeros(1, 2), "out", ("row", "column"), 0, 0)
        return CaseResult("nan", False, problem)

    text = run_cases("deft.deft_node_kernel", [("nan", nan_case)]).text()
    assert TRITON_NAN_CAUSES[0] in text and NAN_CAUSES[2] not in text, text


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64,
                                   torch.int8, torch.uint8, torch.bool])
def test_poisoned_empty_holds_the_never_written_value(dtype):
    tensor = poisoned_empty((2, 3), dtype=dtype, device="cpu")
    assert tensor.shape == (2, 3) and tensor.dtype == dtype
    if dtype.is_floating_point:
        assert torch.isnan(tensor).all()
    else:
        assert (tensor == never_written(dtype)).all()
    assert poisoned_empty(4, dtype=dtype, device="cpu").shape == (4,)


def test_most_values_wrong_names_whole_tiles_not_one_row():
    want = torch.randn(1, 1, 40, 8, generator=torch.Generator().manual_seed(0))
    wrong = want.flip(-1)  # every row's columns in reverse: nearly every value wrong
    text = most_values_wrong(wrong, want, 1e-5, 1e-5, tile=32)
    assert "in 2 of 2 query tiles" in text and "whole tiles" in text, text
    one_row = want.clone()
    one_row[0, 0, 3] += 1
    assert most_values_wrong(one_row, want, 1e-5, 1e-5, tile=32) == ""
