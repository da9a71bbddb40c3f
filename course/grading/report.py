"""What grading writes: the gradebook (CSV), a feedback file per student (markdown), grades.json.

Speed (on a GPU, course.grading.speed): the gradebook gets one more column per timed exercise,
`speed <exercise>`, holding the student's time over the solution's (above 1: slower; empty when
not timed), after the existing columns; each feedback file ends with a "Speed" section; grades.json
holds the times, the ratios and why any is missing. In the simulator there are no speed columns,
and the feedback says that nothing was timed.
"""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path

from .runner import SubmissionGrade
from .speed import Speed

FAILURES_SHOWN = 5
DETAIL_CHARS = 1500
NOT_ISOLATED = ("**This grade was produced without isolation** (`--no-sandbox`): the submission's code ran "
                "with the grader's rights, so nothing kept it from the answer key or from other "
                "submissions.")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value) -> str:
    """A CSV cell no spreadsheet runs as a formula (a leading =, +, -, @, tab or CR gets a quote)."""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


# Terminal escape sequences, then any other control or direction-changing character.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-_])")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
# What a markdown viewer turns into a link: a scheme, a bare www. name, an e-mail address.
_LINK = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{1,20}):(?=//)|\b(www)\.|(?<=\w)@(?=\w)")
_MARKDOWN = re.compile(r"([\\`*\[\]|~#<>!]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def inert(text: str) -> str:
    """Text without terminal escapes or control characters (newlines kept, tabs as spaces)."""
    text = _ESCAPES.sub("", str(text)).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text.replace("\t", "    "))


def _unlinked(text: str) -> str:
    """http://x as http[:]//x, www.x as www[.]x, a@b as a[@]b: shown, never followed."""
    def cut(match: re.Match) -> str:
        if match.group(1):
            return f"{match.group(1)}[:]"
        return "www[.]" if match.group(2) else "[@]"

    return _LINK.sub(cut, text)


def _md(text: str) -> str:
    """Text from a submission or its child as one line of inert markdown: no raw HTML, links,
    images, emphasis, headings, code spans or table cells; no escape or control characters."""
    text = _unlinked(inert(text).replace("\n", " "))
    return _MARKDOWN.sub(r"\\\1", html.escape(text, quote=False))


def _timed(exercises: list, speed: Speed | None) -> list:
    return [e for e in exercises if speed is not None and speed.timed and e.timed]


def write_gradebook(grades: list[SubmissionGrade], exercises: list, path: Path,
                    speed: Speed | None = None) -> None:
    """One row per student, one column per exercise (points earned), the total and flags; on a GPU,
    then one `speed <exercise>` column per timed exercise (student time / solution time)."""
    timed = _timed(exercises, speed)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        header = ["student", *[e.id for e in exercises], "total", "possible", "flags",
                  *[f"speed {e.id}" for e in timed]]
        writer.writerow([_cell(c) for c in header])
        writer.writerow(["(points)", *[e.points for e in exercises],
                         sum(e.points for e in exercises), "", "", *["" for _ in timed]])
        for grade in grades:
            ratios = [speed.ratio(grade.exercises[e.id]) for e in timed]
            row = [grade.student, *[f"{grade.exercises[e.id].points:g}" for e in exercises],
                   f"{grade.total:g}", f"{grade.possible:g}", "; ".join(grade.flags),
                   *["" if r is None else f"{r:.3f}" for r in ratios]]
            writer.writerow([_cell(c) for c in row])


def _quote(text: str) -> list[str]:
    """Text in a code block it cannot close (every run of backticks or tildes broken up)."""
    text = inert(text)
    text = text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "\n... (cut)"
    text = re.sub(r"`{3,}|~{3,}", lambda match: "'" * len(match.group(0)), text)
    return ["```", *text.splitlines(), "```"]


def speed_section(grade: SubmissionGrade, speed: Speed, hooked: set[str]) -> list[str]:
    """The feedback's "Speed" lines: each timed exercise against the solution, or why nothing was."""
    lines = ["## Speed", ""]
    if not speed.timed:
        return lines + [f"Not timed: {speed.reason}. Only grading on a GPU times the kernels.", ""]
    lines += [f"Median times on {speed.device or 'the GPU'} (warmed up), at the benchmark's shape, on the "
              "same inputs for your kernel and the solution's; a ratio above 1 is slower than the solution. "
              "Speed earns no points.", ""]
    if speed.note:
        lines += [speed.note, ""]
    lines += ["| exercise | speed |", "|---|---|"]
    for g in grade.exercises.values():
        if g.exercise in hooked:
            lines.append(f"| `{g.exercise}` | {_md(speed.describe(g))} |")
    others = [g.exercise for g in grade.exercises.values() if g.exercise not in hooked]
    if others:
        lines += ["", f"No timing for: {', '.join(f'`{e}`' for e in others)}."]
    return lines + [""]


def feedback(grade: SubmissionGrade, seed_public: bool = False, speed: Speed | None = None,
             hooked: set[str] = frozenset()) -> str:
    lines = [f"# Feedback for {_md(grade.student)}", "",
             f"Total: **{grade.total:g} / {grade.possible:g}** points.", ""]
    if not grade.isolated:
        lines += [NOT_ISOLATED, ""]
    if grade.notes:
        lines += ["## About the submission", "", *[f"- {_md(n)}" for n in grade.notes], ""]
    lines += ["| exercise | points | cases passed |", "|---|---|---|"]
    for g in grade.exercises.values():
        passed = f"{len(g.results) - len(g.failures)} / {len(g.results)}" if g.results else "-"
        passed = f"not counted ({_md(g.violation)})" if g.violation else passed
        lines.append(f"| `{g.exercise}` | {g.points:g} / {g.points_possible:g} | {passed} |")
    lines.append("")
    if any(g.seeded for g in grade.exercises.values()):
        lines += ["Where an exercise has both, the cases drawn from the grading seed carry two thirds of its "
                  "points together, and the fixed cases (those the notebook runs too) the rest.", ""]
    for g in grade.exercises.values():
        if g.results and not g.failures and not g.note and not g.violation:
            continue
        lines += [f"## `{g.exercise}`: {g.points:g} / {g.points_possible:g}", ""]
        if g.note:
            lines += ["Note: " + _md(g.note.splitlines()[0]), ""]
            rest = "\n".join(g.note.splitlines()[1:]).strip()
            if rest:
                lines += [*_quote(rest), ""]
        if g.not_implemented:
            lines += [f"Not implemented: {_md(g.not_implemented)}", ""]
        elif not g.results and not g.note:
            lines += ["No test case ran.", ""]
        for case, _, detail in g.failures[:FAILURES_SHOWN]:
            lines += [f"- failed: {_md(case)}", ""]
            if detail:
                lines += [*_quote(detail), ""]
        if len(g.failures) > FAILURES_SHOWN:
            lines += [f"... and {len(g.failures) - FAILURES_SHOWN} more failing cases.", ""]
    if speed is not None:
        lines += speed_section(grade, speed, hooked)
    lines += ["Run the same checks with the public seed: `python -m course check <exercise>` "
              "(or the check cell of the notebook).", ""]
    return "\n".join(lines)


def as_json(grade: SubmissionGrade, speed: Speed | None = None) -> dict:
    def timing(g) -> dict:
        if speed is None:
            return {}
        return {"student_ms": g.student_ms, "solution_ms": speed.solution_ms.get(g.exercise),
                "time_ratio": speed.ratio(g), "timing_note": g.timing_note}

    return {"student": grade.student, "source": grade.source, "total": grade.total,
            "possible": grade.possible, "notes": grade.notes, "flags": grade.flags,
            "exercises": {g.exercise: {"points": g.points, "possible": g.points_possible,
                                       "fraction": g.fraction, "note": g.note, "violation": g.violation,
                                       "not_implemented": g.not_implemented, "seconds": g.seconds,
                                       "seeded_cases": sorted(g.seeded),
                                       **timing(g), "results": [list(r) for r in g.results]}
                          for g in grade.exercises.values()}}


def write_all(grades: list[SubmissionGrade], exercises: list, out: Path, seed: int,
              speed: Speed | None = None, sandbox: dict | None = None) -> None:
    speed = speed or Speed.untimed()
    hooked = {e.id for e in exercises if e.timed}
    out.mkdir(parents=True, exist_ok=True)
    write_gradebook(grades, exercises, out / "gradebook.csv", speed)
    folder = out / "feedback"
    folder.mkdir(exist_ok=True)
    for grade in grades:  # ids are short and file-safe (course.grading.collect.distinct)
        try:
            text = feedback(grade, speed=speed, hooked=hooked)
        except Exception as error:  # noqa: BLE001  (one student's feedback must not stop the others')
            text = (f"# Feedback for {_md(grade.student)}\n\nTotal: **{grade.total:g} / {grade.possible:g}** "
                    f"points.\n\nThe detailed feedback could not be written ({type(error).__name__}).\n")
        (folder / f"{grade.student}.md").write_text(text)
    (out / "grades.json").write_text(json.dumps(
        {"exercises": [e.id for e in exercises], "timing": speed.as_json(), "sandbox": sandbox or {},
         "students": [as_json(g, speed) for g in grades]}, indent=1))
