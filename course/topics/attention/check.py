"""Checks for notebook 02: the online softmax, tiled (flash) attention and the log-sum-exp merge.

These exercises are about the algorithm, so they run in float64 and must match
pyspec_ref to rounding: a forgotten rescale or a NaN from a fully hidden tile
shows up as a large error, not as noise.
"""

from __future__ import annotations

import random

import torch

import pyspec_ref
from course import oracle
from course.checks import CaseResult
from course.checks.diagnose import compare_floats, compare_out_and_lse
from course.core import inputs

ATOL, RTOL = 1e-9, 1e-7


def _reference_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor([pyspec_ref.softmax(row) for row in x.tolist()], dtype=torch.float64)


def check_online_softmax(module, seed: int):
    """online_softmax(x, block) must equal pyspec_ref.softmax for every block size."""
    rows, cols = 5, 37
    for block in (1, 4, 16, cols, cols + 5):
        for label, offset in (("", 0.0), (", large scores", 900.0)):
            name = f"{rows}x{cols} scores, block={block}{label}"

            def run(name=name, block=block, offset=offset):
                x = inputs.random_tensor((rows, cols), seed + block, torch.float64) * 3 + offset
                got = module.online_softmax(x, block)
                problem = compare_floats(got, _reference_softmax(x), "p", ("row", "column"),
                                         ATOL, RTOL)
                return CaseResult(name, False, problem) if problem else None
            yield name, run


def _attention_masks(seed: int):
    """Masks to attend with: tree masks, a causal one, and one whose first tiles are hidden."""
    rng = random.Random(seed)
    for case in inputs.edge_case_trees(8)[2:7]:
        yield f"tree mask of {case.name}", pyspec_ref.tree_mask(list(case.parents))
    n = 29
    yield f"anti-causal mask N={n} (early key tiles fully hidden)", [
        [k >= q for k in range(n)] for q in range(n)]
    tree = inputs.random_tree(n, rng, order="dfs")
    yield f"tree mask, random DFS-order tree N={n}", pyspec_ref.tree_mask(tree)


def _reference_attention(q, k, v, mask):
    outs, lses = [], []
    for b in range(q.shape[0]):
        out, lse = pyspec_ref.attention_with_lse(q[b].tolist(), k[b].tolist(), v[b].tolist(),
                                                 mask)
        outs.append(out)
        lses.append(lse)
    return torch.tensor(outs, dtype=torch.float64), torch.tensor(lses, dtype=torch.float64)


def check_flash_attention(module, seed: int):
    """flash_attention(q, k, v, mask, block_k) must return pyspec_ref's (out, lse)."""
    for index, (label, mask_rows) in enumerate(_attention_masks(seed)):
        n = len(mask_rows)
        for block_k in sorted({1, 7, 16, n + 3}):
            name = f"{label}, block_k={block_k}"

            def run(name=name, mask_rows=mask_rows, block_k=block_k, index=index, n=n):
                q, k, v = (inputs.random_tensor((2, n, 8), seed + 10 * index + j, torch.float64)
                           for j in range(3))
                mask = torch.tensor(mask_rows).expand(2, n, n)
                out, lse = module.flash_attention(q, k, v, mask, block_k=block_k)
                want_out, want_lse = _reference_attention(q, k, v, mask_rows)
                problem = compare_out_and_lse(out, want_out, lse, want_lse, ("batch", "row", "column"),
                                              ("batch", "row"), (ATOL, RTOL), (ATOL, RTOL))
                return CaseResult(name, False, problem) if problem else None
            yield name, run


def _split_partials(q, k, v, part_of_key):
    """Partial (out, lse) of each query row over the keys of part 0 and of part 1.

    A part with no key gets lse = -inf and an out of NaN (0/0), which the merge must ignore.
    """
    parts = []
    for part in (0, 1):
        keys = [j for j, p in enumerate(part_of_key) if p == part]
        if not keys:
            empty_out = torch.full((q.shape[0], v.shape[1]), float("nan"), dtype=torch.float64)
            parts.append((empty_out, torch.full((q.shape[0],), float("-inf"), dtype=torch.float64)))
            continue
        out, lse = oracle.attention_with_lse(q, k[keys], v[keys])
        parts.append((out, lse))
    return parts


def check_merge_attention(module, seed: int):
    """merge_attention of partials over two disjoint key sets must equal attention over all keys."""
    rng = random.Random(seed)
    n_query, n_key, d = 6, 23, 8
    splits = {
        "random split of the keys": [rng.randrange(2) for _ in range(n_key)],
        "first part empty (lse = -inf)": [1] * n_key,
        "second part empty (lse = -inf)": [0] * n_key,
        "one key in the first part": [0] + [1] * (n_key - 1),
    }
    for index, (name, part_of_key) in enumerate(splits.items()):
        def run(name=name, part_of_key=part_of_key, index=index):
            q, k, v = (inputs.random_tensor(shape, seed + 3 * index + j, torch.float64)
                       for j, shape in enumerate([(n_query, d), (n_key, d), (n_key, d)]))
            (out_a, lse_a), (out_b, lse_b) = _split_partials(q, k, v, part_of_key)
            out, lse = module.merge_attention(out_a, lse_a, out_b, lse_b)
            want = [pyspec_ref.merge_attention([out_a[i].tolist(), out_b[i].tolist()],
                                               [float(lse_a[i]), float(lse_b[i])])
                    for i in range(n_query)]
            want_out = torch.tensor([w[0] for w in want], dtype=torch.float64)
            want_lse = torch.tensor([w[1] for w in want], dtype=torch.float64)
            problem = compare_out_and_lse(out, want_out, lse, want_lse, ("row", "column"), ("row",),
                                          (ATOL, RTOL), (ATOL, RTOL))
            return CaseResult(name, False, problem) if problem else None
        yield name, run
