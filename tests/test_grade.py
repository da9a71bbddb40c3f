"""Grading: sample submissions (tests/submissions/) get the grades and notes they must get.

Each sample is a recipe (`sample.py`): the code a student wrote in some exercise holes, lines
changed outside them, extra files, links. At test time it becomes a lessons/ folder: the lesson
with every other hole filled from solutions/ (so nothing here holds a solution), then the sample's
changes. Two grading runs, two submissions at a time, over three fast exercises, with the
sandbox on and short limits:
- `graded`: every sample as handed in; the hole rules refuse what reaches outside an exercise;
- `escaped`: the hostile samples again with the hole rules switched off (monkeypatched), standing
  for a student who found a way past them: then the sandbox alone must hold.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import re
import socket
import zipfile
from pathlib import Path

import pytest

from course.core import runtime
from course.grading import Limits, grade, report, sandbox
from course.grading.collect import SubmissionError, find_submissions, safe_extract
from tests.grading_samples import SAMPLES, recipe, remove_deep, write_correct, write_sample

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ["trees.dfs_times_kernel", "trees.tree_bitmask_kernel", "attention.online_softmax"]
POINTS = {"trees.dfs_times_kernel": 3, "trees.tree_bitmask_kernel": 2, "attention.online_softmax": 2}
SEED, ESCAPED_SEED = 1234, 97531
LIMITS = Limits(per_exercise_s=10, total_s=120, memory_mb=1536, output_mb=1, processes=1024)
# The samples that get past the hole rules: none is meant to hang, and fork_allocate's children must
# touch 2.1 GB before it returns, which a loaded 2-core machine can take longer than 10 s to do.
ESCAPED_LIMITS = dataclasses.replace(LIMITS, per_exercise_s=60, total_s=300)
CANARY = "canary-3141-grader-secret"
ONLINE, BITMASK, DFS = "attention.online_softmax", "trees.tree_bitmask_kernel", "trees.dfs_times_kernel"
HELPER = "course-grade-helper-7361"
OUTSIDE_FILES = ("escaped.txt", "shell.txt", "ctypes.txt", "db.sqlite", "late.txt")

needs_bwrap = pytest.mark.skipif(sandbox.bwrap() is None,
                                 reason="bubblewrap is not installed (.ci/run installs it)")


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def _run(base: Path, names: list[str], seed: int, extra=(), limits: Limits = LIMITS) -> dict:
    watched = base / "watched"  # stands for the grader's repository and other students: nothing may change
    (watched / "course").mkdir(parents=True)
    (watched / "course" / "keep.py").write_text("unchanged")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    tokens = {"@WATCHED@": str(watched), "@ROOT@": str(ROOT), "@PORT@": str(listener.getsockname()[1])}
    submissions = base / "submissions"
    for name in names:
        write_sample(name, submissions, tokens)
    for name in extra:
        write_correct(submissions / name)
    before = _digest(watched)
    out = base / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COURSE_GRADE_CANARY", CANARY)
        grades = grade(submissions, out, seed, exercises=EXERCISES, limits=limits, jobs=2, progress=False)
    try:
        listener.accept()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    return {"grades": {g.student: g for g in grades}, "out": out, "connected": connected,
            "watched_changed": _digest(watched) != before, "processes": _processes_with(HELPER)}


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


ALL = sorted(p.name for p in SAMPLES.iterdir() if (p / "sample.py").is_file())
ESCAPING = ["segfault", "exits", "writes_outside", "forged_results", "crashing_reply", "answer_key",
            "patch_checks", "fake_tensor", "spec_in_kernel", "detached_helper", "fork_allocate", "many_files",
            "info_leak", "zero_stride_reply", "spec_import", "module_level", "library_softmax"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("graded")
    zipped = base / "zipped"  # a zipped repository copy, wrapped in a folder as GitHub's "download zip" does
    write_sample("ann_lee", zipped / "SpecKernels-main", {})
    (base / "submissions").mkdir()
    with zipfile.ZipFile(base / "submissions" / "zipped.zip", "w") as zf:
        for path in sorted(zipped.rglob("*.py")):
            zf.write(path, path.relative_to(zipped).as_posix())
    yield _run(base, ALL, SEED, extra=["correct"])
    remove_deep(base / "submissions" / "deep_folders")  # deeper than shutil.rmtree's recursion goes


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The correct submission graded alone, with the same seed as in `graded`."""
    return _run(tmp_path_factory.mktemp("alone"), [], SEED, extra=["correct"])


