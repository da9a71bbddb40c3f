"""Checks for the tree-attention kernels of the ladder (notebooks 03 onward).

A kernel module exposes `tree_attention(q, k, v, start, end) -> out` for float32
q, k, v of shape (B, H, N, d) and int32 DFS times of shape (B, N), and
`HEAD_DIMS`, the head dimensions it supports. Every case is compared in full with
the float64 torch oracle and, on a sample of rows, with pyspec_ref itself; each
case runs twice and must agree bit for bit (a race shows up as a difference).
"""

from __future__ import annotations

import random

import torch

import pyspec_ref
from course import oracle
from course.checks import CaseResult, rerun_problem
from course.checks.diagnose import compare_floats, compare_ints, first_index
from course.checks.diagnose_attention import (
    EVERY_CAUSE,
    PROBABILITY_MASK,
    SKIP_TEST,
    TILE_LAYOUT,
    explain_tree_attention,
    most_values_wrong,
)
from course.core import inputs, runtime
from course.topics.ladder.rungs import Rung

ATOL, RTOL = 2e-5, 1e-4  # float32 accumulation over up to a few thousand keys
SAMPLED_ROWS = 4
SPEC_TILE_NODES = 256  # trees up to this size are also checked against pyspec_ref.tile_mask
LABELS = ("batch", "head", "row", "column")


def attention_cases(seed: int, tile: int, head_dims) -> list[tuple[str, list[inputs.TreeCase], int]]:
    """(name, trees of one batch, d): every edge case alone, a mixed batch, fresh random trees (each
    random case's trees drawn from its own seed, `inputs.case_seed`)."""
    d_small = min(head_dims)
    cases = [(f"{case.name}, d={d_small}", [case], d_small) for case in inputs.edge_case_trees(tile)]
    n_mixed = runtime.pick(sim=tile + 7, gpu=1024)
    mixed = f"batch of 3 different trees N={n_mixed}, d={d_small}"
    cases.append((mixed, inputs.random_cases(3, n_mixed, inputs.case_seed(seed, mixed)), d_small))
    for d in sorted(set(head_dims) - {d_small}):
        n = runtime.pick(sim=tile + 3, gpu=512)
        name = f"random BFS order N={n}, d={d}"
        cases.append((name, inputs.random_cases(1, n, inputs.case_seed(seed, name)), d))
    return cases


def _sampled_rows_problem(out, q, k, v, batch, start, end, seed) -> str:
    """Compare a few rows with pyspec_ref.tree_attention (the specification itself)."""
    rng = random.Random(seed)
    for b, case in enumerate(batch):
        h = rng.randrange(q.shape[1])
        rows = sorted(rng.sample(range(case.n), min(SAMPLED_ROWS, case.n)))
        want, _ = pyspec_ref.tree_attention(q[b, h].tolist(), k[b, h].tolist(), v[b, h].tolist(),
                                            start[b].tolist(), end[b].tolist())
        for r in rows:
            problem = compare_floats(out[b, h, r], torch.tensor(want[r]), "out",
                                     ("column",), ATOL, RTOL)
            if problem:
                return f"batch {b}, head {h}, row {r} (vs pyspec_ref): {problem}"
    return ""


# From rung 8 on the whole score tile is computed before the mask is read, so the probabilities
# themselves must be masked; before it a hidden key never gets a score.
MASKS_PROBABILITIES = ("k8", "k8_dense", "k9", "k10", "k11")


def rung_causes(rung: Rung) -> frozenset[str]:
    """What a rung's student code can get wrong (course.checks.diagnose_attention): a skip test only
    in the rungs that skip key tiles, a mask on the probabilities only where they are masked."""
    causes = EVERY_CAUSE
    if not rung.skips_tiles:
        causes -= {SKIP_TEST}
    if rung.name not in MASKS_PROBABILITIES:
        causes -= {PROBABILITY_MASK}
    return causes


def rung_check(rung: Rung):
    """The check of a rung's tree_attention_kernel: `check_tree_attention` with the rung's causes."""
    causes = rung_causes(rung)

    def check(module, seed: int, heads: int | None = None):
        return check_tree_attention(module, seed, heads, causes)
    return check


