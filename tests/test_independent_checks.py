"""Exercises check independently: notebook 15's draw (`first_crossing`) is checked with the student's
tile pass still a stub, on a PyTorch stand-in for it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from unittest import mock

import torch

from course import release
from course.checks import run_cases
from course.core import runtime
from course.core.impl import load
from course.core.stubs import kernel_stub_name
from course.registry import EXERCISES
from course.topics.sampling import check as sampling_checks

ROOT = Path(__file__).resolve().parent.parent


def _lesson_with_open(exercise: str, tmp_path: Path):
    """The lesson of `exercise`'s module with only that exercise a stub (the others written)."""
    module = EXERCISES[exercise].module
    path = tmp_path / f"{module}.py"
    path.write_bytes(release.render(ROOT / "solutions", lambda e: e == exercise)[Path(f"{module}.py")])
    spec = importlib.util.spec_from_file_location(f"lessons.{module}_only_{exercise.split('.')[1]}", path)
    lesson = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lesson)
    return lesson


def test_first_crossing_is_checked_without_the_tile_pass(tmp_path):
    lesson = _lesson_with_open("spec_sampling.tile_pass_kernel", tmp_path)
    assert kernel_stub_name(lesson.tile_pass_kernel) == "spec_sampling.tile_pass_kernel"
    report = run_cases("spec_sampling.first_crossing",
                       EXERCISES["spec_sampling.first_crossing"].cases(lesson, 0))
    assert report.passed, report.text()


def test_the_stand_in_tile_pass_matches_the_kernel():
    solution = load("spec_sampling", "solutions")
    for case in sampling_checks.edge_cases(0)[:4]:
        draft_tokens, q, p, accept_uniforms, _ = case.on(runtime.torch_device())
        from_logits = case.form == "logits"
        want = solution.tile_pass(draft_tokens, q, p, accept_uniforms, from_logits=from_logits,
                                  tile=case.tile)
        with mock.patch.object(solution, "tile_pass_kernel", sampling_checks.TilePassStandIn()):
            got = solution.tile_pass(draft_tokens, q, p, accept_uniforms, from_logits=from_logits,
                                     tile=case.tile)
        assert torch.equal(got[0], want[0]), case.name
        for a, b in zip(got[1:], want[1:], strict=True):
            torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-7, msg=case.name)

