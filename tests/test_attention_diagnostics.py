"""A tree-attention check says why the output is wrong: the pair the mask got wrong, the key
tile the loop skipped, or the rescale the online softmax forgot; where the kernel returns an LSE,
whether the LSE or the output is the wrong one.

The planted bugs that show each of these stories are in tests/test_planted_bugs.py's table; here
the diagnosis is checked on outputs built by hand: one wrong in no known way gets none, and the
output and the LSE are judged apart.
"""


import torch

from course import oracle
from course.checks.diagnose import compare_out_and_lse
from course.checks.diagnose_attention import explain_tree_attention
from course.core import inputs


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
