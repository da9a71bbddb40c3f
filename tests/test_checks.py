"""The checks pass the solutions and catch realistic bugs, saying where and how."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from course import checks
from course.checks import CheckFailed, run_cases
from course.core import impl as course_impl
from course.core import runtime
from course.registry import EXERCISES, check, checked_together, get, select
from solutions import attention, trees

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _checked_by_its_notebook(exercise) -> bool:
    """Whether the exercise's notebook runs its check, or the check that is the same run (under nbval
    in the same test run): running the same cases twice would only cost time."""
    notebook = NOTEBOOKS / f"{EXERCISES[exercise].notebook}.ipynb"
    if not notebook.exists():
        return False
    code = "".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"]
                   if cell["cell_type"] == "code")
    return any(f'check("{same.id}"' in code for same in checked_together(EXERCISES[exercise]))


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_solutions_pass_every_check(exercise):
    if runtime.SIMULATOR and _checked_by_its_notebook(exercise):
        pytest.skip("its notebook runs this check (nbval)")
    report = check(exercise, impl="solutions", seed=1234, quiet=True)
    assert report.passed and report.fraction == 1.0 and len(report.results) >= 4


def _run(exercise, module, seed=0):
    return run_cases(exercise, get(exercise).cases(module, seed))


def test_dfs_times_in_reversed_child_order_is_caught():
    def dfs_times(parents):  # visits children in decreasing id: a plausible, wrong preorder
        flipped = parents.clone()
        start, end = trees.dfs_times(flipped)
        n = parents.shape[1]
        return (n - 1 - end).to(torch.int32), (n - 1 - start).to(torch.int32)

    report = _run("trees.dfs_times_kernel", SimpleNamespace(dfs_times=dfs_times))
    assert not report.passed and 0 < report.fraction < 1  # a chain of 1 node still passes
    assert "start = " in report.text() and "expected" in report.text()


def test_off_by_one_mask_is_caught_with_the_pair_named():
    def tree_mask(start, end):  # strict comparison: a query no longer sees itself
        mask = trees.tree_mask(start, end)
        return mask & ~torch.eye(start.shape[1], dtype=torch.bool, device=mask.device)

    module = SimpleNamespace(tree_mask=tree_mask, MASK_TILE=trees.MASK_TILE)
    report = _run("trees.tree_mask_kernel", module)
    assert report.fraction == 0.0
    assert "the mask hid key 0 from query 0, but it is an ancestor-or-self" in report.text()


def test_a_mask_that_sees_too_much_is_caught():
    def tree_mask(start, end):  # the causal mask: right for chains only
        n = start.shape[1]
        return torch.ones(n, n, dtype=torch.bool).tril().expand(start.shape[0], n, n).clone()

    report = _run("trees.tree_mask_kernel", SimpleNamespace(tree_mask=tree_mask, MASK_TILE=16))
    assert 0 < report.fraction < 1  # chains and N <= 2 pass, real trees fail
    assert "which is not its ancestor" in report.text()


def test_a_racy_kernel_is_caught_by_running_twice():
    calls = []

    def tree_mask(start, end):  # right the first time, one entry off the second time
        mask = trees.tree_mask(start, end)
        calls.append(1)
        if len(calls) % 2 == 0:
            mask[0, 0, 0] = ~mask[0, 0, 0]
        return mask

    report = _run("trees.tree_mask_kernel", SimpleNamespace(tree_mask=tree_mask, MASK_TILE=16))
    assert report.fraction == 0.0
    assert "two runs on the same input differ" in report.text()


def test_bitmask_with_bit_63_dropped_is_caught():
    def tree_bitmask(start, end):
        return trees.tree_bitmask(start, end) & ((1 << 63) - 1)

    report = _run("trees.tree_bitmask_kernel", SimpleNamespace(tree_bitmask=tree_bitmask,
                                                               MASK_TILE=16))
    assert not report.passed  # 64-node chains set bit 63 of their last rows


def test_online_softmax_without_rescale_is_caught():
    def online_softmax(x, block):  # forgets to rescale l when the max grows
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
        l = torch.zeros_like(m)
        for first in range(0, x.shape[-1], block):
            tile = x[..., first:first + block]
            m = torch.maximum(m, tile.max(dim=-1).values)
            l = l + torch.exp(tile - m.unsqueeze(-1)).sum(dim=-1)
        return torch.exp(x - m.unsqueeze(-1)) / l.unsqueeze(-1)

    report = _run("attention.online_softmax", SimpleNamespace(online_softmax=online_softmax))
    assert 0 < report.fraction < 1  # block = whole row is still right
    assert "max |got - expected|" in report.text()


def test_flash_attention_that_nans_on_hidden_tiles_is_caught():
    def flash_attention(q, k, v, mask=None, block_k=32, scale=None):
        out, lse = attention.flash_attention(q, k, v, mask, block_k, scale)
        hidden_first_tile = mask is not None and not mask[..., :block_k].any(-1).all()
        return (out * float("nan"), lse) if hidden_first_tile else (out, lse)

    report = _run("attention.flash_attention", SimpleNamespace(flash_attention=flash_attention))
    assert not report.passed and "NaN" in report.text()


def test_merge_that_ignores_empty_parts_is_caught():
    def merge_attention(out_a, lse_a, out_b, lse_b):
        return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)

    report = _run("attention.merge_attention", SimpleNamespace(merge_attention=merge_attention))
    assert report.fraction == 0.0


def test_check_raises_with_the_report_and_a_crash_is_one_failed_case(monkeypatch):
    def crashing(parents):
        raise RuntimeError("boom")

    monkeypatch.setattr("course.core.impl.load", lambda module, impl=None: SimpleNamespace(
        dfs_times=crashing))
    with pytest.raises(CheckFailed, match="raised RuntimeError: boom"):
        check("trees.dfs_times_kernel", quiet=True)


def test_exercise_selection_is_validated():
    assert [e.id for e in select("02")] == [e for e in EXERCISES if e.startswith("attention.")]
    with pytest.raises(ValueError, match="exercise must be"):
        select("99")
    with pytest.raises(ValueError, match="exercise must be one of"):
        get("trees.nope")


def _names(cases) -> list[str]:
    return [name for name, _ in cases]


@pytest.mark.parametrize("exercise", [e for e in EXERCISES.values() if e.default_cases], ids=lambda e: e.id)
def test_a_default_list_is_a_few_named_cases_of_the_full_one(exercise):
    module = course_impl.load(exercise.module, "solutions")
    for seed in (checks.PUBLIC_SEED, 1234):
        full = _names(exercise.selected_cases(module, seed, full=True))
        default = _names(exercise.selected_cases(module, seed))
        assert full == _names(exercise.cases(module, seed))  # --full, and grading, run every case
        if not runtime.SIMULATOR:  # a GPU runs every case, at its own sizes
            assert default == full
            continue
        assert 4 <= len(default) < len(full) and set(default) <= set(full)
        for start in exercise.default_cases:  # a renamed case must not drop out of the list unseen
            assert any(name.startswith(start) for name in full), (exercise.id, start)


@pytest.mark.skipif(not runtime.SIMULATOR, reason="a GPU runs every case: default lists are the simulator's")
def test_a_report_of_the_default_list_says_how_to_run_them_all(monkeypatch):
    exercise = get("ladder_k1.tree_attention_kernel")
    monkeypatch.setitem(EXERCISES, exercise.id, dataclasses.replace(
        exercise, cases=lambda module, seed: iter([("single node", lambda: None), ("random", lambda: None)])))
    default = get(exercise.id).run(impl="solutions")
    assert [r.case for r in default.results] == ["single node"]
    assert ("passed all 1 cases (the default list; `python -m course check ladder_k1.tree_attention_kernel "
            "--full` runs every case") in default.text()
    full = get(exercise.id).run(impl="solutions", full=True)
    assert len(full.results) == 2 and "--full" not in full.text()


def test_a_notebook_whose_exercises_share_one_check_runs_it_once(monkeypatch, capsys):
    from course.__main__ import main

    ran = []

    def cases(module, seed):
        ran.append(seed)
        yield "one case", lambda: None

    for exercise in select("12"):  # both get the same function: still one run
        same = dataclasses.replace(exercise, cases=cases, default_cases=())
        monkeypatch.setitem(EXERCISES, exercise.id, same)
    assert main(["check", "12", "--impl", "solutions"]) == 0
    assert ran == [checks.PUBLIC_SEED]
    assert ("triton_attention.online_softmax_step, triton_attention.tree_attention_kernel: passed all 1 cases"
            in capsys.readouterr().out)
