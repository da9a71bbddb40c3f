"""Checks for the Triton tree-attention kernel (notebook 12).

A module exposes `tree_attention(q, k, v, start, end, *, return_lse=False)` for (B, H, N, d)
q, k, v in float16, bfloat16 (GPU only) or float32, and `config_for(d, dtype)`, whose
`block_n` is the key block the edge-case trees are sized around. Every case is compared in
full with the float64 torch oracle (out and LSE), on a few rows with pyspec_ref itself, and
runs twice: the two runs must agree bit for bit.

Tolerances are per input dtype, for standard-normal q, k, v (`course.core.inputs.random_tensor`),
against the float64 oracle evaluated on the same (already rounded) inputs:
- float32: 2e-5 + 1e-4·|expected|, as for the Numba ladder (float32 accumulation).
- float16: scores and softmax are float32, so two roundings remain. P is rounded to float16
  for the second tl.dot, a relative error of at most 2^-11 per probability: at most
  2^-11 · max|v| in the output, about 2e-3 for normal v (|v| < 4.5 in these sizes); and the
  output is rounded to float16, half an ulp, at most 2^-11·|out| (rtol 1e-3 covers it).
  Measured on the cases below: about 1e-3 at most.
- bfloat16 (GPU only): 8 mantissa bits instead of 11, so 8 times both: 1.6e-2 + 8e-3·|expected|.
- LSE, float32 in every case: 1e-4 + 1e-5·|expected| (computed from float32 scores).
"""

from __future__ import annotations

import random

import torch

import pyspec_ref
from course import oracle
from course.checks import CaseResult, rerun_problem
from course.checks.diagnose import compare_floats, compare_out_and_lse
from course.checks.diagnose_attention import (
    CARRIED_STATE,
    MASK_TEST,
    PADDING_KEYS,
    PROBABILITY_MASK,
    RESCALE,
    SCALE,
    explain_tree_attention,
)
from course.core import inputs, runtime

# What the student's code of notebook 12 holds: the mask of a pair of blocks (tree_attention_kernel) and
# the online-softmax step (online_softmax_step). The list of key blocks and the final division are given.
CAUSES = frozenset({MASK_TEST, PROBABILITY_MASK, PADDING_KEYS, CARRIED_STATE, RESCALE, SCALE})
TOLERANCES = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 8e-3)}
LSE_TOLERANCE = (1e-4, 1e-5)
SAMPLED_ROWS = 4
LABELS = ("batch", "head", "row", "column")
LSE_LABELS = ("batch", "head", "row")
PAPER_D = 64


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


SHUFFLED = "random tree, shuffled numbering"


def shuffled_tree(n: int, seed: int) -> inputs.TreeCase:
    """A random tree numbered at random: the root is not node 0 and parents may come after children.

    DFS times do not need a topological numbering, and neither does the kernel. Here a query
    block can visit a key block in which some of its rows see no key while they have seen none
    before (their ancestors sit in later blocks): the softmax step must not turn that into NaN.
    """
    rng = random.Random(seed)
    tree = inputs.random_tree(n, rng, max_children=3)
    order = list(range(n))
    rng.shuffle(order)
    return inputs.TreeCase(f"{SHUFFLED} N={n}", tuple(pyspec_ref.relabel(tree, order)))


def root_last_tree(tile: int) -> inputs.TreeCase:
    """A star around the last node, except that node tile + 1 hangs below node 1.

    Query block 1 (rows tile .. 2 tile - 1) must visit key block 0 for row tile + 1, whose parent
    is node 1, and row tile sees no key there: the first block it visits shows it nothing.
    """
    n = 2 * tile + 3
    parents = [n - 1] * n
    parents[n - 1] = -1
    parents[tile + 1] = 1
    return inputs.TreeCase(f"root last, a row that sees nothing in its first block N={n}", tuple(parents))


