"""compute-sanitizer over every kernel's check, Numba and Triton: `python -m course sanitize` on a GPU.

memcheck finds out-of-bounds and misaligned accesses; racecheck finds shared-memory
hazards (a read and a write of one shared address by different threads with no barrier
between them). Each (notebook, tool) pair runs `python -m course check NN --impl solutions`
under the sanitizer in its own process, several at once (they share the GPU). The Numba
notebooks (01, 03-11c) run with COURSE_SIZES=small: the simulator's problem sizes, which
cover every edge-case tree (N = 1, ragged last tiles, batches of different trees, every head
dimension) at a hundredth of the sanitizer's cost. The Triton notebooks (12-18) pick their
tile sizes, warps and vocabulary blocks from COURSE_SIZES too (`runtime.pick`), so by default
they run at full sizes, with the tiles that ship (`--triton-sizes small` for a quick pass with
the interpreter's tiles), and with `--target-processes all`. Every run sets
PYTORCH_NO_CUDA_MEMORY_CACHING=1: with PyTorch's caching allocator a read past a tensor lands
in the same pooled block and memcheck cannot see it. `python -m course sanitize --triton`
(or `--numba`) runs one family. Prints each run's command and summary, and exits 1 unless
every run reports 0 errors.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from course.topics.ladder.rungs import RUNGS

SANITIZER = Path("/usr/local/cuda/bin/compute-sanitizer")
TOOLS = ("memcheck", "racecheck")
# Every notebook whose exercises launch Numba kernels: the tree kernels and the ladder.
NUMBA_NOTEBOOKS = ("01", *dict.fromkeys(rung.notebook.split("_")[0] for rung in RUNGS))
# Every notebook whose exercises launch Triton kernels: tree attention, DeFT, sampling,
# verification, EMS-SD and SwiftSpec.
TRITON_NOTEBOOKS = ("12", "13", "14", "15", "16", "17", "18", "21")
NOTEBOOKS = (*NUMBA_NOTEBOOKS, *TRITON_NOTEBOOKS)
# (--report-api-errors no: the CUDA Python bindings probe driver entry points this driver lacks.)
TOOL_FLAGS = {"memcheck": ["--report-api-errors", "no"], "racecheck": []}
CLEAN = {"memcheck": re.compile(r"ERROR SUMMARY: 0 errors"),
         "racecheck": re.compile(r"RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)")}


def command(sanitizer: Path, tool: str, notebook: str, target: str | None = None,
            impl: str = "solutions") -> list[str]:
    """The sanitizer over `python -m course check` of a notebook's exercises (or of `target`, one
    exercise of that notebook), in `impl`'s copy."""
    # Triton compiles in the checked process (ptxas runs beside it): follow every process.
    follow = ["--target-processes", "all"] if notebook in TRITON_NOTEBOOKS else []
    return [str(sanitizer), "--tool", tool, *TOOL_FLAGS[tool], *follow, "--error-exitcode", "1",
            sys.executable, "-m", "course", "check", target or notebook, "--impl", impl, "--full"]


def environment(notebook: str, triton_sizes: str = "full") -> dict[str, str]:
    """The variables a run sets: the GPU, the problem sizes, and no pooled allocations."""
    sizes = triton_sizes if notebook in TRITON_NOTEBOOKS else "small"
    return {"COURSE_SIM": "0", "COURSE_SIZES": sizes, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def run_one(sanitizer: Path, tool: str, notebook: str, timeout_s: float,
            triton_sizes: str = "full") -> tuple[bool, str]:
    """(clean, report) of one sanitizer run: its command, the checks' verdicts and its summary."""
    return sanitized(command(sanitizer, tool, notebook), environment(notebook, triton_sizes), tool, timeout_s)


def sanitized(argv: list[str], variables: dict[str, str], tool: str, timeout_s: float) -> tuple[bool, str]:
    """(clean, report) of one sanitizer command run with `variables` set."""
    env = {**os.environ, **variables}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"$ {' '.join(argv)}\ntimed out after {timeout_s:.0f} s\n"
    output = done.stdout + done.stderr
    clean = done.returncode == 0 and bool(CLEAN[tool].search(output))
    kept = [line for line in output.splitlines()
            if "passed" in line or "FAILED" in line or "SUMMARY" in line or "Error" in line]
    settings = " ".join(f"{k}={v}" for k, v in variables.items())
    return clean, "\n".join([f"$ {settings} {' '.join(argv)}", *kept, ""])


def racecheck(selector: str | None, impl: str, sanitizer: Path = SANITIZER, timeout_s: float = 1200) -> int:
    """`python -m course check EXERCISE --racecheck`: compute-sanitizer's racecheck over the check of
    each selected exercise, in `impl`'s copy, on a GPU. The simulator and Triton's interpreter cannot
    show a race between a block's threads; racecheck sees every shared-memory hazard."""
    from course.core.runtime import SIMULATOR
    from course.registry import select

    if SIMULATOR:
        print("--racecheck runs compute-sanitizer, which needs an NVIDIA GPU. On the CPU each check "
              "instead compares your kernel's barriers with the solution's.")
        return 2
    if not sanitizer.exists():
        print(f"--racecheck: compute-sanitizer is not at {sanitizer} (it comes with the CUDA toolkit)")
        return 2
    failed = []
    for exercise in select(selector):
        notebook = exercise.notebook.split("_")[0]
        argv = command(sanitizer, "racecheck", notebook, target=exercise.id, impl=impl)
        clean, report = sanitized(argv, environment(notebook), "racecheck", timeout_s)
        print(f"## {exercise.id}, racecheck: {'no hazard' if clean else 'HAZARDS'}\n{report}", flush=True)
        failed += [] if clean else [exercise.id]
    print("racecheck clean" if not failed else "racecheck found hazards in: " + ", ".join(failed))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course sanitize", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=[])
    family = parser.add_mutually_exclusive_group()
    family.add_argument("--numba", action="store_true", help="the Numba notebooks only")
    family.add_argument("--triton", action="store_true", help="the Triton notebooks only")
    parser.add_argument("--triton-sizes", choices=("full", "small"), default="full",
                        help="COURSE_SIZES of the Triton runs (full: the tiles that ship)")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--jobs", type=int, default=8, help="sanitizer runs at once")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    parser.add_argument("--sanitizer", type=Path, default=SANITIZER)
    args = parser.parse_args(argv)
    if not args.notebooks:
        args.notebooks = list(NUMBA_NOTEBOOKS if args.numba else
                              TRITON_NOTEBOOKS if args.triton else NOTEBOOKS)
    if not args.sanitizer.exists():
        parser.error(f"--sanitizer: {args.sanitizer} does not exist")
    unknown = sorted(set(args.notebooks) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"notebooks must be among {', '.join(NOTEBOOKS)}; got {', '.join(unknown)}")
    pairs = [(tool, notebook) for notebook in args.notebooks for tool in args.tools]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda pair: run_one(args.sanitizer, *pair, args.timeout, args.triton_sizes),
                                pairs))
    for (tool, notebook), (clean, report) in zip(pairs, results, strict=True):
        print(f"## notebook {notebook}, {tool}: {'0 errors' if clean else 'ERRORS'}\n{report}", flush=True)
    failed = [f"{notebook} {tool}" for (tool, notebook), (clean, _) in zip(pairs, results, strict=True)
              if not clean]
    print("all clean" if not failed else "not clean: " + ", ".join(failed))
    return 1 if failed else 0

