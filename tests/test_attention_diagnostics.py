"""A tree-attention check says why the output is wrong: the pair the mask got wrong, the key
tile the loop skipped, or the rescale the online softmax forgot; where the kernel returns an LSE,
whether the LSE or the output is the wrong one.

Each test plants one bug in a solution (mostly solutions/ladder_k2.py, rung 2: one block per
query tile, one thread per row) and runs the exercise's cases on it, as
tests/test_check_diagnostics.py does.
"""

import itertools
import re

import pytest
import torch

from course import oracle
from course.checks import run_cases
from course.checks.diagnose import compare_out_and_lse
from course.checks.diagnose_attention import explain_tree_attention
from course.core import inputs
from course.exercises import get
from tests.test_check_diagnostics import mutant

EXERCISE = "ladder_k2.tree_attention_kernel"
MASK_TEST = "start[b, col] <= start[b, row] and end[b, row] <= end[b, col]"


def case_text(module, name_part: str, exercise: str = EXERCISE) -> str:
    """The failure text of the first case whose name contains name_part."""
    cases = ((name, run) for name, run in get(exercise).cases(module, 0) if name_part in name)
    report = run_cases(exercise, itertools.islice(cases, 1))
    assert not report.passed
    return report.text()


def test_a_strict_interval_test_names_the_hidden_pair(tmp_path):
    module, _ = mutant(tmp_path, "ladder_k2", MASK_TEST,
                       "start[b, col] < start[b, row] and end[b, row] <= end[b, col]")
    text = case_text(module, "two nodes")
    assert "the output is attention under a wrong mask" in text, text
    assert "the mask hid key 1 from query 1, but it is an ancestor-or-self" in text, text
    assert "misses itself" in text


@pytest.mark.parametrize("original, planted, unscaled", [
    ("acc[x] = alpha * acc[x] + pv", "acc[x] = acc[x] + pv", "the output accumulator"),
    ("l_prev = alpha * l_prev + l_tile", "l_prev = l_prev + l_tile", "the running sum"),
])
def test_a_missing_rescale_names_what_and_the_tile_that_raised_the_max(tmp_path, original, planted,
                                                                         unscaled):
    module, _ = mutant(tmp_path, "ladder_k2", original, planted)
    text = case_text(module, "chain")
    assert f"replayed with {unscaled} never rescaled by exp(m_old - m_new) (missing rescale?)" in text, text
    assert re.search(r"Row \d+ goes wrong at key tile 1, the first that raises its running max", text), text


def test_a_dropped_ragged_tile_names_the_skipped_key_tile(tmp_path):
    module, _ = mutant(tmp_path, "ladder_k2", "    tiles = (n + TILE - 1) // TILE",
                       "    tiles = n // TILE")
    text = case_text(module, "caterpillar")
    assert "below key 64 only" in text, text
    assert "it skips key tile 2 (keys 64 onward)" in text, text


def test_an_off_by_one_in_the_interval_names_the_rule_and_a_non_ancestor(tmp_path):
    module, _ = mutant(tmp_path, "ladder_k2", MASK_TEST,
                       "start[b, col] <= start[b, row] and end[b, row] <= end[b, col] + 1")
    text = case_text(module, "random BFS")
    assert "the output is attention under the mask with end[key] + 1 (an off-by-one)" in text, text
    assert re.search(r"the mask let query \d+ see key \d+, which is not its ancestor", text), text


def test_a_swapped_interval_test_is_named(tmp_path):
    module, _ = mutant(tmp_path, "ladder_k2", MASK_TEST,
                       "start[b, row] <= start[b, col] and end[b, col] <= end[b, row]")
    text = case_text(module, "random DFS")
    assert "the output is attention under the mask of descendants (query and key swapped)" in text, text


def test_an_unrescaled_accumulator_has_a_right_lse_and_a_wrong_output(tmp_path):
    module, _ = mutant(tmp_path, "attention", "acc = acc * rescale.unsqueeze(-1) + p @ v[..., keys, :]",
                       "acc = acc + p @ v[..., keys, :]")
    text = case_text(module, "", "attention.flash_attention")
    assert "the LSE is right, the output is wrong" in text, text


def test_a_log2_lse_has_a_right_output_and_a_wrong_lse(tmp_path):
    module, _ = mutant(tmp_path, "attention", "return acc / l.unsqueeze(-1), m + torch.log(l)",
                       "return acc / l.unsqueeze(-1), m + torch.log2(l)")
    text = case_text(module, "", "attention.flash_attention")
    assert "the output is right, the LSE is wrong" in text, text


def test_the_triton_kernel_without_its_rescale_has_a_right_lse(tmp_path):
    module, _ = mutant(tmp_path, "triton_attention",
                       "acc = acc * alpha[:, None] + tl.dot(", "acc = acc + tl.dot(")
    text = case_text(module, "random", "triton_attention.tree_attention_kernel")
    assert "the LSE is right, the output is wrong" in text, text
    assert "replayed with the output accumulator never rescaled" in text, text
    assert "goes wrong at key tile 1, the first that raises its running max" in text, text


def test_an_output_wrong_in_no_known_way_gets_no_diagnosis():
    # Noise on a few rows, as a race leaves it: no hypothesis reproduces it, so nothing is claimed.
    case = inputs.random_cases(1, 40, 3)
    q, k, v = (inputs.random_tensor((1, 1, 40, 32), 20 + j, torch.float32, "cpu") for j in range(3))
    start, end = inputs.dfs_times_tensors(case)
    got, _ = oracle.tree_attention(q, k, v, start, end)
    got[0, 0, 5:9] += inputs.random_tensor((4, 32), 9, torch.float64, "cpu")
    assert explain_tree_attention(got, q, k, v, start, end, 32, 2e-5, 1e-4) == ""


def test_out_and_lse_are_judged_apart():
    out, lse = torch.ones(2, 3), torch.zeros(2)
    wrong_out = compare_out_and_lse(out + 1, out, lse, lse, ("row", "column"), ("row",), (1e-6, 0), (1e-6, 0))
    wrong_lse = compare_out_and_lse(out, out, lse + 1, lse, ("row", "column"), ("row",), (1e-6, 0), (1e-6, 0))
    both = compare_out_and_lse(out + 1, out, lse + 1, lse, ("row", "column"), ("row",), (1e-6, 0), (1e-6, 0))
    assert "the LSE is right, the output is wrong" in wrong_out
    assert "the output is right, the LSE is wrong" in wrong_lse
    assert "out = 2" in both and "lse = 1" in both and "is right" not in both