@pytest.fixture(scope="module")
def escaped(tmp_path_factory):
    from course.grading import splice

    base = tmp_path_factory.mktemp("escaped")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(splice, "refusals", lambda *args, **kwargs: [])
        return _run(base, ESCAPING, ESCAPED_SEED, extra=["correct"], limits=ESCAPED_LIMITS)


def _points(g) -> dict[str, float]:
    return {e: g.exercises[e].points for e in EXERCISES}


def _feedback(run, student: str) -> str:
    return (run["out"] / "feedback" / f"{student}.md").read_text()


def _all_text(g) -> str:
    parts = [*g.notes] + [x for e in g.exercises.values() for x in (e.note, e.not_implemented)]
    parts += [detail for e in g.exercises.values() for _, _, detail in e.results]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------ with the hole rules

REFUSED = {  # sample: (exercise, why)
    "segfault": (ONLINE, "uses an import"), "exits": (ONLINE, "uses an import"),
    "writes_outside": (ONLINE, "uses an import"), "forged_results": (ONLINE, "uses an import"),
    "crashing_reply": (ONLINE, "uses an import"), "answer_key": (ONLINE, "uses an import"),
    "patch_checks": (ONLINE, "uses an import"), "fake_tensor": (ONLINE, "uses a class"),
    "library_softmax": (ONLINE, "uses torch.softmax"),
    "spec_in_kernel": (DFS, "uses an import"),
    "detached_helper": (ONLINE, "uses an import"), "fork_allocate": (ONLINE, "uses an import"),
    "many_files": (ONLINE, "uses `try`"), "info_leak": (ONLINE, "uses an import"),
    "zero_stride_reply": (ONLINE, "uses an import"),
    "spec_import": (ONLINE, "uses an import"),
    "alias_module": (ONLINE, "uses the module torch as a value"),
    "module_level": (DFS, "outside its function (module-level code)"),
}
FILTERED = {  # sample: (exercise, its points, note on it, flag)
    "partly_correct": (ONLINE, 1.0, "", ""),
    "syntax_error": (DFS, 0, "region 1 of trees.dfs_times_kernel does not parse: expected ':'", ""),
    "hangs": (ONLINE, 0, "hung: it ran past the time limit of 10 s", "timed out"),
    "prints_megabytes": (ONLINE, 0, "printed or wrote too much: over the 1 MB output limit",
                         "too much output"),
    "monkeypatch": (ONLINE, 0, "", ""),
    "shadow_course": (ONLINE, 0, "", ""),
    "answer_key_link": (ONLINE, 0, "", ""),
    "oracle_launcher": (BITMASK, 0, "", ""),
    "injection": (ONLINE, 0, "", ""),
    "changes_input": (ONLINE, 0, "", ""),
    "expand_reply": (ONLINE, 0, "", ""),
    "deep_nesting": (ONLINE, 0, "lessons/attention.py could not be read (nested too deeply)", ""),
    **{name: (exercise, 0, why, "tampering") for name, (exercise, why) in REFUSED.items()},
}


@needs_bwrap
@pytest.mark.parametrize("student", ["correct", "zipped", "ann_lee", "ann_lee-3", "respaced"])
def test_correct_submissions_get_every_point(graded, student):
    g = graded["grades"][student]
    assert _points(g) == POINTS, g.exercises
    assert g.flags == []


@needs_bwrap
@pytest.mark.parametrize("student", sorted(FILTERED))
def test_each_sample_gets_its_grade_and_keeps_the_points_earned_elsewhere(graded, student):
    exercise, points, note, flag = FILTERED[student]
    student_id = recipe(student).get("NAME", student).replace("+", "_")
    g = graded["grades"][student_id]
    assert g.exercises[exercise].points == points, g.exercises[exercise]
    assert note in g.exercises[exercise].note
    assert (flag in g.flags) if flag else g.flags == [], g.flags
    if flag == "tampering":
        assert "was refused" in g.exercises[exercise].note
    if note:  # as the feedback shows it: inert markdown
        assert report._md(note.split(":")[0]) in _feedback(graded, student_id)
    others = {e: p for e, p in _points(g).items() if e != exercise}
    assert others == {e: p for e, p in POINTS.items() if e != exercise}


