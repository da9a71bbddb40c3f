"""Every Numba kernel of the course, compiled to PTX for an H100 (sm_90) on a machine without a GPU.

Numba's simulator runs kernels that its CUDA compiler refuses (a type that does not unify, a
Python feature the CUDA target lacks). NVVM compiles without a GPU (`cuda.compile_ptx`, with
NVVM and NVRTC from PyPI's nvidia-cuda-nvcc and nvidia-cuda-nvrtc wheels), so CI compiles every
kernel as the CPU checks launch it:

    python -m course.ptx_compile            # compile each recorded launch; exit 1 on any error
    python -m course.ptx_compile --record   # run the checks again and rewrite the record

The record, `numba_launches.json` beside this file, holds each kernel's launches as the Numba
exercises' checks make them in the simulator (`course.core.launch.launch`): its arguments' Numba
types and the module constants it was specialized with (`launch.specialize`), with the kernel's
parameter list. The compile runs in its own process that takes Numba's real CUDA target: it
tells `course` a GPU is there (nothing is launched, only compiled).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

from course.core.regions import ROOT
from course.gpu_compile import arguments, fingerprint, kernel_key, say_recorded

RECORD = Path(__file__).with_name("numba_launches.json")
COMPUTE_CAPABILITY = (9, 0)  # an H100


def argument_type(value) -> dict | str:
    """A launch argument's Numba type, as JSON holds it."""
    import numpy as np

    if isinstance(value, np.ndarray):
        layout = "C" if value.flags.c_contiguous else "A"
        return {"array": value.dtype.name, "ndim": value.ndim, "layout": layout}
    if isinstance(value, (bool, np.bool_)):
        return "boolean"
    if isinstance(value, np.generic):
        return value.dtype.name
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    raise TypeError(f"an argument of type {type(value).__name__} has no Numba type this record knows")


def constants_of(function) -> dict:
    """The module constants a specialized copy of a kernel holds with other values than its module's
    (a NumPy scalar as {"dtype": ..., "value": ...})."""
    import numpy as np

    module = vars(sys.modules[function.__module__])
    found = {}
    for name, value in function.__globals__.items():
        if name not in module or module[name] is value or not isinstance(value, (int, float, np.generic)):
            continue
        found[name] = {"dtype": value.dtype.name, "value": value.item()} if isinstance(value, np.generic) \
            else value
    return found


def constant(value):
    import numpy as np

    return np.dtype(value["dtype"]).type(value["value"]) if isinstance(value, dict) else value


class Recorder:
    """While active, notes each launch that goes through course.core.launch.launch."""

    def __init__(self):
        self.kernels: dict[str, dict] = {}

    def __enter__(self):
        from course.core import launch

        self.original = launch.Launch.__call__
        recorder = self

        def call(one):
            recorder.note(one)
            return recorder.original(one)

        launch.Launch.__call__ = call
        return self

    def __exit__(self, *exc):
        from course.core import launch

        launch.Launch.__call__ = self.original

    def note(self, one) -> None:
        from course.core.source import python_function

        function = python_function(one.kernel)
        entry = self.kernels.setdefault(kernel_key(function), {"parameters": fingerprint(function),
                                                               "launches": []})
        noted = {"types": [argument_type(a) for a in one.arguments], "constants": constants_of(function)}
        if noted not in entry["launches"]:
            entry["launches"].append(noted)


def numba_modules() -> list[str]:
    """The modules of solutions/ with Numba kernels (decorated, or compiled per head dimension by
    `launch.specialize`)."""
    paths = (ROOT / "solutions").glob("*.py")
    return sorted(p.stem for p in paths if "from numba import cuda" in p.read_text())


