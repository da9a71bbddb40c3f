"""`python -m course sanitize` covers every kernel's check: the Numba notebooks and the Triton ones."""

from __future__ import annotations

import importlib
from pathlib import Path

from course import sanitize  # noqa: F401
from course.registry import EXERCISES


def _imports(module: str, package: str) -> bool:
    source = Path(importlib.import_module(f"solutions.{module}").__file__).read_text()
    return f"import {package}" in source or f"from {package} import" in source


def test_every_exercise_notebook_is_sanitized():
    triton = {e.notebook.split("_")[0] for e in EXERCISES.values() if _imports(e.module, "triton")}
    numba = {e.notebook.split("_")[0] for e in EXERCISES.values() if _imports(e.module, "numba")}
    assert triton == set(sanitize.TRITON_NOTEBOOKS)
    assert numba == set(sanitize.NUMBA_NOTEBOOKS)
    assert set(sanitize.NOTEBOOKS) == triton | numba  # notebook 02 is plain PyTorch: no kernel


def test_triton_runs_follow_every_process_at_full_sizes_without_pooled_memory():
    argv = sanitize.command(Path("/cs"), "memcheck", "16")
    assert argv[:3] == ["/cs", "--tool", "memcheck"] and "--target-processes" in argv
    assert argv[-6:] == ["course", "check", "16", "--impl", "solutions", "--full"]  # every case, as before
    assert sanitize.environment("16") == {"COURSE_SIM": "0", "COURSE_SIZES": "full",
                                          "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    assert sanitize.environment("16", "small")["COURSE_SIZES"] == "small"
    assert sanitize.environment("05")["COURSE_SIZES"] == "small"  # the Numba runs as before
    assert "--target-processes" not in sanitize.command(Path("/cs"), "racecheck", "05")
