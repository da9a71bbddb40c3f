"""Grading's limits and what the child may ask for, without a grading run: each submission's own CPU
time (counted with fakes: nothing here depends on how fast this machine is), the specification's
services, and the weight of the seeded cases (tests/test_grade.py grades samples end to end)."""

from __future__ import annotations

import ast
import json
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from course.core import inputs
from course.core.regions import ROOT
from course.grading import proxy, runner, sandbox, seeded, services, shapes, wire
from course.grading.runner import Clock, Limits, Setup, case_seed
from course.registry import EXERCISES

SEED = 1234


# ------------------------------------------------------------------------------------ CPU time

def test_a_process_stat_line_gives_its_own_and_its_reaped_childrens_cpu_time():
    # pid (comm) state ppid ... utime stime cutime cstime: a command name may hold spaces and ')'
    stat = "42 (evil) (name) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 11 13 20 0 1 0 100 0 0"
    assert sandbox.stat_cpu_ticks(stat) == 7 + 5 + 11 + 13
    stats = {1: "1 (bwrap) S 0 1 1 0 -1 0 0 0 0 0 1 2 300 400 20 0 1 0 1 0 0",
             7: "7 (python) R 1 7 7 0 -1 0 0 0 0 0 50 25 0 0 20 0 9 0 5 0 0"}

    def read(pid):
        if pid not in stats:
            raise FileNotFoundError(pid)  # it ended meanwhile: its parent counts it once reaped
        return stats[pid]

    assert sandbox.tree_cpu_seconds([1, 7, 99], read, ticks_per_second=100) == pytest.approx(7.78)


def test_the_process_tree_is_found_by_parent_id():
    stats = {1: "1 (init) S 0", 10: "10 (a b) S 1", 11: "11 (c) S 10", 12: "12 (d) S 11", 20: "20 (e) S 1"}
    found = sandbox.descendants(10, lambda: [str(p) for p in stats] + ["self"], lambda pid: stats[pid])
    assert sorted(found) == [10, 11, 12]


@pytest.mark.parametrize("version, name, text, seconds", [
    (2, "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n", 2.5),
    (1, "cpuacct.usage", "3000000000\n", 3.0)])
def test_a_cgroup_counts_the_cpu_time_of_everything_inside(tmp_path, version, name, text, seconds):
    (tmp_path / name).write_text(text)
    assert sandbox.Cgroup([tmp_path], version, cpu_usage=tmp_path / name).cpu_seconds() == seconds
    assert sandbox.Cgroup([tmp_path], version).cpu_seconds() is None  # no accounting: the process tree's


def _fake_child(clock: list[float]) -> sandbox.Child:
    child = sandbox.Child(None, -1, -1, (), sandbox.Settings(0, 1 << 20, 1, isolate=False), None)
    child.cpu_seconds = lambda: clock[0]
    child.killed = []
    child.kill = lambda: child.killed.append(clock[0])
    child.close = lambda: setattr(child, "closed", True)
    return child


def test_a_child_is_stopped_once_its_cpu_time_passes_the_limit_not_before():
    clock = [5.0]
    child = _fake_child(clock)
    child.cpu_limit = 15.0
    clock[0] = 14.9
    child.tick()
    assert child.over == "" and child.killed == []
    clock[0] = 15.1
    child.tick()
    assert child.over == "timeout" and child.killed == [15.1]


def test_an_exercise_counts_its_own_cpu_time_across_fresh_children_and_not_their_start_up():
    channel = proxy.Channel(lambda: None, wire.WireLimits(), lambda device: True)
    clock = [5.0]
    channel.child = first = _fake_child(clock)
    channel.start_exercise(10.0, float("inf"))
    assert first.cpu_limit == 15.0
    clock[0] = 9.0
    assert channel.exercise_cpu() == 4.0
    channel.stop()  # a reply it could not read: the next call gets a fresh child
    assert first.closed and channel.cpu_spent == 4.0
    other = [100.0]  # the fresh child's start-up (importing torch) is not counted
    channel.child = second = _fake_child(other)
    channel._arm(second)
    assert second.cpu_limit == 106.0
    other[0] = 103.0
    assert channel.exercise_cpu() == 7.0