def record(out: Path = RECORD) -> dict:
    """Run the Numba exercises' checks (solutions) in the simulator, recording their launches."""
    from course.registry import EXERCISES

    with Recorder() as recorder:
        for exercise in EXERCISES.values():
            if exercise.module in numba_modules():
                started = time.perf_counter()
                report = exercise.run(impl="solutions")
                print(f"recorded {exercise.id}: {'passed' if report.passed else 'FAILED'} "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
    kernels = {key: recorder.kernels[key] for key in sorted(recorder.kernels)}
    out.write_text(json.dumps(kernels, indent=1, sort_keys=True) + "\n")
    return kernels


# ------------------------------------------------------------------------------------ compiling


def numba_type(described):
    import numpy as np
    from numba import from_dtype, types

    if isinstance(described, dict):
        return types.Array(from_dtype(np.dtype(described["array"])), described["ndim"], described["layout"])
    return getattr(types, described)


def kernels_in(module) -> list:
    """The @cuda.jit kernels (not device functions) that `module` defines."""
    from numba.cuda.dispatcher import CUDADispatcher

    return [value for value in vars(module).values()
            if isinstance(value, CUDADispatcher) and not value.targetoptions.get("device")
            and value.py_func.__module__ == module.__name__]


def compile_launch(function, launch: dict) -> None:
    from numba import cuda

    copy = function
    if launch["constants"]:
        constants = {name: constant(value) for name, value in launch["constants"].items()}
        copy = types.FunctionType(function.__code__, {**function.__globals__, **constants},
                                  function.__name__, function.__defaults__, function.__closure__)
    cuda.compile_ptx(copy, tuple(numba_type(t) for t in launch["types"]), cc=COMPUTE_CAPABILITY)


def compile_all(kernels: dict, modules: list[str] | None = None) -> int:
    started, count, problems = time.perf_counter(), 0, []
    for name in modules or [f"solutions.{m}" for m in numba_modules()]:
        module = importlib.import_module(name)
        prefix = name.removeprefix("solutions.") + "."
        recorded = [getattr(module, key.removeprefix(prefix), None)
                    for key in kernels if key.startswith(prefix)]
        functions = {k.py_func for k in kernels_in(module)}
        functions |= {getattr(f, "py_func", f) for f in recorded if callable(f)}
        for function in sorted(functions, key=lambda f: f.__name__):
            entry = kernels.get(kernel_key(function))
            if entry is None:
                problems.append(f"{name}: kernel {function.__name__}: no launch recorded "
                                "(`python -m course.ptx_compile --record`)")
                continue
            for launch in entry["launches"]:
                try:
                    compile_launch(function, launch)
                    count += 1
                except Exception as error:  # Numba's message names the cause
                    constants = launch["constants"] or "as defined"
                    problems.append(f"{name}: kernel {function.__name__} ({constants}) does not compile "
                                    f"to PTX for sm_90:\n{str(error).strip()}")
                    break
    for problem in problems:
        print(problem, flush=True)
    print(f"compiled {count} launches to PTX for sm_90 in {time.perf_counter() - started:.0f} s; "
          + (f"{len(problems)} kernels FAILED" if problems else "every kernel compiles"))
    return 1 if problems else 0


# The compiling process: `course` must pick Numba's CUDA target, which it does only where PyTorch
# sees a GPU; nothing in that process launches a kernel or allocates on a GPU.
BOOT = ("import sys, torch; torch.cuda.is_available = lambda: True; "
        "from course.ptx_compile import main; sys.exit(main(sys.argv[1:]))")


def run(record_path: Path = RECORD, modules: list[str] | None = None, timeout_s: float = 600,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m course.ptx_compile` in a fresh process, as CI runs it."""
    command = [sys.executable, "-c", BOOT, "--launches", str(record_path)]
    command += ["--modules", *modules] if modules else []
    variables = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", **(env or {})}
    variables.pop("COURSE_SIM", None)
    return subprocess.run(command, cwd=ROOT, env=variables, capture_output=True, text=True, timeout=timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = arguments("python -m course.ptx_compile", __doc__.splitlines()[0], RECORD, argv)
    if args.record:
        say_recorded(record(args.launches), args.launches)
        return 0
    from course.core import runtime

    if runtime.SIMULATOR:  # this process has the simulator: compile in one that has the CUDA target
        done = run(args.launches, args.modules)
        print(done.stdout + done.stderr, end="")
        return done.returncode
    return compile_all(json.loads(args.launches.read_text()), args.modules)


if __name__ == "__main__":
    sys.exit(main())
