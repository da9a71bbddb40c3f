"""How long a student waits for each check in the simulator: `python -m course.check_times`.

Each exercise's default case list (`Exercise.default_cases`, what `python -m course check` runs without
`--full`) is run as a student runs it, `python -m course check ID --impl solutions` in a process of its
own, and timed twice: the CPU seconds of that process (user + system, which equal the wall time on a
quiet core of one's own) and the wall seconds on this machine, which a loaded machine stretches.
The course promises under 30 s per default list on one core, so the CPU seconds are the measure.

Written to results/cpu/check_times.json, in the results schema: one "statistic" row per check run
(a single run, so no median), with cpu_s, wall_s and the exercises that run shared.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import subprocess
import sys
import time

from course.core import runtime
from course.measure import results

PROMISED_CPU_S = 30.0


def _child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_check(exercise_id: str) -> dict:
    """One row: run exercise_id's default list in a fresh simulator process and time it."""
    environment = {**os.environ, "COURSE_SIM": "1", "OMP_NUM_THREADS": "1"}
    cpu_before, wall_before = _child_cpu_seconds(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "course", "check", exercise_id, "--impl", "solutions"],
                          env=environment, capture_output=True, text=True)
    cpu_s, wall_s = _child_cpu_seconds() - cpu_before, time.perf_counter() - wall_before
    row = {"name": exercise_id, "statistic": "CPU and wall seconds of one default-list check",
           "median_ms": None, "max_abs_err": None, "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2),
           "passed": done.returncode == 0}
    if done.returncode != 0:
        row["error"] = (done.stdout + done.stderr)[-400:]
    return row


def measure(exercise_ids, log=print) -> dict:
    rows = []
    for exercise_id in exercise_ids:
        rows.append(time_check(exercise_id))
        log(f"{exercise_id:<40} {rows[-1]['cpu_s']:6.1f} s CPU {rows[-1]['wall_s']:6.1f} s wall")
    return {"suite": "check_times", "device": "cpu (Numba's CUDA simulator, Triton's interpreter)",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "software": runtime.software_versions(),
            "promised_cpu_s": PROMISED_CPU_S, "rows": rows}


def checks_to_time() -> list[str]:
    """One id per check run: exercises checked together (notebook 12's two) are timed once."""
    from course.registry import EXERCISES, checked_together

    timed, seen = [], set()
    for exercise in EXERCISES.values():
        if exercise.id not in seen:
            timed.append(exercise.id)
            seen.update(e.id for e in checked_together(exercise))
    return timed


def main() -> int:
    document = results.validate(measure(checks_to_time()), "check_times")
    path = results.RESULTS / "cpu" / "check_times.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path.relative_to(results.RESULTS.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
