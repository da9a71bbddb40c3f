"""Every Triton kernel of the course, compiled for an H100 (sm_90) on a machine without a GPU.

Triton's interpreter runs kernels that its GPU compiler refuses: a kernel reading a plain-int
global, a shape the hardware cannot tile, a type that does not convert. Triton compiles for a GPU
without one (`triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`), so CI compiles
every kernel as the CPU tests launch it:

    python -m course.gpu_compile            # compile each recorded launch; exit 1 on any error
    python -m course.gpu_compile --record   # run the launches again and rewrite the record

The record, `triton_launches.json` beside this file, holds each kernel's launches (its arguments'
types and its constexprs) as the Triton exercises' checks and the capstone's decoder make them
under the interpreter, with each kernel's parameter list: `tests/test_gpu_compile.py` fails when a
kernel's parameters changed since, or a kernel has no launch recorded. The kernels compiled are
those of `solutions/`, of `lessons/` as a student's finished copy holds them (every exercise solved,
as the release writes it), and of `course/`. Compiling runs in its own process, with
TRITON_INTERPRET=0 so that @triton.jit makes the compiler's kind of function.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterable
from pathlib import Path

from course.core.regions import ROOT

RECORD = Path(__file__).with_name("triton_launches.json")
TARGET = ("cuda", 90, 32)  # an H100: CUDA, compute capability 9.0, 32 threads a warp
# Modules of course/ that hold the course's own kernels (the others only handle them): the capstone's,
# and the given kernels of the topics' rooms that the student modules launch.
COURSE_MODULES = ("course.capstone.kernels", "course.capstone.model_kernels", "course.topics.kvcache.launch",
                  "course.topics.sampling.kernels", "course.topics.triton_attention.blocks",
                  "course.topics.verification.kernels", "course.topics.verification.times")
# The tests whose launches the record also holds: the capstone's kernels run in its decoder, and
# SwiftSpec's merge of key ranges only where the cache is split.
RECORDED_TESTS = ("tests/test_capstone_decoder.py::test_fused_bookkeeping_equals_its_torch_statement",
                  "tests/test_capstone_decoder.py::test_sampling_kernels_agree_with_reference",
                  "tests/test_capstone_decoder.py::test_greedy_kernels_equal_target_greedy",
                  "tests/test_swiftspec.py::test_key_ranges_merged_by_lse_equal_one_pass",
                  "tests/test_capstone_model.py::test_fused_rope_and_swiglu_step_equals_the_torch_statement")
# At most this many launches of one kernel with one signature are compiled (the first recorded,
# and those with the smallest and the largest constexprs): each compile takes a while.
PER_SIGNATURE = 3
TORCH_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
               "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def kernel_key(function: types.FunctionType) -> str:
    """'swiftspec.compact_kernel' for solutions' and lessons' kernels alike, else the full name."""
    module = function.__module__
    for package in ("solutions.", "lessons."):
        module = module.removeprefix(package)
    return f"{module}.{function.__name__}"


def parameters(function: types.FunctionType) -> str:
    """A kernel's parameter list as its source writes it: the record is stale when it changes."""
    return str(inspect.signature(function))


def fingerprint(function: types.FunctionType) -> str:
    return hashlib.sha256(parameters(function).encode()).hexdigest()[:16]


def is_constexpr(annotation) -> bool:
    import triton.language as tl

    return annotation is tl.constexpr or (isinstance(annotation, str) and annotation.endswith("constexpr"))


def argument_type(value) -> str:
    """Triton's name of an argument's type, as its launcher specializes it."""
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + TORCH_TYPES[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"an argument of type {type(value).__name__} has no Triton type this record knows")