def check_tree_attention(module, seed: int, heads: int | None = None, causes: frozenset[str] = EVERY_CAUSE):
    """module.tree_attention must equal softmax(QK^T/sqrt(d) masked by the tree) V; a wrong output is
    explained by those of the `causes` that fit (`rung_causes`)."""
    device = runtime.torch_device()
    heads = heads or runtime.pick(sim=1, gpu=4)  # the simulator runs a block in ~1 s: keep few
    tile = getattr(module, "TILE", 32)
    for name, batch, d in attention_cases(seed, tile, module.HEAD_DIMS):
        def run(name=name, batch=batch, d=d):
            n = batch[0].n
            drawn = inputs.case_seed(seed, name)
            q, k, v = (inputs.random_tensor((len(batch), heads, n, d), drawn + j, torch.float32, device)
                       for j in range(3))
            start, end = (t.to(device) for t in inputs.dfs_times_tensors(batch))
            out = module.tree_attention(q, k, v, start, end)
            again = module.tree_attention(q, k, v, start, end)
            want, _ = oracle.tree_attention(q, k, v, start, end)
            problem = compare_floats(out, want, "out", LABELS, ATOL, RTOL)
            if problem:
                why = (explain_tree_attention(out, q, k, v, start, end, tile, ATOL, RTOL, causes)
                       or race(out, again)
                       or (most_values_wrong(out, want, ATOL, RTOL, tile) if TILE_LAYOUT in causes else ""))
                problem += f"\n{why}" if why else ""
            problem = (problem
                       or _sampled_rows_problem(out.cpu(), q.cpu(), k.cpu(), v.cpu(), batch,
                                                start.cpu(), end.cpu(), drawn + 3)
                       or rerun_problem(out, again))
            return CaseResult(name, False, problem) if problem else None
        yield name, run


def race(first: torch.Tensor, second: torch.Tensor) -> str:
    """'' when two runs of a wrong kernel agree (NaN where NaN); else where they first differ."""
    same = (first == second) | (first.isnan() & second.isnan())
    if bool(same.all()):
        return ""
    b, h, r, _ = first_index(~same.cpu())
    return (f"two runs on the same input differ (first at batch {b}, head {h}, row {r}): a race, threads "
            "reading shared memory that others overwrite (a missing cuda.syncthreads() between a tile's last "
            "reads and the next tile's stores, or between stores and reads?)")


def check_tile_visibility(module, seed: int):
    """module.tile_visibility(start, end) must be the (B, T, T) tile mask: 1 exactly where some
    row of the query tile sees some key of the key tile (pyspec_ref.tile_mask per batch entry)."""
    device = runtime.torch_device()
    tile = module.TILE
    cases = [(case.name, [case]) for case in inputs.edge_case_trees(tile)]
    mixed = f"batch of 3 different trees N={tile + 7}"
    cases.append((mixed, inputs.random_cases(3, tile + 7, inputs.case_seed(seed, mixed))))
    # More than 32 key tiles: a second group of key tiles (too slow for the simulator).
    big = runtime.pick(sim=None, gpu=66 * tile + 5)
    if big:
        name = f"random tree N={big}: 67 tiles"
        cases.append((name, inputs.random_cases(1, big, inputs.case_seed(seed, name))))
    for name, batch in cases:
        def run(name=name, batch=batch):
            start, end = (t.to(device) for t in inputs.dfs_times_tensors(batch))
            got = module.tile_visibility(start, end)
            again = module.tile_visibility(start, end)
            want = oracle.tile_mask(start, end, tile).to(torch.uint8)
            problem = compare_ints(got, want, "tile_visible", ("batch", "query tile", "key tile"))
            for b, case in enumerate(batch):
                if problem or case.n > SPEC_TILE_NODES:
                    break
                spec = pyspec_ref.tile_mask(start[b].tolist(), end[b].tolist(), tile)
                problem = compare_ints(got[b], torch.tensor(spec, dtype=torch.uint8), f"tile_visible[{b}]",
                                       ("query tile", "key tile"))
            problem = problem or rerun_problem(got, again)
            return CaseResult(name, False, problem) if problem else None
        yield name, run
