"""The committed measurement of how long each check's default list takes in the simulator
(results/cpu/check_times.json, written by `python -m course.check_times`): it covers every
check a student can run, each passed, and each is within the course's promise of 30 s on one core.
The test reads the record; it times nothing (CI's machine is loaded, and a timed test would flake)."""

from __future__ import annotations

import json

from course import check_times
from course.measure import results

RECORD = results.RESULTS / "cpu" / "check_times.json"


def test_the_record_covers_every_check_and_each_keeps_the_promise():
    document = results.validate(json.loads(RECORD.read_text()), str(RECORD))
    timed = {row["name"]: row for row in document["rows"]}
    missing = set(check_times.checks_to_time()) - set(timed)
    assert not missing, f"not timed yet (run python -m course.check_times): {sorted(missing)}"
    slow = {name: row["cpu_s"] for name, row in timed.items() if row["cpu_s"] > check_times.PROMISED_CPU_S}
    assert not slow, f"default lists over {check_times.PROMISED_CPU_S} s of CPU: {slow}"
    assert all(row["passed"] for row in timed.values())
