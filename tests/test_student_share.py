"""A student module holds the student's work: its kernels and one plain launcher each, not a harness.

For every module of solutions/ (what `python -m course release` turns into a student's lessons/
file) this counts the non-blank lines and, of those, the non-blank lines inside its exercise
regions (`### BEGIN SOLUTION` ... `### END SOLUTION`, the markers left out): the lines a student
writes. What a student does not write, launchers for benchmarks and CUDA graphs, host-side
preparation, baselines, lives in the topic's room (`course/topics/<topic>/`), which runs the
student's kernels through `course.core.impl.load`.

The goals: no student module over MAX_LINES non-blank lines, and in every Triton module the
student's lines at least MIN_SHARE of them, except where SHORT_OF_SHARE says why not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"
MAX_LINES = 300
MIN_SHARE = 0.15

# Triton modules whose student lines stay below MIN_SHARE, with the reason and the share they must
# still reach (so that the exemption cannot hide a module growing back into a harness).
SHORT_OF_SHARE: dict[str, tuple[float, str]] = {
    "deft": (0.10, "three kernels (two attention kernels and the merge) and the helpers they share: "
                   "`_attend_all` and `_load_kv_tile` call the student's notebook-12 step, so they stay "
                   "beside the kernels, and the loop over visible tokens, the paged gather and the "
                   "TMA loads are not the exercise. The holes are the tile's rows, the partials' "
                   "stores, the bitmask word and bit, the mask, and the merge with its loads and "
                   "stores; widening them further would hand the student the same online-softmax "
                   "calls that the flatten kernel then gives away (tests/test_given_code_leaks.py)."),
    "swiftspec": (0.09, "two kernels, of which the non-square attention carries the Flash-Decoding split "
                        "(its key range and its partial results) inside the kernel; the holes are a "
                        "compaction chunk, the packed rows and the non-square mask. The rows' q and "
                        "interval loads and the K/V loads are notebook 12's given code, and as holes "
                        "they would be answers given away there (tests/test_given_code_leaks.py)."),
}


def counts(path: Path) -> tuple[int, int]:
    """(non-blank lines, non-blank lines inside the exercise regions) of one module."""
    total = student = 0
    inside = False
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("### BEGIN SOLUTION"):
            inside = True
        elif text.startswith("### END SOLUTION"):
            inside = False
        elif text:
            student += inside
        total += bool(text)
    return total, student


def student_modules() -> list[Path]:
    return sorted(p for p in SOLUTIONS.glob("*.py") if p.name != "__init__.py")


def triton_modules() -> list[Path]:
    return [p for p in student_modules() if "@triton.jit" in p.read_text()]


def test_the_count_reads_the_regions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("a = 1\n\n### BEGIN SOLUTION\nb = 2\n\nc = 3\n### END SOLUTION\nd = 4\n")
    assert counts(module) == (6, 2)


@pytest.mark.parametrize("path", student_modules(), ids=lambda p: p.stem)
def test_no_student_module_is_over_the_limit(path):
    total, _ = counts(path)
    assert total <= MAX_LINES, (f"solutions/{path.name} has {total} non-blank lines (at most {MAX_LINES}): "
                                "move what a student does not write to its topic's room")


@pytest.mark.parametrize("path", triton_modules(), ids=lambda p: p.stem)
def test_a_triton_module_is_mostly_the_students_work(path):
    total, student = counts(path)
    share = student / total
    floor, why = SHORT_OF_SHARE.get(path.stem, (MIN_SHARE, ""))
    assert share >= floor, (f"solutions/{path.name}: {student} of {total} non-blank lines are the student's "
                            f"({share:.1%}, at least {floor:.0%})")
    if why:
        assert share < MIN_SHARE, f"solutions/{path.name} reaches {share:.1%}: drop it from SHORT_OF_SHARE"