@needs_bwrap
def test_changes_outside_the_holes_are_ignored_and_said_so(graded):
    grades = graded["grades"]
    for student, module in (("monkeypatch", "attention"), ("case_size", "trees"),
                            ("oracle_launcher", "trees")):
        assert any(f"lessons/{module}.py: your changes outside the exercise regions" in n
                   for n in grades[student].notes), grades[student].notes
    assert grades["oracle_launcher"].exercises[BITMASK].not_implemented  # the kernel is still the stub


@needs_bwrap
def test_case_sizes_come_from_the_graders_constants(graded):
    bitmask = graded["grades"]["case_size"].exercises[BITMASK]
    failing = [case for case, passed, _ in bitmask.results if not passed]
    # 2 * MASK_TILE + 5 nodes, with the grader's MASK_TILE = 16
    assert any("N=37" in case for case in failing), failing


@needs_bwrap
def test_a_call_that_changes_its_input_fails_its_cases(graded):
    results = graded["grades"]["changes_input"].exercises[ONLINE].results
    assert results and all(not passed and "changed tensor argument 1 (shape (5, 37)) in place" in detail
                           for _, passed, detail in results)


@needs_bwrap
def test_links_to_the_answer_key_are_not_followed(graded):
    grades = graded["grades"]
    assert any("lessons/attention.py is a link" in n for n in grades["answer_key_link"].notes)
    assert grades["answer_key_link"].exercises[ONLINE].not_implemented
    linked = grades["linked_lessons"]
    assert linked.total == 0 and "unusable" in linked.flags
    assert any("could not use the submission" in n for n in linked.notes)


@needs_bwrap
def test_colliding_names_get_distinct_ids_and_a_note(graded):
    """ann_lee keeps its name: neither `ANN_LEE` nor `ann lee` moves it; a 254-character name is cut."""
    grades = graded["grades"]
    assert grades["ann_lee"].notes == []
    assert any("graded as ANN_LEE-2" in n for n in grades["ANN_LEE-2"].notes)
    assert any("graded as ann_lee-3" in n for n in grades["ann_lee-3"].notes)
    assert (graded["out"] / "feedback" / "ann_lee-3.md").exists()
    long_id = "x" * 64
    assert any("the name made safe and short" in n for n in grades[long_id].notes)
    assert (graded["out"] / "feedback" / f"{long_id}.md").exists()


UNUSABLE = {  # sample: what its note says (it earns 0, flagged `unusable`; the others are graded)
    "zip_encrypted": "it is password-protected (encrypted)",
    "zip_lzma": "it uses LZMA compression, which grading does not unpack",
    "zip_method99": "it uses AES encryption (method 99) compression",
    "zip_bad_deflate": "not a zip grading can unpack",
    "zip_bad_utf8": "not a zip grading can unpack (UnicodeDecodeError",
    "zip_bomb": "more than 200 times its packed size",
    "zip_deep": "a path more than 32 folders deep",
    "deep_folders": "no lessons/ folder",
    "linked_lessons": "its lessons folder is a link",
}


@needs_bwrap
@pytest.mark.parametrize("student", sorted(UNUSABLE))
def test_a_submission_that_cannot_be_used_gets_a_note_and_stops_nobody(graded, student):
    g = graded["grades"][student]
    assert g.total == 0 and "unusable" in g.flags
    assert any(UNUSABLE[student] in n for n in g.notes), g.notes
    assert (graded["out"] / "feedback" / f"{student}.md").exists()


@needs_bwrap
def test_a_correct_submission_graded_beside_every_hostile_one_is_graded_as_alone(graded, alone):
    """Same points, the same feedback and the same grades.json row (but for the seconds it took)."""
    def row(run):
        document = json.loads((run["out"] / "grades.json").read_text())
        [found] = [s for s in document["students"] if s["student"] == "correct"]
        for exercise in found["exercises"].values():
            exercise.pop("seconds")
        return {k: v for k, v in found.items() if k != "source"}

    assert len(graded["grades"]) > 40
    assert row(graded) == row(alone)
    assert _feedback(graded, "correct") == _feedback(alone, "correct")
    book = {run_name: [r for r in csv.reader((run["out"] / "gradebook.csv").open()) if r[0] == "correct"]
            for run_name, run in (("graded", graded), ("alone", alone))}
    assert book["graded"] == book["alone"]


