"""Our reference answers stay hidden until earned: `compare_with_ours` shows an exercise's reference
only once its check passed on the student's code as it stands (or in solutions mode), `reveal`
shows it on request, and a hand-out without solutions/ says so instead of crashing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from course import answers, progress
from course.checks import CaseResult, Exercise, Report
from course.core import impl, regions
from course.registry import EXERCISES, check, checked_together

ROOT = Path(__file__).resolve().parent.parent
ANSWER_LINE = "l = l * torch.exp(m - m_new) + torch.exp(tile - m_new.unsqueeze(-1)).sum(dim=-1)"


@pytest.fixture
def course_copy(tmp_path, monkeypatch):
    """A course with attention's and triton_attention's solutions, and lessons in which the student
    has written attention's exercises (their lesson is the solution), the record of passes empty."""
    root = tmp_path / "course"
    for folder in ("solutions", "lessons"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
        for module in ("attention", "triton_attention"):
            shutil.copy(ROOT / "solutions" / f"{module}.py", root / folder / f"{module}.py")
    monkeypatch.setattr(regions, "ROOT", root)
    monkeypatch.setenv(progress.PASSES_ENV, str(tmp_path / "passed.json"))
    monkeypatch.setenv(impl.IMPL_ENV, "lessons")
    assert ANSWER_LINE in (root / "solutions" / "attention.py").read_text()
    return root


def _record_pass(exercise_id: str) -> bool:
    """What a passing check of the lessons records: the exercises its run checks."""
    return progress.record_pass(checked_together(EXERCISES[exercise_id]))


def _shown(capsys, call, target) -> str:
    call(target)
    return capsys.readouterr().out


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def test_not_passed_hides_the_reference_and_says_how_to_get_it(course_copy, capsys):
    shown = _shown(capsys, answers.compare_with_ours, "attention.online_softmax")
    assert ANSWER_LINE not in shown
    assert 'course.check("attention.online_softmax")' in shown
    assert 'course.reveal("attention.online_softmax")' in shown
    assert len(shown.strip().splitlines()) == 1


def test_a_pass_shows_it_until_the_code_changes(course_copy, capsys):
    assert _record_pass("attention.online_softmax")
    assert answers.earned("attention.online_softmax")
    assert ANSWER_LINE in _shown(capsys, answers.compare_with_ours, "attention.online_softmax")
    assert not answers.earned("attention.flash_attention")  # only the exercise that passed
    lesson = course_copy / "lessons" / "attention.py"
    # Another function of the same file changes: the pass stands.
    _edit(lesson, "    lse = torch.logaddexp(lse_a, lse_b)", "    lse = torch.logaddexp(lse_b, lse_a)")
    assert answers.earned("attention.online_softmax")
    # The passed function changes: hidden again, and the line says why.
    _edit(lesson, "        m = m_new\n    return torch.exp", "        m = m_new + 0\n    return torch.exp")
    assert not answers.earned("attention.online_softmax")
    shown = _shown(capsys, answers.compare_with_ours, "attention.online_softmax")
    assert ANSWER_LINE not in shown and "changed since its check passed" in shown


def test_a_passing_check_of_the_lessons_records_it(course_copy, monkeypatch):
    monkeypatch.setattr(Exercise, "run",
                        lambda self, impl=None, seed=0, full=False: Report(self.id, [CaseResult("a", True)]))
    check("attention.online_softmax", impl="solutions", quiet=True)  # the reference's pass is not yours
    assert not answers.earned("attention.online_softmax")
    check("attention.online_softmax", quiet=True)
    assert progress.passes() == {"attention.online_softmax": progress.fingerprint(
        answers.exercises_of("attention.online_softmax")[0])}
    assert answers.earned("attention.online_softmax")


def test_a_failing_check_records_nothing(course_copy, monkeypatch):
    monkeypatch.setattr(Exercise, "run", lambda self, impl=None, seed=0, full=False: Report(
        self.id, [CaseResult("a", True), CaseResult("b", False, "row 3 differs")]))
    check("attention.online_softmax", quiet=True, raise_on_failure=False)
    assert progress.passes() == {}


def test_one_check_that_runs_two_exercises_earns_both(course_copy):
    _record_pass("triton_attention.tree_attention_kernel")
    assert answers.earned("triton_attention.online_softmax_step")
    assert answers.earned("triton_attention.tree_attention_kernel")


def test_solutions_mode_shows_it(course_copy, capsys, monkeypatch):
    monkeypatch.setenv(impl.IMPL_ENV, "solutions")
    assert ANSWER_LINE in _shown(capsys, answers.compare_with_ours, "attention")


def test_reveal_shows_it_whenever_asked(course_copy, capsys):
    shown = _shown(capsys, answers.reveal, "attention")
    assert ANSWER_LINE in shown and "def merge_attention" in shown
    assert progress.passes() == {}  # asking is not passing


def test_a_handout_says_there_is_no_reference(course_copy, capsys):
    shutil.rmtree(course_copy / "solutions")
    for call in (answers.reveal, answers.compare_with_ours):
        assert _shown(capsys, call, "attention.online_softmax").strip() == answers.NO_REFERENCE
    assert _record_pass("attention.online_softmax")  # recording still works, for later


def test_a_read_only_repository_keeps_the_record_in_the_users_cache(course_copy, tmp_path, monkeypatch):
    monkeypatch.delenv(progress.PASSES_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (course_copy / ".course").write_text("")  # a file where the folder should be: nothing can go there
    assert _record_pass("attention.online_softmax")
    assert answers.earned("attention.online_softmax")
    assert list((tmp_path / "home" / ".cache" / "speckernels").glob("passed-*.json"))


def test_a_damaged_record_counts_as_no_pass(course_copy, tmp_path):
    (tmp_path / "passed.json").write_text("{not json")
    assert not answers.earned("attention.online_softmax")
    assert _record_pass("attention.online_softmax")
    assert answers.earned("attention.online_softmax")


def test_a_rung_shows_its_change_and_find_the_bug_its_region():
    change = answers.reference("ladder_k2.tree_attention_kernel")
    assert "--- ladder_k1.tree_attention_kernel" in change and "\n+" in change
    bug = answers.reference("ladder_bug.tree_attention_kernel")
    assert "cuda.syncthreads()" in bug and "### LESSON" in bug and "def tree_attention_kernel" not in bug
    whole = answers.reference("ladder_k10.tile_visibility_kernel")  # rung 9 has no such kernel
    assert whole.count("def tile_visibility_kernel") == 1 and "### BEGIN SOLUTION" in whole


def test_a_wrong_target_is_named():
    with pytest.raises(ValueError, match="target must be"):
        answers.reveal("ladder_k99")
    with pytest.raises(TypeError, match="target must be"):
        answers.compare_with_ours(4)