def triton_cases(module, seed: int) -> list[tuple[str, list[inputs.TreeCase], int, torch.dtype]]:
    """(name, trees of one batch, d, dtype) for every case the check runs."""
    dtypes = [torch.float16, torch.float32] + ([torch.bfloat16] if runtime.on_gpu() else [])
    cases = []
    for dtype in dtypes:
        tile = module.config_for(PAPER_D, dtype).block_n
        paper = f"d={PAPER_D}, {dtype_name(dtype)}"
        shuffled = f"{SHUFFLED} N={2 * tile + 3}, {paper}"
        for case in [*inputs.edge_case_trees(tile), root_last_tree(tile),
                     shuffled_tree(2 * tile + 3, inputs.case_seed(seed, shuffled))]:
            cases.append((f"{case.name}, {paper}", [case], PAPER_D, dtype))
        n_mixed = runtime.pick(sim=tile + 7, gpu=1024)
        mixed = f"batch of 3 different trees N={n_mixed}, {paper}"
        cases.append((mixed, inputs.random_cases(3, n_mixed, inputs.case_seed(seed, mixed)), PAPER_D, dtype))
        for d in module.HEAD_DIMS:
            if d == PAPER_D:
                continue
            n = runtime.pick(sim=module.config_for(d, dtype).block_n + 3, gpu=512)
            name = f"batch of 2 random trees N={n}, d={d}, {dtype_name(dtype)}"
            cases.append((name, inputs.random_cases(2, n, inputs.case_seed(seed, name)), d, dtype))
    return cases


def _sampled_rows_problem(out, lse, q, k, v, batch, start, end, seed, tolerance) -> str:
    """Compare a few rows of each batch entry with pyspec_ref (the specification itself)."""
    rng = random.Random(seed)
    for b, case in enumerate(batch):
        h = rng.randrange(q.shape[1])
        rows = sorted(rng.sample(range(case.n), min(SAMPLED_ROWS, case.n)))
        mask = pyspec_ref.tree_mask_from_times(start[b].tolist(), end[b].tolist())
        q_rows = q[b, h, rows].double().tolist()
        want, want_lse = pyspec_ref.attention_with_lse(q_rows, k[b, h].double().tolist(),
                                                       v[b, h].double().tolist(), [mask[r] for r in rows])
        for index, r in enumerate(rows):
            problem = (compare_floats(out[b, h, r], torch.tensor(want[index]), "out", ("column",),
                                      *tolerance)
                       or compare_floats(lse[b, h, r:r + 1], torch.tensor([want_lse[index]]), "lse",
                                         ("row",), *LSE_TOLERANCE))
            if problem:
                return f"batch {b}, head {h}, row {r} (vs pyspec_ref): {problem}"
    return ""


def check_triton_tree_attention(module, seed: int, heads: int | None = None):
    """module.tree_attention must equal softmax(QK^T/sqrt(d) masked by the tree) V, with its LSE."""
    device = runtime.torch_device()
    heads = heads or runtime.pick(sim=2, gpu=4)
    for name, batch, d, dtype in triton_cases(module, seed):
        def run(name=name, batch=batch, d=d, dtype=dtype):
            n = batch[0].n
            drawn = inputs.case_seed(seed, name)
            q, k, v = (inputs.random_tensor((len(batch), heads, n, d), drawn + j, dtype, device)
                       for j in range(3))
            start, end = (t.to(device) for t in inputs.dfs_times_tensors(batch))
            out, lse = module.tree_attention(q, k, v, start, end, return_lse=True)
            again = module.tree_attention(q, k, v, start, end, return_lse=True)
            alone = module.tree_attention(q, k, v, start, end)
            if not isinstance(out, torch.Tensor) or out.dtype != dtype or lse.dtype != torch.float32:
                return CaseResult(name, False, f"expected out in {dtype_name(dtype)} and lse in float32, got "
                                               f"{getattr(out, 'dtype', type(out))} and "
                                               f"{getattr(lse, 'dtype', type(lse))}")
            want, want_lse = oracle.tree_attention(q, k, v, start, end)
            tolerance = TOLERANCES[dtype]
            problem = (compare_out_and_lse(out, want, lse, want_lse, LABELS, LSE_LABELS, tolerance,
                                           LSE_TOLERANCE)
                       or compare_floats(alone, want, "out (return_lse=False)", LABELS, *tolerance)
                       or _sampled_rows_problem(out.cpu(), lse.cpu(), q.cpu(), k.cpu(), v.cpu(), batch,
                                                start.cpu(), end.cpu(), drawn + 3, tolerance)
                       or rerun_problem((out, lse), again))
            if problem:
                why = explain_tree_attention(out, q, k, v, start, end, module.config_for(d, dtype).block_n,
                                             *tolerance, causes=CAUSES)
                problem += f"\n{why}" if why else ""
            return CaseResult(name, False, problem) if problem else None
        yield name, run
