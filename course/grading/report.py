"""What grading writes: the gradebook (CSV), a feedback file per student (markdown), grades.json."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .runner import SubmissionGrade

FAILURES_SHOWN = 5
DETAIL_CHARS = 1500


def write_gradebook(grades: list[SubmissionGrade], exercises: list, path: Path) -> None:
    """One row per student, one column per exercise (points earned), the total and flags."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *[e.id for e in exercises], "total", "possible", "flags"])
        writer.writerow(["(points)", *[e.points for e in exercises],
                         sum(e.points for e in exercises), "", ""])
        for grade in grades:
            writer.writerow([grade.student, *[f"{grade.exercises[e.id].points:g}" for e in exercises],
                             f"{grade.total:g}", f"{grade.possible:g}", "; ".join(grade.flags)])


def _quote(text: str) -> list[str]:
    text = text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "\n... (cut)"
    return ["```", *text.replace("```", "'''").splitlines(), "```"]


def feedback(grade: SubmissionGrade, seed_public: bool = False) -> str:
    lines = [f"# Feedback for {grade.student}", "",
             f"Total: **{grade.total:g} / {grade.possible:g}** points.", ""]
    if grade.notes:
        lines += ["## About the submission", "", *[f"- {n}" for n in grade.notes], ""]
    lines += ["| exercise | points | cases passed |", "|---|---|---|"]
    for g in grade.exercises.values():
        passed = f"{len(g.results) - len(g.failures)} / {len(g.results)}" if g.results else "-"
        passed = f"not counted ({g.violation})" if g.violation else passed
        lines.append(f"| `{g.exercise}` | {g.points:g} / {g.points_possible:g} | {passed} |")
    lines.append("")
    for g in grade.exercises.values():
        if g.results and not g.failures and not g.note and not g.violation:
            continue
        lines += [f"## `{g.exercise}`: {g.points:g} / {g.points_possible:g}", ""]
        if g.note:
            lines += ["Note: " + g.note.splitlines()[0], ""]
            rest = "\n".join(g.note.splitlines()[1:]).strip()
            if rest:
                lines += [*_quote(rest), ""]
        if g.not_implemented:
            lines += [f"Not implemented: {g.not_implemented}", ""]
        elif not g.results and not g.note:
            lines += ["No test case ran.", ""]
        for case, _, detail in g.failures[:FAILURES_SHOWN]:
            lines += [f"- failed: {case}", ""]
            if detail:
                lines += [*_quote(detail), ""]
        if len(g.failures) > FAILURES_SHOWN:
            lines += [f"... and {len(g.failures) - FAILURES_SHOWN} more failing cases.", ""]
    lines += ["Run the same checks with the public seed: `python -m course check <exercise>` "
              "(or the check cell of the notebook).", ""]
    return "\n".join(lines)


def as_json(grade: SubmissionGrade) -> dict:
    return {"student": grade.student, "source": grade.source, "total": grade.total,
            "possible": grade.possible, "notes": grade.notes, "flags": grade.flags,
            "exercises": {g.exercise: {"points": g.points, "possible": g.points_possible,
                                       "fraction": g.fraction, "note": g.note, "violation": g.violation,
                                       "not_implemented": g.not_implemented, "seconds": g.seconds,
                                       "results": [list(r) for r in g.results]}
                          for g in grade.exercises.values()}}


def write_all(grades: list[SubmissionGrade], exercises: list, out: Path, seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_gradebook(grades, exercises, out / "gradebook.csv")
    folder = out / "feedback"
    folder.mkdir(exist_ok=True)
    for grade in grades:
        (folder / f"{grade.student}.md").write_text(feedback(grade))
    (out / "grades.json").write_text(json.dumps(
        {"exercises": [e.id for e in exercises], "students": [as_json(g) for g in grades]}, indent=1))
