"""compute-sanitizer over every Numba kernel's check: `python -m course sanitize` on a GPU.

memcheck finds out-of-bounds and misaligned accesses; racecheck finds shared-memory
hazards (a read and a write of one shared address by different threads with no barrier
between them). Each (notebook, tool) pair runs `python -m course check NN --impl solutions`
under the sanitizer in its own process, several at once (they share the GPU), with
COURSE_SIZES=small: the simulator's problem sizes, which cover every edge-case tree
(N = 1, ragged last tiles, batches of different trees, every head dimension) at a
hundredth of the sanitizer's cost. Prints each run's command and summary, and exits 1
unless every run reports 0 errors.
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
NOTEBOOKS = ("01", *dict.fromkeys(rung.notebook.split("_")[0] for rung in RUNGS))
# (--report-api-errors no: the CUDA Python bindings probe driver entry points this driver lacks.)
TOOL_FLAGS = {"memcheck": ["--report-api-errors", "no"], "racecheck": []}
CLEAN = {"memcheck": re.compile(r"ERROR SUMMARY: 0 errors"),
         "racecheck": re.compile(r"RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)")}


def command(sanitizer: Path, tool: str, notebook: str) -> list[str]:
    return [str(sanitizer), "--tool", tool, *TOOL_FLAGS[tool], "--error-exitcode", "1",
            sys.executable, "-m", "course", "check", notebook, "--impl", "solutions"]


def run_one(sanitizer: Path, tool: str, notebook: str, timeout_s: float) -> tuple[bool, str]:
    """(clean, report) of one sanitizer run: its command, the checks' verdicts and its summary."""
    argv = command(sanitizer, tool, notebook)
    env = {**os.environ, "COURSE_SIM": "0", "COURSE_SIZES": "small"}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"$ {' '.join(argv)}\ntimed out after {timeout_s:.0f} s\n"
    output = done.stdout + done.stderr
    clean = done.returncode == 0 and bool(CLEAN[tool].search(output))
    kept = [line for line in output.splitlines()
            if "passed" in line or "FAILED" in line or "SUMMARY" in line or "Error" in line]
    return clean, "\n".join([f"$ COURSE_SIM=0 COURSE_SIZES=small {' '.join(argv)}", *kept, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course sanitize", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=list(NOTEBOOKS))
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--jobs", type=int, default=8, help="sanitizer runs at once")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    parser.add_argument("--sanitizer", type=Path, default=SANITIZER)
    args = parser.parse_args(argv)
    if not args.sanitizer.exists():
        parser.error(f"--sanitizer: {args.sanitizer} does not exist")
    unknown = sorted(set(args.notebooks) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"notebooks must be among {', '.join(NOTEBOOKS)}; got {', '.join(unknown)}")
    pairs = [(tool, notebook) for notebook in args.notebooks for tool in args.tools]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda pair: run_one(args.sanitizer, *pair, args.timeout), pairs))
    for (tool, notebook), (clean, report) in zip(pairs, results, strict=True):
        print(f"## notebook {notebook}, {tool}: {'0 errors' if clean else 'ERRORS'}\n{report}", flush=True)
    failed = [f"{notebook} {tool}" for (tool, notebook), (clean, _) in zip(pairs, results, strict=True)
              if not clean]
    print("all clean" if not failed else "not clean: " + ", ".join(failed))
    return 1 if failed else 0