def test_the_total_limit_is_cpu_time_too_and_wall_clock_time_only_a_backstop():
    clock = Clock(Limits(per_exercise_s=10, total_s=25), wall_start=0.0)
    assert clock.exercise_budget() == 10
    clock.count(10)
    clock.count(10)
    assert clock.exercise_budget() == 5  # what is left of the total
    assert clock.wall_deadline(5, now=100.0) == min(100.0 + runner.WALL_FACTOR * 5, runner.WALL_FACTOR * 25)
    clock.count(5)
    assert clock.exercise_budget() == 0 and clock.total_ran_out()


def test_the_feedback_says_which_time_limit_was_passed():
    limits = Limits(per_exercise_s=10, total_s=120)
    said = runner._time_limit_text
    assert said("timeout", 10, limits) == ("the time limit of 10 s per exercise (CPU time, all its processes "
                                          "together)")
    assert said("timeout", 3, limits).startswith("the total time limit (120 s)")
    assert "wall-clock time passed while it used little CPU time" in said("waited", 10, limits)


def test_jobs_above_one_without_a_cpu_controller_warn():
    from course.grading import warn_cpu_sharing

    for jobs, limits_by in ((1, "per process"), (2, "cgroup v1, cpu capped: one CPU each")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warn_cpu_sharing(jobs, limits_by)
    with pytest.warns(UserWarning, match="without a cpu controller"):
        warn_cpu_sharing(2, "cgroup v2, cpu time from the cgroup")


# ------------------------------------------------------------------------------------ no answer in the child

def test_the_harness_holds_no_answer(tmp_path):
    """No oracle, no checks, no exercise table, and of pyspec_ref only stand-ins that ask the grader."""
    sandbox.copy_harness(tmp_path)
    files = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*.py")}
    assert not (tmp_path / "course" / "oracle").exists() and "course/registry.py" not in files
    assert not any(f.endswith("/exercises.py") for f in files)
    assert not [f for f in files if f.endswith("/check.py") or "diagnose" in f]
    assert sorted(f for f in files if f.startswith("pyspec_ref")) == [
        "pyspec_ref/__init__.py", "pyspec_ref/deft.py", "pyspec_ref/sampling.py", "pyspec_ref/trees.py"]
    answers = ("def dfs_times(parents", "def attention_with_lse(q", "def dense_tree_mask(start")
    spec = [f for f, text in files.items() if any(answer in text for answer in answers)]
    assert spec == []


def test_every_lesson_module_imports_with_the_childs_harness_alone(tmp_path):
    """What launch code imports of pyspec_ref and course.oracle is in the stand-ins (a name added to a
    launcher's imports and not to course.grading.services fails here, not in a student's grade)."""
    import shutil
    import subprocess
    import sys

    from course.core import runtime

    sandbox.copy_harness(tmp_path / "harness")
    shutil.copytree(ROOT / "solutions", tmp_path / "code" / "lessons")
    plan = sandbox.make_plan(tmp_path / "harness", [ROOT], False, runtime.SIMULATOR, runtime.SMALL_SIZES)
    modules = sorted(p.stem for p in (ROOT / "solutions").glob("*.py") if p.stem != "__init__")
    path = [str(tmp_path / "harness"), str(tmp_path / "code"), *plan.path]  # as the child's (sandbox.start)
    script = (f"import importlib, json, sys; sys.path[:0] = {path!r}; import course; "
              f"[importlib.import_module('lessons.' + m) for m in {modules!r}]; "
              "print(json.dumps([m for m in sys.modules if m.startswith(('pyspec_ref', 'course.oracle'))]))")
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**dict(plan.env), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    stand_ins = {path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                 for path in services.stand_in_sources()}
    assert set(json.loads(done.stdout.strip().splitlines()[-1])) <= stand_ins


def test_the_child_tells_a_crash_with_its_place_from_its_harness_alone(tmp_path):
    """The child describes a student's crash with the checks' own words (thread, place), from the
    harness it is given, which has no checks' diagnoses: the crash's description lives in core."""
    import subprocess
    import sys

    from course.core import runtime

    sandbox.copy_harness(tmp_path / "harness")
    plan = sandbox.make_plan(tmp_path / "harness", [ROOT], False, runtime.SIMULATOR, runtime.SMALL_SIZES)
    path = [str(tmp_path / "harness"), *plan.path]
    script = (f"import json, sys; sys.path[:0] = {path!r}; import course\n"
              "from course.grading.child import describe\n"
              "try:\n    [1, 2][5]\nexcept IndexError as error:\n    print(json.dumps(describe(error)))")
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**dict(plan.env), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    told = json.loads(done.stdout.strip().splitlines()[-1])
    assert told["kind"] == "IndexError" and "place" in told  # not the bare fallback of type and message


def test_the_grader_runs_only_what_the_table_allows_where_it_allows_it():
    assert services.run("pyspec_ref.trees.validate_times", "tree_verification", [[0, 1], [1, 1]], {}) == (
        [0, 1], [1, 1])
    with pytest.raises(ValueError, match="permutation"):  # the specification's own refusal
        services.run("pyspec_ref.trees.validate_times", "trees", [[0, 0], [1, 1]], {})
    start, end = torch.tensor([[0, 1]]), torch.tensor([[1, 1]])
    assert services.run("course.oracle.dense_tree_mask", "ladder_dense", [start, end], {}).shape == (1, 2, 2)
    for name, scope in (("course.oracle.dense_tree_mask", "trees"), ("pyspec_ref.dfs_times", "trees"),
                        ("pyspec_ref.trees.dfs_times", services.TIMING), ("os.system", "trees"),
                        (None, "trees")):
        with pytest.raises(services.Refused, match="grading does not run"):
            services.run(name, scope, [[-1, 0]], {})
    assert services.run("pyspec_ref.dfs_times", services.TIMING, [[-1, 0]], {}) == ([0, 1], [1, 1])
    huge = torch.empty((1, 1 << 14), dtype=torch.int32)  # a dense mask of 2**28 bools
    with pytest.raises(services.Refused, match="larger than a launcher ever passes"):
        services.run("course.oracle.dense_tree_mask", "ladder_dense", [huge, huge], {})


def test_a_launcher_in_the_child_validates_through_the_grader(tmp_path):
    """The child's launch code calls the stand-in of pyspec_ref's validator: the grader runs it, and the
    specification's refusal reaches the caller as the ValueError it is (a child without the sandbox)."""
    import shutil

    from course.core import runtime

    harness, code, work = tmp_path / "harness", tmp_path / "code", tmp_path / "work"
    sandbox.copy_harness(harness)
    shutil.copytree(ROOT / "solutions", code / "lessons")
    work.mkdir()
    plan = sandbox.make_plan(harness, [ROOT], False, runtime.SIMULATOR, runtime.SMALL_SIZES)
    settings = sandbox.Settings(0, 64 << 20, 4096, isolate=False)
    logs = (tmp_path / "out.log", tmp_path / "err.log")
    channel = proxy.Channel(lambda: sandbox.start(plan, code, settings, logs, "probe", work),
                            wire.WireLimits(), lambda device: device == "cpu")
    channel.start_exercise(600.0, float("inf"))

    def call(start, end):
        """Greedy verification of one chain of three nodes whose target agrees with every token."""
        times = tuple(torch.tensor([t], dtype=torch.int32) for t in (start, end))
        tokens = torch.tensor([[5, 1, 2]], dtype=torch.int32)
        target = torch.tensor([[1, 2, 3]], dtype=torch.int32)  # the argmax after each node
        return channel.call("tree_verification", "greedy_tree_verification", (times, tokens, target), {},
                            lambda obj: None, lambda name: None, {})

    try:
        path, next_token = call([0, 1, 2], [2, 2, 2])
        assert path.tolist() == [[0, 1, 2]] and next_token.tolist() == [3]
        with pytest.raises(ValueError, match=r"not the DFS times of a tree: start\[0\]\[2\] = 1 repeats"):
            call([0, 1, 1], [2, 2, 2])
    finally:
        channel.stop()


# ------------------------------------------------------------------------------------ seeded cases

@pytest.fixture(scope="module")
def setup():
    with tempfile.TemporaryDirectory() as folder:
        yield Setup.build(list(EXERCISES.values()), Path(folder), Limits(), False, [ROOT])


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_most_of_every_exercises_points_come_from_seeded_cases(setup, exercise):
    """A lookup table of the fixed cases' answers earns at most a third of any exercise."""
    found = seeded.first_calls(EXERCISES[exercise], setup, case_seed(SEED, exercise))
    drawn = seeded.seeded_cases(EXERCISES[exercise], setup, case_seed(SEED, exercise))
    cases = [case for case, _ in found]
    assert drawn and drawn <= set(cases), exercise
    shares = seeded.weights(cases, drawn)
    from_seeded = sum(s for s, case in zip(shares, cases, strict=True) if case in drawn)
    assert from_seeded >= seeded.SEEDED_SHARE - 1e-9
    lookup = [(c, c not in drawn, "") for c in cases]  # right on every fixed case, wrong on every seeded one
    table = runner.ExerciseGrade(exercise, 3.0, lookup, seeded=frozenset(drawn))
    assert table.fraction <= 1 - seeded.SEEDED_SHARE + 1e-9


RECOGNISABLE_SEED = 0x5EC2E7_C0FFEE  # a seed whose decimal and hex forms stand out in any text


def _first_calls(monkeypatch, setup, exercise: str, seed: int, keyed) -> list[tuple[str, str | None]]:
    """`seeded.first_calls` with `inputs.case_seed` replaced by `keyed` (the checks call it by name)."""
    monkeypatch.setattr(inputs, "case_seed", keyed)
    return seeded.first_calls(EXERCISES[exercise], setup, seed)


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_each_case_draws_its_inputs_from_its_own_keyed_seed(setup, exercise, monkeypatch):
    """Knowing one case's inputs (or its seed) tells nothing of another case's, nor of the seed: the
    exercise's seed reaches a case's inputs only through `inputs.case_seed(seed, name)`, each name
    hashed under it feeds one case at most, every seeded case has one, and another seed moves every
    seeded case. No case's name shows the seed, in decimal or in hex."""
    seed, real = case_seed(SEED, exercise), inputs.case_seed
    hashed: list[tuple[int, str]] = []

    def spy(key: int, name: str) -> int:
        hashed.append((key, name))
        return real(key, name)

    found = _first_calls(monkeypatch, setup, exercise, seed, spy)
    names = [case for case, _ in found]
    assert len(set(names)) == len(names), "two cases of one name would share their seed"
    drawn = seeded.seeded_cases(EXERCISES[exercise], setup, seed)
    assert drawn, exercise
    # with case_seed's key held fixed, the exercise's seed changes nothing: it enters through case_seed only
    held = lambda key, name: real(0, name)  # noqa: E731
    first = _first_calls(monkeypatch, setup, exercise, seed, held)
    assert sum(d is not None for _, d in first) == sum(d is not None for _, d in found)  # no case broke
    assert first == _first_calls(monkeypatch, setup, exercise, seed ^ seeded.OTHER_SEED, held)
    # one name's seed changed alone moves one case at most; together they move every seeded case
    moved: set[str] = set()
    for name in sorted({name for key, name in hashed if key == seed}):
        def one_changed(key: int, asked: str, name=name) -> int:
            # a change in the low 32 bits: torch's CPU generator keeps only those of a seed
            return real(key, asked) ^ 0x5A5A5A if (key, asked) == (seed, name) else real(key, asked)
        after = _first_calls(monkeypatch, setup, exercise, seed, one_changed)
        changed = {case for (case, d), (_, e) in zip(found, after, strict=True) if d != e}
        assert len(changed) <= 1, f"{name!r} feeds the cases {sorted(changed)}"
        moved |= changed
    assert drawn <= moved, f"seeded cases not drawn from a case seed of their own: {sorted(drawn - moved)}"
    # another seed moves every seeded case
    other = _first_calls(monkeypatch, setup, exercise, seed + 1, real)
    assert len(other) == len(found)
    assert all(d != e for (case, d), (_, e) in zip(found, other, strict=True) if case in drawn)
    # no name shows the seed it was drawn from
    shown = _first_calls(monkeypatch, setup, exercise, RECOGNISABLE_SEED, real)
    forms = (str(RECOGNISABLE_SEED), f"{RECOGNISABLE_SEED:x}", f"{RECOGNISABLE_SEED:X}")
    assert not [case for case, _ in shown if any(form in case for form in forms)]


def test_no_check_message_formats_a_seed():
    """A check's names and messages are f-strings: none of them may show a seed (`seed`, or a case's
    seed, held in names with 'seed' or 'drawn' in them)."""
    shown = []
    checks = [*(ROOT / "course" / "topics").glob("*/check.py"), *(ROOT / "course" / "checks").glob("*.py")]
    for path in checks:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FormattedValue):
                named = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                if any("seed" in n or "drawn" in n for n in named):
                    shown.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not shown