def constant(value):
    """A constexpr as JSON holds it (a Triton dtype by its name)."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, tl.dtype):
        return {"dtype": value.name}
    return value


def launch_of(function: types.FunctionType, bound: dict) -> dict:
    """The signature and constexprs of one launch, from its arguments by parameter name."""
    signature, constexprs = {}, {}
    for name, parameter in inspect.signature(function).parameters.items():
        value = bound.get(name, parameter.default)
        if is_constexpr(parameter.annotation) or value is None:
            signature[name] = "constexpr"
            constexprs[name] = constant(value)
        else:
            signature[name] = argument_type(value)
    return {"signature": signature, "constexprs": constexprs}


# ------------------------------------------------------------------------------------ recording


class Recorder:
    """While active, notes each launch the interpreter runs (InterpretedFunction.run)."""

    def __init__(self):
        self.kernels: dict[str, dict] = {}

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction

        self.original = InterpretedFunction.run
        recorder = self

        def run(interpreted, *args, grid, warmup, **kwargs):
            recorder.note(interpreted.fn, args, kwargs)
            return recorder.original(interpreted, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run = self.original

    def note(self, function, args, kwargs) -> None:
        bound = dict(zip(inspect.signature(function).parameters, args, strict=False)) | kwargs
        entry = self.kernels.setdefault(kernel_key(function), {"parameters": fingerprint(function),
                                                               "launches": []})
        launch = launch_of(function, bound)
        if launch not in entry["launches"]:
            entry["launches"].append(launch)


def record(out: Path = RECORD) -> dict:
    """Run the Triton exercises' checks (solutions) and the capstone's decoder tests, recording."""
    import pytest

    from course.registry import EXERCISES

    with Recorder() as recorder:
        for exercise in EXERCISES.values():
            if exercise.module in triton_modules("solutions"):
                report = exercise.run(impl="solutions")
                print(f"recorded {exercise.id}: {'passed' if report.passed else 'FAILED'}", flush=True)
        code = pytest.main(["-q", "-p", "no:randomly", "-p", "no:cacheprovider", *RECORDED_TESTS])
        if code != 0:
            raise SystemExit(f"the capstone's tests failed while recording (pytest exit {code})")
    kernels = {key: recorder.kernels[key] for key in sorted(recorder.kernels)}
    out.write_text(json.dumps(kernels, indent=1, sort_keys=True) + "\n")
    return kernels


# ------------------------------------------------------------------------------------ compiling


def triton_modules(package: str, root: Path = ROOT) -> list[str]:
    """The modules of solutions/ or lessons/ whose source uses @triton.jit, by their short name."""
    return sorted(p.stem for p in (root / package).glob("*.py") if "@triton.jit" in p.read_text())


def jit_functions(module: types.ModuleType) -> list[types.FunctionType]:
    """The Python functions behind the @triton.jit objects that `module` defines."""
    from triton.runtime.jit import KernelInterface

    found = []
    for value in vars(module).values():
        function = getattr(value, "fn", None) if isinstance(value, KernelInterface) else None
        if isinstance(function, types.FunctionType) and function.__module__ == module.__name__:
            found.append(function)
    return found


def launched(functions: Iterable[types.FunctionType],
             callers: Iterable[types.FunctionType] = ()) -> list[types.FunctionType]:
    """The kernels among @triton.jit functions: those no other of them calls, nor any of `callers`
    (the jit functions of other modules: a room's given helper, such as `load_weights`, is called
    from a student module's kernels only). The rest are helpers, compiled inside those kernels."""
    functions = list(functions)
    called = {name for f in [*functions, *callers] for name in f.__code__.co_names}
    return [f for f in functions if f.__name__ not in called]


def compile_launch(function: types.FunctionType, launch: dict):
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    constexprs = {name: tl.dtype(value["dtype"]) if isinstance(value, dict) else value
                  for name, value in launch["constexprs"].items()}
    source = ASTSource(fn=JITFunction(function), signature=dict(launch["signature"]), constexprs=constexprs)
    return triton.compile(source, target=GPUTarget(*TARGET))


def chosen(launches: list[dict]) -> list[dict]:
    """The launches to compile: for each signature, the first recorded and the ones with the smallest
    and the largest numeric constexprs (tile sizes, head dimensions), PER_SIGNATURE at most."""
    groups: dict[str, list[dict]] = {}
    for launch in launches:
        groups.setdefault(json.dumps(launch["signature"], sort_keys=True), []).append(launch)

    def size(launch: dict) -> tuple:
        values = launch["constexprs"].values()
        return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool))

    picked = []
    for group in groups.values():
        for launch in (group[0], min(group, key=size), max(group, key=size), *group):
            alike = sum(p["signature"] == launch["signature"] for p in picked)
            if launch not in picked and alike < PER_SIGNATURE:
                picked.append(launch)
    return picked


