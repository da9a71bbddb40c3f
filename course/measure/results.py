"""Measurement files shared by every suite: results/<device>/<suite>.json.

Schema: {"suite": str, "device": str, "date": ISO-8601, "software": {package: version},
"rows": [{"name": str, "median_ms": float, "max_abs_err": float, ...sizes such as B, H, N, d}]}
A row with "error": str (a method that did not run) has median_ms and max_abs_err null; a row with
"modelled": true (computed from a model, not run) has max_abs_err null.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path

from course.core import runtime
from course.core.regions import ROOT

RESULTS = ROOT / "results"
REQUIRED_ROW_KEYS = {"name": str, "median_ms": float, "max_abs_err": float}
# A method that failed to run ("error": why) has no time and no error (null, never a made-up 0);
# a modelled row ("modelled": true, e.g. a bandwidth floor) has a time but computed no output; a
# statistic ("statistic": what it measured, e.g. a draft's acceptance rates) has neither.
_ABSENT_ALLOWED = {"median_ms": ("error", "statistic"), "max_abs_err": ("error", "modelled", "statistic")}


def device_folder(device_name: str) -> str:
    """A short folder name for a device: 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    found = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", device_name.upper())
    return (found.group(1) if found else re.sub(r"\W+", "-", device_name)).lower()


def validate(document: dict, where: str = "results") -> dict:
    """Check a results document against the schema; errors name the field."""
    if not isinstance(document, dict):
        raise ValueError(f"{where} must be a JSON object")
    for key, kind in (("suite", str), ("device", str), ("date", str), ("software", dict),
                      ("rows", list)):
        if not isinstance(document.get(key), kind):
            raise ValueError(f"{where}: field {key!r} must be a {kind.__name__}")
    try:
        datetime.datetime.fromisoformat(document["date"])
    except ValueError:
        raise ValueError(f"{where}: field 'date' must be ISO-8601, got {document['date']!r}") from None
    for index, row in enumerate(document["rows"]):
        for key, kind in REQUIRED_ROW_KEYS.items():
            value = row.get(key) if isinstance(row, dict) else None
            if value is None and key in _ABSENT_ALLOWED and isinstance(row, dict) and any(
                    row.get(reason) for reason in _ABSENT_ALLOWED[key]):
                continue
            if kind is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            else:
                ok = isinstance(value, kind)
            if not ok:
                raise ValueError(f"{where}: rows[{index}].{key} must be a finite {kind.__name__}")
    return document


def document(suite: str, rows: list[dict]) -> dict:
    """This GPU's rows as a results document (the shared schema), validated, not yet saved."""
    if runtime.SIMULATOR:
        raise RuntimeError("results record GPU measurements; the simulator has none to record")
    return validate({
        "suite": suite, "device": runtime.device_name(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "software": runtime.software_versions(), "rows": rows,
    }, f"suite {suite!r}")


def save(suite: str, rows: list[dict], directory: Path | None = None) -> Path:
    """Write this GPU's measurements as results/<device>/<suite>.json and return the path."""
    measured = document(suite, rows)
    path = (directory or RESULTS / device_folder(measured["device"])) / f"{suite}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured, indent=1) + "\n")
    return path


def load(suite: str, device: str | None = None, directory: Path = RESULTS) -> dict:
    """Read committed measurements of a suite (from the one device folder that has it, by default)."""
    candidates = sorted(directory.glob(f"{device or '*'}/{suite}.json"))
    if not candidates:
        raise FileNotFoundError(f"no committed results for suite {suite!r} under {directory}")
    if len(candidates) > 1 and device is None:
        names = ", ".join(p.parent.name for p in candidates)
        raise ValueError(f"suite {suite!r} has results for several devices ({names}): pass device=")
    return validate(json.loads(candidates[0].read_text()), str(candidates[0]))


def kept_rows(suite: str, keep) -> list[dict]:
    """This device's committed rows of `suite` for which keep(row) is true, each with the date of
    the run that measured it (`run`), for a bench that re-measures only part of a suite; [] when
    this device has no committed results yet."""
    try:
        committed = load(suite, device_folder(runtime.device_name()))
    except FileNotFoundError:
        return []
    return [dict(row, run=row.get("run", committed["date"])) for row in committed["rows"] if keep(row)]


class NotMeasuredYet(LookupError):
    """A suite's committed results do not exist yet, or lack the rows asked for."""


# A topic's suite is named after its room (`python -m course bench <room>` writes <room>.json); the
# suites measured otherwise, by the command that writes each.
MEASURED_BY = {"step_profile": "python -m course bench capstone step_profile",
               "queued_rounds": "python3 tools/queued_rounds.py --out results/<device>x2",
               "side_spans": "python3 tools/side_spans.py --out results/<device>",
               "queued_timeline": "python3 tools/queued_timeline.py --out results/<device>"}


def load_measured(suite: str) -> dict:
    """`load(suite)`, or NotMeasuredYet naming the command that measures it."""
    try:
        return load(suite)
    except FileNotFoundError:
        command = MEASURED_BY.get(suite, f"python -m course bench {suite}")
        raise NotMeasuredYet(f"no committed results/<device>/{suite}.json yet: run `{command}` "
                             "on a GPU") from None


def committed_rows(suite: str, figure: str, names, order: str) -> tuple[list[dict], str]:
    """The committed rows of `figure` for each of `names` in one numbering, and a note that
    says where they come from (the simulator shows another machine's measurements)."""
    document = load_measured(suite)
    rows = []
    for name in names:
        found = [row for row in document["rows"] if row.get("figure") == figure and row["name"] == name
                 and row.get("order") == order]
        if not found:
            raise NotMeasuredYet(f"the committed {suite}.json has no {name!r} row in {order} order")
        rows.append(found[0])
    return rows, (f"simulator: these are the committed measurements from {document['device']} "
                  f"({document['date'][:10]}), not timings of this machine")