def test_weights_split_the_points_between_seeded_and_fixed_cases():
    assert seeded.weights(["a", "b", "c", "d"], {"d"}) == pytest.approx([1 / 9, 1 / 9, 1 / 9, 2 / 3])
    assert seeded.weights(["a", "b"], set()) == [0.5, 0.5]
    assert seeded.weights(["a", "b"], {"a", "b"}) == [0.5, 0.5]
    assert seeded.weights([], set()) == []


def test_only_a_running_call_may_ask_the_grader():
    """In the simulator a kernel's threads run on after one of them raised and the call was answered:
    from then on the channel carries the answer and the next request, so they may not ask."""
    from course.grading.child import Server

    sent = []
    server = object.__new__(Server)  # its channel stood in for: what it would send, what it reads
    server.send = lambda message, **values: sent.append(message)
    server.receive = lambda module=None: ({"op": "service_done"}, None)
    server.busy = True
    assert server.ask({"op": "service", "name": "x"}) == ({"op": "service_done"}, None)
    server.done()
    with pytest.raises(RuntimeError, match="only the code of a call the grader made may ask it"):
        server.ask({"op": "service", "name": "y"})
    assert sent == [{"op": "service", "name": "x"}]


def test_a_check_whose_cases_cannot_be_drawn_leaves_equal_weights_and_warns(setup, monkeypatch):
    def broken(exercise, setup, seed):
        raise RuntimeError("no cases")

    monkeypatch.setattr(seeded, "seeded_cases", broken)
    monkeypatch.setattr(setup, "seeded", {})
    with pytest.warns(UserWarning, match="could not tell its seeded cases"):
        setup.find_seeded(SEED)
    assert set(setup.seeded) == set(EXERCISES) and not any(setup.seeded.values())