@needs_bwrap
def test_gradebook_and_feedback_are_escaped(graded):
    rows = list(csv.reader((graded["out"] / "gradebook.csv").open()))
    cells = [cell for row in rows for cell in row]
    assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))]
    assert ["'-1_1"] == [row[0] for row in rows if row[0].endswith("-1_1")]
    feedback = _feedback(graded, "-1_1")
    assert "HYPERLINK" in feedback  # the todo's text is shown ...
    outside_code = feedback.split("```")[0::2]  # ... but outside code blocks, nothing is live
    live = re.compile(r"<img|(?<!\\)\]\(|https?://|www\.evil")  # a tag, a link, a URL a viewer follows
    assert not any(live.search(part) for part in outside_code), outside_code
    assert "\x1b" not in feedback and "Total: 7 / 7" in feedback
    assert [line for line in feedback.splitlines() if line.startswith("#") and "Total" in line] == []


@needs_bwrap
def test_gradebook_has_a_row_per_student_and_a_column_per_exercise(graded):
    grades, out = graded["grades"], graded["out"]
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    assert rows[0]["student"] == "(points)"
    by_student = {r["student"].lstrip("'"): r for r in rows[1:]}
    assert set(by_student) == set(grades)
    assert float(by_student["correct"]["total"]) == sum(POINTS.values())
    assert float(by_student["partly_correct"][ONLINE]) == 1.0
    assert "timed out" in by_student["hangs"]["flags"]
    assert "failed: 5x37 scores, block=1, large scores" in _feedback(graded, "partly_correct")


@needs_bwrap
def test_nothing_outside_the_submissions_changed(graded):
    assert not graded["watched_changed"]
    assert not [name for name in OUTSIDE_FILES if (ROOT / name).exists()]


@needs_bwrap
def test_grades_json_says_how_the_submissions_were_limited(graded):
    document = json.loads((graded["out"] / "grades.json").read_text())
    assert document["sandbox"]["isolated"] is True
    assert document["sandbox"]["limits"].startswith(("cgroup v", "per process"))


@needs_bwrap
@pytest.mark.skipif(not runtime.SIMULATOR, reason="on a GPU, grading times the exercises")
def test_simulator_grading_times_nothing_and_says_so(graded):
    out = graded["out"]
    feedback = _feedback(graded, "correct")
    assert "## Speed" in feedback and "Not timed: this grading ran in the simulator" in feedback
    assert "without isolation" not in feedback
    document = json.loads((out / "grades.json").read_text())
    assert document["timing"]["timed"] is False
    assert document["students"][0]["exercises"][DFS]["student_ms"] is None
    header = next(csv.reader((out / "gradebook.csv").open()))
    assert not any(column.startswith("speed ") for column in header)


# ------------------------------------------------------------------------------------ past the hole rules

ON_DFS = ("spec_in_kernel", "module_level")  # the samples of the escaped run that attack dfs_times_kernel
ESCAPED = {  # sample: (its points on online_softmax (dfs_times_kernel for ON_DFS), note on it, flag)
    "segfault": (0, "crashed the interpreter: SIGSEGV", "crashed"),
    "exits": (0, "ended the process: exit code 3", "exited"),
    "writes_outside": (2, "", ""),
    "forged_results": (0, "", ""),
    "crashing_reply": (0, "", ""),
    "answer_key": (0, "", ""),
    "patch_checks": (0, "", ""),
    "fake_tensor": (0, "", ""),
    "spec_in_kernel": (0, "", ""),
    "detached_helper": (2, "", ""),
    "fork_allocate": (0, "used more than the memory limit (1536 MB, all its processes together)",
                      "out of memory"),
    "many_files": (0, "printed or wrote too much", "too much output"),
    "info_leak": (0, "", ""),
    "zero_stride_reply": (0, "", ""),
    "spec_import": (0, "", ""),
    "module_level": (0, "", ""),  # its `return` is spliced; the grader's MASK_TILE sizes the other cases
    "library_softmax": (0, "", ""),  # the check watches x: torch.softmax reads it whole (README)
}