def compile_module(module: types.ModuleType, where: str, kernels: dict,
                   callers: Iterable[types.FunctionType] = ()) -> tuple[int, list[str]]:
    """(launches compiled, one message per failure) for every kernel of `module` (`launched`'s callers)."""
    count, problems = 0, []
    for function in launched(jit_functions(module), callers):
        key = kernel_key(function)
        entry = kernels.get(key)
        if entry is None:
            problems.append(f"{where}: kernel {function.__name__}: no launch recorded "
                            "(`python -m course.gpu_compile --record`)")
            continue
        for launch in chosen(entry["launches"]):
            try:
                compile_launch(function, launch)
                count += 1
            except Exception as error:  # Triton's message, whatever raised it, names the cause
                message = str(error).strip() or type(error).__name__
                constants = ", ".join(f"{k}={v}" for k, v in launch["constexprs"].items())
                problems.append(f"{where}: kernel {function.__name__} ({constants}) does not compile for "
                                f"sm_90:\n{message}")
                break
    return count, problems


def finished_lessons(folder: Path) -> Path:
    """lessons/ as a student's finished copy: the release with every exercise solved, in `folder`."""
    from course.release import render

    package = folder / "lessons"
    for relative, content in render(ROOT / "solutions", is_open=lambda exercise: False).items():
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return package


def same_code(first: str, second: str) -> bool:
    """Whether two importable modules hold the same code (comments and exercise markers aside)."""
    import ast

    texts = [Path(importlib.util.find_spec(name).origin).read_text() for name in (first, second)]
    return ast.dump(ast.parse(texts[0])) == ast.dump(ast.parse(texts[1]))


def compile_all(kernels: dict, modules: list[str] | None = None) -> int:
    """Compile the course's kernels (or those of `modules`, importable names); print each failure."""
    import course  # noqa: F401  (picks the simulator for Numba: only Triton compiles here)
    from course.core import interpreter

    os.environ["TRITON_INTERPRET"] = "0"  # course set it for the simulator; the compiler's jit is wanted
    interpreter.prepare = lambda *kernels: None  # as on a GPU: the interpreter's names stay out
    started, count, problems = time.perf_counter(), 0, []
    with tempfile.TemporaryDirectory() as folder:
        if modules is None:
            finished_lessons(Path(folder))
            sys.path.insert(0, folder)  # `lessons` is now the finished copy
            modules = [*COURSE_MODULES, *(f"solutions.{m}" for m in triton_modules("solutions")),
                       *(f"lessons.{m}" for m in triton_modules("solutions"))]
        callers = [f for name in modules for f in jit_functions(importlib.import_module(name))]
        for name in modules:
            if name.startswith("lessons.") and same_code(name, f"solutions.{name.removeprefix('lessons.')}"):
                print(f"{name}: finished, the same code as its solution (compiled above)")
                continue
            module = importlib.import_module(name)
            where = "lessons (finished) " + name if name.startswith("lessons.") else name
            compiled, found = compile_module(module, where, kernels, callers)
            count, problems = count + compiled, problems + found
    for problem in problems:
        print(problem, flush=True)
    seconds = time.perf_counter() - started
    print(f"compiled {count} launches for sm_90 in {seconds:.0f} s; "
          + (f"{len(problems)} kernels FAILED" if problems else "every kernel compiles"))
    return 1 if problems else 0


def run(record_path: Path = RECORD, modules: list[str] | None = None, timeout_s: float = 600,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m course.gpu_compile` in a fresh process, as CI runs it."""
    command = [sys.executable, "-m", "course.gpu_compile", "--launches", str(record_path)]
    command += ["--modules", *modules] if modules else []
    variables = {**os.environ, "TRITON_INTERPRET": "0", **(env or {})}
    return subprocess.run(command, cwd=ROOT, env=variables, capture_output=True, text=True, timeout=timeout_s)


def arguments(prog: str, description: str, record_path: Path, argv: list[str] | None) -> argparse.Namespace:
    """The command line this module and course.ptx_compile share."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--record", action="store_true", help="rerun the launches and rewrite the record")
    parser.add_argument("--launches", type=Path, default=record_path,
                        help="the record of launches to compile")
    parser.add_argument("--modules", nargs="+", help="only these modules (importable names)")
    return parser.parse_args(argv)


def say_recorded(kernels: dict, path: Path) -> None:
    print(f"recorded {sum(len(k['launches']) for k in kernels.values())} launches of {len(kernels)} "
          f"kernels in {path}")


def main(argv: list[str] | None = None) -> int:
    args = arguments("python -m course.gpu_compile", __doc__.splitlines()[0], RECORD, argv)
    if args.record:
        say_recorded(record(args.launches), args.launches)
        return 0
    return compile_all(json.loads(args.launches.read_text()), args.modules)


if __name__ == "__main__":
    sys.exit(main())
