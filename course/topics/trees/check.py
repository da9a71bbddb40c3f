"""Checks for notebook 01: DFS times, the dense tree mask and its bitmask."""

from __future__ import annotations

import random

import torch

import pyspec_ref
from course import oracle
from course.checks import CaseResult, rerun_problem
from course.checks.diagnose import compare_ints, compare_mask, explain_pair, first_index
from course.core import inputs, runtime
from course.core.launch import launch, never_written, poisoned_empty

SAMPLED_ROWS = 16  # rows per tree compared with pyspec_ref when the output is large
WORD_BITS = 64  # keys per bitmask word


def tree_cases(seed: int, tile: int) -> list[tuple[str, list[inputs.TreeCase]]]:
    """Batches to check: each edge case alone, a batch of different trees, fresh random ones (each
    random case drawn from its own seed, `inputs.case_seed`)."""
    n_random = runtime.pick(sim=2 * tile + 5, gpu=1024)
    batches = [(case.name, [case]) for case in inputs.edge_case_trees(tile)]
    mixed = f"batch of 3 different random trees N={n_random}"
    batches.append((mixed, inputs.random_cases(3, n_random, inputs.case_seed(seed, mixed))))
    for case in inputs.random_cases(2, runtime.pick(sim=tile + 3, gpu=4096), seed):
        batches.append((case.name, [case]))
    return batches


def check_dfs_times(module, seed: int):
    """dfs_times(parents) must equal pyspec_ref.dfs_times on every tree, twice in a row."""
    device = runtime.torch_device()
    for name, batch in tree_cases(seed, tile=16):
        def run(name=name, batch=batch):
            parents = inputs.batch_of_trees(batch, device)
            got = module.dfs_times(parents)
            again = module.dfs_times(parents)
            start, end = inputs.dfs_times_tensors(batch)
            for what, value, want in (("start", got[0], start), ("end", got[1], end)):
                problem = compare_ints(value, want, what, ("batch", "node"))
                if problem:
                    origin = scratch_origin(module, parents, got, what)
                    problem = f"{problem.splitlines()[0]}\n{origin}" if origin else problem
                    return CaseResult(name, False, problem)
            problem = rerun_problem(got, again)
            return CaseResult(name, False, problem) if problem else None
        yield name, run


# The scratch array the launcher gives dfs_times_kernel beside its outputs, and a value no DFS time
# or sum of them comes near: where the outputs move with it, they were computed from unset scratch.
SCRATCH = "cursor"
SCRATCH_MARK = -(2**30)


def scratch_origin(module, parents, got, what: str) -> str:
    """'' unless the wrong values of `what` come from the scratch array: then how many, and why.

    The launcher fills outputs and scratch alike with the sentinel of never-written values, so a
    start time copied from an unset cursor looks never written. Launching the kernel again with the
    scratch filled with SCRATCH_MARK tells the two apart: values copied from it move with it."""
    outputs = (poisoned_empty(parents.shape, dtype=parents.dtype, device=parents.device) for _ in range(2))
    start, end = outputs
    cursor = torch.full_like(parents, SCRATCH_MARK)
    try:  # a module without the kernel (a stand-in launcher) has no scratch to blame
        per_block = module.TREES_PER_BLOCK
        launch(module.dfs_times_kernel, (parents.shape[0] + per_block - 1) // per_block, per_block, parents,
               start, end, cursor, names=("parents", "start", "end", SCRATCH))
    except Exception:  # the case's own run went through: a second one that fails only says less
        return ""
    first, marked = dict(start=got[0], end=got[1])[what].cpu(), dict(start=start, end=end)[what].cpu()
    moved = first != marked
    if not moved.any():
        return ""
    b, node = first_index(moved)
    return (f"{int(moved.sum())} {what} values were computed from {SCRATCH}, not from the tree: run again "
            f"with {SCRATCH} filled with {SCRATCH_MARK} instead of {never_written(parents.dtype)}, batch "
            f"{b}, node {node} holds {int(marked[b, node])} instead of {int(first[b, node])}. {what} was "
            f"written, but from an entry of {SCRATCH} that nothing had stored yet ({SCRATCH} of the root, "
            "or of a node, not initialised before it is read?)")