@needs_bwrap
@pytest.mark.parametrize("student", sorted(ESCAPED))
def test_the_sandbox_holds_what_gets_past_the_hole_rules(escaped, student):
    points, note, flag = ESCAPED[student]
    exercise = DFS if student in ON_DFS else ONLINE
    g = escaped["grades"][student]
    limits = json.loads((escaped["out"] / "grades.json").read_text())["sandbox"]["limits"]
    if student == "fork_allocate" and not limits.startswith("cgroup"):
        # per process only (no cgroup here): RLIMIT_AS refuses each child's 700 MB, so the limit holds
        # without a kill, or the grader's polling stops the sandbox
        assert g.exercises[ONLINE].points == 2 or note in g.exercises[ONLINE].note
        return
    assert g.exercises[exercise].points == points, g.exercises[exercise]
    assert note in g.exercises[exercise].note
    assert (flag in g.flags) if flag else g.flags == []
    others = {e: p for e, p in _points(g).items() if e != exercise}
    assert others == {e: p for e, p in POINTS.items() if e != exercise}
    assert _points(escaped["grades"]["correct"]) == POINTS


@needs_bwrap
def test_replies_the_grader_cannot_read_fail_cases_not_the_run(escaped):
    crashing = escaped["grades"]["crashing_reply"].exercises[ONLINE]
    assert crashing.results and all("reply grading cannot read" in d for _, p, d in crashing.results if not p)
    bomb = escaped["grades"]["zero_stride_reply"].exercises[ONLINE]  # 4 bytes standing for a terabyte
    assert bomb.results and all("not a contiguous tensor of its own" in d
                                for _, p, d in bomb.results if not p)
    forged = escaped["grades"]["forged_results"].exercises[ONLINE]
    assert forged.results and not any(p for _, p, _ in forged.results)


@needs_bwrap
def test_a_library_softmax_fails_every_case_in_the_sandbox_too(escaped):
    online = escaped["grades"]["library_softmax"].exercises[ONLINE]
    assert online.results and all(not passed and "online_softmax applied torch.softmax to x whole" in detail
                                  for _, passed, detail in online.results), online.results


@needs_bwrap
def test_the_answer_key_is_out_of_reach(escaped):
    text = _all_text(escaped["grades"]["answer_key"])
    assert "No module named 'solutions'" in text and "found []" in text
    processes = [int(p) for p in text.split("among processes [")[1].split("]")[0].split(", ")]
    assert max(processes) < 50  # its own PID namespace: the grader's processes are not there


@needs_bwrap
def test_nothing_in_the_sandbox_holds_an_answer(escaped):
    """Past the hole rules, code that imports the specification, the oracle and the checks, reads their
    files and asks the grader to run the specification finds nothing: only the stand-ins of the
    validators launch code needs (course.grading.services), which the grader runs for a launcher."""
    text = _all_text(escaped["grades"]["spec_import"])
    assert "answers [] checks [] files [] served []" in text, text
    assert escaped["grades"]["spec_import"].exercises[ONLINE].points == 0
    spec_in_kernel = _all_text(escaped["grades"]["spec_in_kernel"])  # imports pyspec_ref in the kernel
    assert "grading does not run 'pyspec_ref.dfs_times'" in spec_in_kernel, spec_in_kernel


@needs_bwrap
def test_nothing_escapes_the_sandbox(escaped):
    assert not escaped["watched_changed"]
    assert not [name for name in OUTSIDE_FILES if (ROOT / name).exists()]
    assert escaped["processes"] == []  # the detached helpers died with the sandbox
    assert not escaped["connected"]


@needs_bwrap
def test_the_child_sees_no_secret(escaped):
    text = _all_text(escaped["grades"]["info_leak"])
    feedback = _feedback(escaped, "info_leak")
    assert "no network" in text and "uid=" in text and "uid=0 " not in text
    for secret in (CANARY, str(ESCAPED_SEED), str(ROOT), str(escaped["out"]), "partly_correct", "segfault"):
        assert secret not in text and secret not in feedback, secret


# ------------------------------------------------------------------------------------ pieces

def test_grading_refuses_without_bubblewrap_unless_told(tmp_path, monkeypatch):
    write_sample("ann_lee", tmp_path / "submissions", {})
    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    with pytest.raises(ValueError, match="--no-sandbox"):
        grade(tmp_path / "submissions", tmp_path / "out", SEED, exercises=[ONLINE], progress=False)
    grades = grade(tmp_path / "submissions", tmp_path / "out", SEED, exercises=[ONLINE], progress=False,
                   sandbox=False, limits=LIMITS)
    assert grades[0].exercises[ONLINE].points == 2
    assert "produced without isolation" in (tmp_path / "out" / "feedback" / "ann_lee.md").read_text()


