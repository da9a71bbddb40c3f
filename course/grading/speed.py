"""Grading on a GPU: each passed exercise's kernel timed against the solution's, on the same inputs.

An exercise opts in with a bench hook in the table (`course.exercises.Exercise.bench`):
`bench(impl)` returns a zero-argument function that runs the kernels of `impl` ("lessons" or
"solutions") on fixed inputs, built the same way for both (the benchmark's own builders, so the
same seed gives the same inputs). Grading times it with `course.measure.timing.bench` (warm-up, then the
median of many runs): the solution once per grading run, in the grader's process, before any
submission runs; a student's kernel in that submission's child, only when every case passed.
The report gives the ratio student / solution (above 1: slower than the solution).

In the simulator nothing is timed (its times say nothing about a GPU), and the feedback says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from course.topics.ladder import rungs as ladder

Timer = Callable[[Callable[[], object]], float]  # fn -> median milliseconds (course.measure.timing.bench)
SIMULATOR_REASON = "this grading ran in the simulator, whose times say nothing about a GPU"


def _default_timer(fn: Callable[[], object]) -> float:
    from course.measure.timing import bench

    return bench(fn)


# ------------------------------------------------------------------------------- the exercises' hooks

@dataclass(frozen=True)
class BenchHook:
    """An exercise's bench hook, `hook(impl)`; `spec` names it in a request to the grading child,
    which rebuilds it with `hook_from_spec` (a closure cannot cross the channel)."""

    kind: str  # "rung" (a ladder rung, `name` its rung) or "triton" (notebook 12's kernel)
    name: str = ""

    def __call__(self, impl: str) -> Callable[[], object]:
        return _rung_kernels(self.name, impl) if self.kind == "rung" else _triton_kernel(impl)

    @property
    def spec(self) -> list[str]:
        return [self.kind, self.name]

    def __repr__(self) -> str:
        return f"rung_bench({self.name!r})" if self.kind == "rung" else "triton_bench"


def hook_from_spec(spec) -> BenchHook:
    """The hook a request names; a ValueError for anything else."""
    if isinstance(spec, list) and len(spec) == 2 and spec[0] == "triton":
        return triton_bench
    if isinstance(spec, list) and len(spec) == 2 and spec[0] == "rung" and spec[1] in ladder.BY_NAME:
        return rung_bench(spec[1])
    raise ValueError(f"not a bench hook: {spec!r}")


def rung_bench(rung_name: str) -> BenchHook:
    """The hook of a ladder rung: its kernels alone (`course.core.launch.kernels_of`, as the ladder's
    benchmark times them) at the benchmark's shape FlashSpecInfer's (10, 10, 1024, 64), BFS trees."""
    ladder.BY_NAME[rung_name]  # a KeyError names a rung that does not exist
    return BenchHook("rung", rung_name)


def _rung_kernels(rung_name: str, impl: str) -> Callable[[], None]:
    from course.core.launch import kernels_of
    from course.topics.ladder import bench as ladder_bench

    rung = ladder.BY_NAME[rung_name]
    batch, heads, n, d = ladder_bench.PAPER_SHAPE
    q, k, v = ladder_bench.random_qkv(batch, heads, n, d)
    start, end = ladder_bench.benchmark_times(batch, n, "bfs")
    return kernels_of(ladder_bench.rung_fn(rung, q, k, v, start, end, impl))


def _triton_kernel(impl: str) -> Callable[[], object]:
    """notebook 12's Triton kernel: `prepare_attention(...)` (the kernel without the launcher's
    input checks, as `course.topics.triton_attention.bench` times it) in fp16 at the benchmark's shape,
    BFS trees."""
    import torch

    from course.core.impl import load
    from course.topics.ladder import bench as ladder_bench
    from course.topics.triton_attention.launch import prepare_attention

    module = load("triton_attention", impl)
    batch, heads, n, d = ladder_bench.PAPER_SHAPE
    q, k, v = (t.to(torch.float16) for t in ladder_bench.random_qkv(batch, heads, n, d))
    start, end = ladder_bench.benchmark_times(batch, n, "bfs")
    fn = prepare_attention(module, q, k, v, start, end)
    fn()  # compiles
    return fn


triton_bench = BenchHook("triton")


# ---------------------------------------------------------------------------------------- timing

def time_impl(exercise, impl: str, timer: Timer | None = None) -> tuple[float | None, str]:
    """(median ms, "") of `impl`'s kernel for one exercise, or (None, why not)."""
    if exercise.bench is None:
        return None, "no timing for this exercise"
    return time_impl_with(exercise.bench, impl, timer)


def time_impl_with(hook: Callable, impl: str, timer: Timer | None = None) -> tuple[float | None, str]:
    """(median ms, "") of `impl`'s kernels as a bench hook runs them, or (None, why not)."""
    try:
        return float((timer or _default_timer)(hook(impl))), ""
    except Exception as error:  # a kernel that passed the checks can still fail at this size
        return None, f"timing failed: {type(error).__name__}: {str(error)[:300]}"


@dataclass
class Speed:
    """What one grading run knows about timing: whether it timed, and the solutions' times."""

    timed: bool
    reason: str = ""  # why nothing was timed
    device: str = ""
    solution_ms: dict[str, float] = field(default_factory=dict)
    solution_notes: dict[str, str] = field(default_factory=dict)  # exercise -> why its solution has no time
    note: str = ""  # a caveat about all the times (e.g. submissions timed side by side)

    @classmethod
    def untimed(cls, reason: str = SIMULATOR_REASON) -> Speed:
        return cls(timed=False, reason=reason)

    @classmethod
    def measure(cls, exercises, timer: Timer | None = None, device: str = "") -> Speed:
        """Time the solution of every exercise that has a bench hook (in this process)."""
        speed = cls(timed=True, device=device)
        for exercise in exercises:
            if exercise.bench is None:
                continue
            ms, why = time_impl(exercise, "solutions", timer)
            if ms is None:
                speed.solution_notes[exercise.id] = why
            else:
                speed.solution_ms[exercise.id] = ms
        return speed

    def ratio(self, grade) -> float | None:
        """student / solution time of one ExerciseGrade (above 1: slower), or None."""
        solution = self.solution_ms.get(grade.exercise)
        if not self.timed or grade.student_ms is None or not solution:
            return None
        return grade.student_ms / solution

    def describe(self, grade) -> str:
        """One exercise's speed, in words, for the feedback."""
        if not self.timed:
            return "not timed"
        ratio = self.ratio(grade)
        if ratio is not None:
            return (f"{grade.student_ms:.3f} ms vs the solution's {self.solution_ms[grade.exercise]:.3f} ms: "
                    f"{ratio:.2f}x its time")
        if grade.exercise in self.solution_notes:
            return f"not timed: the solution's {self.solution_notes[grade.exercise]}"
        if grade.timing_note:
            return grade.timing_note
        return "not timed: only a kernel that passes every case is timed"

    def as_json(self) -> dict:
        return {"timed": self.timed, "reason": self.reason, "device": self.device, "note": self.note,
                "solution_ms": self.solution_ms, "solution_notes": self.solution_notes}