def reference_rows(batch, rows_per_tree: int, seed: int):
    """(b, q, row) from pyspec_ref's definition (ancestor walks): every row of a small tree,
    a random sample of rows of a large one."""
    rng = random.Random(seed)
    for b, case in enumerate(batch):
        n = case.n
        rows = range(n) if n <= rows_per_tree else sorted(rng.sample(range(n), rows_per_tree))
        for q in rows:
            visible = set(pyspec_ref.ancestors(list(case.parents), q))
            yield b, q, torch.tensor([k in visible for k in range(n)])


def mask_problem(got, batch, start, end, seed: int) -> str:
    """'' when got is the tree mask of batch; else which (query, key) pair is wrong and why."""
    start, end = start.cpu(), end.cpu()
    problem = compare_mask(got, oracle.dense_tree_mask(start, end), start, end)
    if problem:
        return problem
    for b, q, row in reference_rows(batch, SAMPLED_ROWS, seed):
        if not torch.equal(got[b, q].cpu(), row):  # the oracle itself disagrees with the spec
            return f"batch {b}, query {q}: row differs from pyspec_ref.tree_mask"
    return ""


def check_tree_mask(module, seed: int):
    """tree_mask(start, end) must be the dense ancestor-or-self mask, twice in a row."""
    device = runtime.torch_device()
    for name, batch in tree_cases(seed, tile=module.MASK_TILE):
        def run(name=name, batch=batch):
            start, end = (t.to(device) for t in inputs.dfs_times_tensors(batch))
            got = module.tree_mask(start, end)
            again = module.tree_mask(start, end)
            problem = (mask_problem(got, batch, start, end, inputs.case_seed(seed, name))
                       or rerun_problem(got, again))
            return CaseResult(name, False, problem) if problem else None
        yield name, run


def expected_bitmask(batch):
    """Bitmask words from pyspec_ref, as int64 (bit 63 is the sign bit) like the kernel's."""
    rows = [pyspec_ref.tree_bitmask(list(case.parents)) for case in batch]
    signed = [[[w - (1 << 64) if w >= 1 << 63 else w for w in row] for row in tree] for tree in rows]
    return torch.tensor(signed, dtype=torch.int64)


def check_tree_bitmask(module, seed: int):
    """tree_bitmask(start, end) must pack the mask 64 keys to a word, as pyspec_ref does."""
    device = runtime.torch_device()
    random_wide = "random tree N=130 (three words)"
    wide = [  # more than 64 keys: bit 63 (the sign bit of an int64 word) and further words
        ("chain N=70 (bit 63 and a second word)", [inputs.TreeCase("chain", tuple(inputs.chain(70)))]),
        (random_wide, [inputs.TreeCase("random", tuple(inputs.random_tree(
            130, random.Random(inputs.case_seed(seed, random_wide)))))]),
    ]
    for name, batch in tree_cases(seed, tile=module.MASK_TILE) + wide:
        if batch[0].n > 2048:
            continue  # the pure-Python bitmask is quadratic; large trees are covered by tree_mask
        def run(name=name, batch=batch):
            start, end = (t.to(device) for t in inputs.dfs_times_tensors(batch))
            got = module.tree_bitmask(start, end)
            problem = words_problem(got, expected_bitmask(batch), start, end)
            return CaseResult(name, False, problem) if problem else None
        yield name, run


def words_problem(got: torch.Tensor, want: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> str:
    """'' when the bitmask words are right, else the first wrong word and, in it, the first wrong
    bit as the (query, key) pair it stands for (bit j of word w is key 64 w + j)."""
    problem = compare_ints(got, want, "word", ("batch", "query", "word"))
    if not problem or got.shape != want.shape:
        return problem
    got, want = got.cpu(), want.cpu()
    b, q, w = first_index(got != want)
    differ = (int(got[b, q, w]) ^ int(want[b, q, w])) & (2 ** 64 - 1)
    bit = (differ & -differ).bit_length() - 1  # the lowest bit that differs
    key, n = w * WORD_BITS + bit, start.shape[1]
    shown = bool((int(got[b, q, w]) >> bit) & 1)
    if key >= n:
        return f"{problem}\nbit {bit} of that word is key {key}, past the tree's {n} keys: it must stay 0"
    pair = explain_pair(shown, b, q, key, start.cpu(), end.cpu())
    return f"{problem}\nbit {bit} of that word is key {key}: {pair}"