def test_past_the_hole_rules_a_library_softmax_fails_the_checks_watch_on_x(tmp_path, monkeypatch):
    """online_softmax's check hands the function x watched for reads of more than a block at once
    (course.core.blockread); in grading the child watches its copy, so torch.softmax over x whole fails
    every case there too, with the rule said (no sandbox needed to show it: `escaped` shows it in one)."""
    from course.grading import splice

    write_sample("library_softmax", tmp_path / "submissions", {})
    monkeypatch.setattr(splice, "refusals", lambda *args, **kwargs: [])
    [graded_alone] = grade(tmp_path / "submissions", tmp_path / "out", SEED, exercises=[ONLINE],
                           progress=False, sandbox=False, limits=LIMITS)
    online = graded_alone.exercises[ONLINE]
    assert online.points == 0 and len(online.results) == 10, online
    assert all(not passed and "online_softmax applied torch.softmax to x whole (all 37 columns)" in detail
               and "at most block = " in detail for _, passed, detail in online.results), online.results


def test_gpu_nodes_are_bound_over_the_fresh_dev(tmp_path, monkeypatch):
    """bwrap mounts in order: a node bound before `--dev /dev` would lie hidden under the new /dev,
    and the child would see no GPU."""
    monkeypatch.setattr(sandbox, "bwrap", lambda: "/usr/bin/bwrap")
    monkeypatch.setattr(sandbox.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidiactl"])
    plan = sandbox.Plan(tmp_path, "/usr/bin/python3", (), (), (), True, ())
    command = sandbox._bwrap_command(plan, tmp_path, sandbox.Settings(2**30, 2**24, 64), ["python3"], 3,
                                      as_root=False)
    fresh_dev = command.index("--dev")
    assert command[fresh_dev + 1] == "/dev"
    binds = [i for i, word in enumerate(command) if word == "--dev-bind"]
    assert [command[i + 1] for i in binds] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert min(binds) > fresh_dev


def test_every_writable_place_has_a_size(tmp_path, monkeypatch):
    """/tmp and the working folder take the output limit's size, the caches the cache limit's."""
    monkeypatch.setattr(sandbox, "bwrap", lambda: "/usr/bin/bwrap")
    plan = sandbox.Plan(tmp_path, "/usr/bin/python3", (), (), (), False, ())
    settings = sandbox.Settings(2**30, 2**24, 64, cache=2**25)
    command = sandbox._bwrap_command(plan, tmp_path, settings, ["python3"], 3, as_root=False)
    sizes = {command[i + 1]: int(command[i - 1]) for i, word in enumerate(command) if word == "--tmpfs"}
    assert sizes == {"/tmp": 2**24, "/grading/work": 2**24, "/grading/cache": 2**25}
    assert all(command[i - 2] == "--size" for i, word in enumerate(command) if word == "--tmpfs")


def test_each_exercise_draws_its_cases_from_a_keyed_hash_of_the_seed():
    from course.grading.runner import case_seed

    seeds = {case_seed(SEED, e) for e in EXERCISES} | {case_seed(SEED + 1, e) for e in EXERCISES}
    assert len(seeds) == 2 * len(EXERCISES) and all(0 <= s < 2**56 for s in seeds)
    assert case_seed(SEED, ONLINE) == case_seed(SEED, ONLINE)  # the same seed, the same grade
    assert not any(abs(s - SEED) < 2**20 for s in seeds)  # not the private seed plus an offset


def test_zips_may_not_escape(tmp_path):
    for name in ("../evil.py", "/abs/evil.py"):
        archive = tmp_path / "evil.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr(name, "x = 1\n")
        with pytest.raises(SubmissionError, match="refuses the path"):
            safe_extract(archive, tmp_path / "target")
    assert not (tmp_path / "evil.py").exists()


def test_find_submissions(tmp_path):
    (tmp_path / "a" / "lessons").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trees.py").write_text("")
    (tmp_path / "c.zip").write_bytes(b"")
    (tmp_path / "C").mkdir()  # the same as c.zip, ignoring case: the lower-case name keeps its id
    (tmp_path / "C" / "trees.py").write_text("")
    found = find_submissions(tmp_path)
    assert [s.student for s in found] == ["C-2", "a", "b", "c"]
    assert found[0].note and not found[-1].note
    assert [s.student for s in find_submissions(tmp_path / "a")] == ["a"]
    with pytest.raises(ValueError, match="submissions"):
        find_submissions(tmp_path / "missing")


def test_every_ladder_rung_and_the_triton_kernel_have_a_bench_hook():
    from course import topics
    from course.grading.speed import hook_from_spec, hook_of
    from course.registry import EXERCISES
    from course.topics.ladder.rungs import RUNGS

    hooked = {e.id: hook_of(e) for e in EXERCISES.values() if e.timed}
    assert {f"{rung.module}.tree_attention_kernel" for rung in RUNGS} <= set(hooked)
    assert "triton_attention.tree_attention_kernel" in hooked
    assert all(hook_from_spec(hook.spec) == hook for hook in hooked.values())  # what the child rebuilds
    # each timed exercise's topic bench builds what grading times (speed asks it, by this name)
    assert all(callable(topics.part_of(hook.topic, "bench").grading_kernels) for hook in hooked.values())
    with pytest.raises(ValueError, match="not a bench hook"):
        hook_from_spec(["no_such_topic", "ladder_k1.tree_attention_kernel"])


def _fake(exercise_id: str, points: int, hook, hooks: dict):
    from course.checks import Exercise

    hooks[exercise_id] = hook
    return Exercise(exercise_id, "99_fake", points, lambda module, seed: [], "fake", timed=hook is not None)


def test_timed_results_are_reported_with_a_fake_timer(tmp_path, monkeypatch):
    from course.grading import report
    from course.grading import speed as timing
    from course.grading.runner import ExerciseGrade, SubmissionGrade
    from course.grading.speed import Speed, time_impl

    calls = []

    def hook(impl):
        calls.append(impl)
        return lambda: impl

    def broken(impl):
        raise RuntimeError("out of shared memory")

    hooks = {}  # what the topics' benches would build: fakes
    monkeypatch.setattr(timing, "hook_of", lambda exercise: hooks.get(exercise.id))
    fast, slow = _fake("m.fast", 2, hook, hooks), _fake("m.slow", 2, hook, hooks)
    untimed, failing = _fake("m.none", 1, None, hooks), _fake("m.broken", 1, broken, hooks)
    exercises = [fast, slow, untimed, failing]

    def timer(fn):  # the solution takes 2 ms; lessons' kernels what the test says
        return {"solutions": 2.0}[fn()]

    speed = Speed.measure(exercises, timer=timer, device="Fake GPU")
    assert calls == ["solutions", "solutions"] and speed.solution_ms == {"m.fast": 2.0, "m.slow": 2.0}
    assert speed.solution_notes["m.broken"].startswith("timing failed: RuntimeError: out of shared memory")
    assert time_impl(untimed, "lessons", timer) == (None, "no timing for this exercise")
    assert time_impl(fast, "lessons", lambda fn: 3.0) == (3.0, "")

    passed = [("case", True, "")]
    grade = SubmissionGrade("alice", "alice/", {
        "m.fast": ExerciseGrade("m.fast", 2, passed, student_ms=1.0),
        "m.slow": ExerciseGrade("m.slow", 2, [("case", False, "wrong")]),  # failed: never timed
        "m.none": ExerciseGrade("m.none", 1, passed),
        "m.broken": ExerciseGrade("m.broken", 1, passed, student_ms=1.0)})
    report.write_all([grade], exercises, tmp_path, seed=1, speed=speed)

    text = (tmp_path / "feedback" / "alice.md").read_text()
    assert "Median times on Fake GPU" in text
    assert "| `m.fast` | 1.000 ms vs the solution's 2.000 ms: 0.50x its time |" in text
    assert "| `m.slow` | not timed: only a kernel that passes every case is timed |" in text
    assert "| `m.broken` | not timed: the solution's timing failed: RuntimeError" in text
    assert "No timing for: `m.none`." in text
    rows = list(csv.DictReader((tmp_path / "gradebook.csv").open()))
    speed_columns = [c for c in rows[0] if c.startswith("speed ")]
    assert speed_columns == ["speed m.fast", "speed m.slow", "speed m.broken"]
    assert rows[1]["speed m.fast"] == "0.500" and rows[1]["speed m.slow"] == ""
    document = json.loads((tmp_path / "grades.json").read_text())
    fast_json = document["students"][0]["exercises"]["m.fast"]
    assert (fast_json["student_ms"], fast_json["solution_ms"], fast_json["time_ratio"]) == (1.0, 2.0, 0.5)
    assert document["timing"]["timed"] is True and document["timing"]["device"] == "Fake GPU"