# ---------------------------------------------------------------------------- replies against the call

def test_the_grader_knows_each_calls_outputs_from_its_own_launcher(setup):
    """The course's launcher, run dry (no kernel, outputs on the meta device), gives each output's
    dtype and shape; where it cannot (the exercise's own hole), nothing is expected."""
    from course.core import inputs

    batch = [inputs.TreeCase("chain", tuple(inputs.chain(5))), inputs.TreeCase("star", (-1, 0, 0, 0, 0))]
    parents = inputs.batch_of_trees(batch, "cpu")
    assert shapes.expected(setup.dry["trees"], "dfs_times", (parents,), {}) == [(torch.int32, (2, 5))] * 2
    start, end = inputs.dfs_times_tensors(batch)
    assert shapes.expected(setup.dry["trees"], "tree_mask", (start, end), {}) == [(torch.bool, (2, 5, 5))]
    assert shapes.expected(setup.dry["trees"], "tree_mask", (start, end[:, :3]), {}) is None  # refused
    assert shapes.expected(setup.dry["attention"], "online_softmax", (torch.ones(2, 3), 2), {}) is None


def test_a_reply_must_hold_the_outputs_the_call_makes_before_any_is_built():
    def header(*tensors):  # the "result" of the header of a reply holding these outputs
        data = wire.frame({}, result=tuple(tensors))
        _, size, _ = wire.PREFIX.unpack(data[: wire.PREFIX.size])
        return json.loads(data[wire.PREFIX.size : wire.PREFIX.size + size])["result"]

    want = [(torch.int32, (2, 5)), (torch.int32, (2, 5))]
    proxy._require_outputs(header(torch.zeros(2, 5, dtype=torch.int32), torch.ones(2, 5, dtype=torch.int32)),
                           want, "dfs_times")
    for wrong in ((torch.zeros(2, 5, dtype=torch.int64), torch.ones(2, 5, dtype=torch.int32)),
                  (torch.zeros(2, 5, dtype=torch.int32),),
                  (torch.zeros(2, 5, dtype=torch.int32), torch.ones(2, 6, dtype=torch.int32))):
        with pytest.raises(proxy.ReplyError, match="the reply's outputs are not the ones dfs_times makes"):
            proxy._require_outputs(header(*wrong), want, "dfs_times")
    # a terabyte's shape on a few bytes (zero strides) is refused from its header alone
    spec = {"storage": 0, "dtype": "int32", "shape": [1 << 20, 1 << 20], "stride": [0, 0], "offset": 0}
    bomb = {"tuple": [{"tensor": spec}]}
    with pytest.raises(proxy.ReplyError, match=r"it sent int32 \(1048576, 1048576\)"):
        proxy._require_outputs(bomb, [(torch.int32, (2, 5))], "dfs_times")
