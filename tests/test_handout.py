"""The hand-out (`python -m course release --handout DIR`): what students get, and that it works
without solutions/: stubs that fail with their own message, notebooks with no cell that needs
solutions/, and notebook 01 running under nbval once its exercises are written."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course import release
from course.core import impl, regions

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    """The environment of a student's process: no COURSE_IMPL, and no path into this repository
    (other PYTHONPATH entries, such as a GPU machine's own site folder, stay)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COURSE_IMPL")}
    kept = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if entry and not Path(entry).resolve().is_relative_to(ROOT)]
    if kept:
        environment["PYTHONPATH"] = os.pathsep.join(kept)
    return environment


@pytest.fixture(scope="module")
def handout(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("handout") / "course"
    written = release.handout(folder)
    assert Path("lessons/trees.py") in written
    return folder


def _code_cells(notebook: Path):
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] == "code":
            yield index, "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_handout_has_no_solutions_and_fresh_stubs(handout):
    assert not (handout / "solutions").exists()
    assert not (handout / "tests").exists()  # the course's own suite, and tests/submissions
    for part in ("course", "pyspec_ref", "notebooks", "results", "README.md", "pyproject.toml"):
        assert (handout / part).exists(), part
    expected = release.render(ROOT / "solutions")
    present = {p.relative_to(handout / "lessons") for p in (handout / "lessons").rglob("*") if p.is_file()}
    assert present == set(expected)
    assert all((handout / "lessons" / p).read_bytes() == content for p, content in expected.items())
    assert 'todo("trees.dfs_times_kernel", region=1' in (handout / "lessons" / "trees.py").read_text()
    assert not list(handout.rglob("__pycache__"))


def test_no_handout_cell_needs_solutions(handout):
    notebooks = sorted((handout / "notebooks").glob("*.ipynb"))
    assert [n.name for n in notebooks] == [n.name for n in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    rewritten = 0
    for notebook in notebooks:
        cells = json.loads(notebook.read_text())["cells"]
        assert not any(release.HANDOUT_TAG in c.get("metadata", {}).get("tags", []) for c in cells)
        for index, source in _code_cells(notebook):
            assert not release._needs_solutions(source), f"{notebook.name} cell {index}"
            assert '"solutions")' not in source or "try:" in source, f"{notebook.name} cell {index}"
            rewritten += release._OWN_COPY.strip() in source
    assert rewritten >= 10  # the notebooks' reference modules became the student's own copies


def test_harness_in_handout_never_imports_solutions(handout):
    for path in (handout / "course").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            assert not any(n.split(".")[0] == "solutions" for n in names), (
                f"{path.relative_to(handout)}:{node.lineno} imports solutions, which a hand-out lacks: load "
                "it with course.core.impl.load(name, course.core.impl.bench_impl()) (a bench: the student's "
                "copy "
                "in a hand-out) or course.core.impl.load(name, 'solutions') (a clear SolutionsMissing there)")


def test_check_in_handout_fails_with_the_stubs_message(handout):
    done = subprocess.run([sys.executable, "-m", "course", "check", "01"], cwd=handout, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not implemented yet: exercise trees.dfs_times_kernel" in done.stdout
    assert "Error" not in done.stdout + done.stderr  # no ImportError, no traceback


def test_release_and_solutions_refuse_clearly_in_handout(handout):
    before = (handout / "lessons" / "trees.py").read_bytes()
    probe = ("import course, course.core.impl as i\n"
             "from course.__main__ import main\n"
             "print(i.has_solutions(), i.bench_impl())\n"
             "print('release exit', main(['release', '--force']))\n"
             "try:\n    i.load('trees', 'solutions')\n"
             "except i.SolutionsMissing as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=handout, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.splitlines()[:2] == ["False lessons", "release exit 2"], done.stdout + done.stderr
    assert "has no solutions/" in done.stderr
    assert (handout / "lessons" / "trees.py").read_bytes() == before  # the student's work survives
    assert "refused: cannot load solutions.trees" in done.stdout


def test_solutions_missing_is_an_import_error(monkeypatch, tmp_path):
    monkeypatch.setattr(regions, "ROOT", tmp_path)
    assert not impl.has_solutions() and impl.bench_impl() == "lessons"
    with pytest.raises(ImportError, match=r"course.impl.load\('trees'\)"):
        impl.load("trees", "solutions")


def test_handout_refuses_a_used_folder(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(release.ReleaseError, match="not an empty folder"):
        release.handout(tmp_path)
    with pytest.raises(release.ReleaseError, match="inside a folder"):
        release.handout(ROOT / "notebooks" / "handout")


def _notebook(*cells) -> str:
    return json.dumps({"cells": [
        {"cell_type": kind, "metadata": {"tags": tags} if tags else {}, "source": source,
         **({"outputs": [], "execution_count": None} if kind == "code" else {})}
        for kind, source, tags in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_handout_notebook_rules():
    text = release.handout_notebook(_notebook(
        ("code", 'import course.core.impl\nrung = course.core.impl.load("ladder_k2")\n'
                 'before = course.core.impl.load("ladder_k1", "solutions")  # the reference\n', []),
        ("markdown", "## The reference change", ["reference"]),
        ("code", "print(course.core.source.diff(before.f, rung.f))", ["reference"]),
        ("code", 'try:\n    other = course.core.impl.load("trees", "solutions")\n'
                 'except ImportError:\n    pass', []),
    ), "nb")
    cells = json.loads(text)["cells"]
    assert len(cells) == 2
    assert cells[0]["source"].splitlines()[2] == (
        'before = course.core.impl.load("ladder_k1")  # your own copy: a hand-out has no solutions/')
    with pytest.raises(release.ReleaseError, match="cell 0 needs solutions/"):
        release.handout_notebook(_notebook(("code", 'check("x", impl="solutions")', [])), "nb")
    with pytest.raises(release.ReleaseError, match="cell 0 needs solutions/"):  # lessons have no markers
        release.handout_notebook(_notebook(("code", 'src.index("### BEGIN SOLUTION")', [])), "nb")
    with pytest.raises(release.ReleaseError, match="cell 1 uses seconds from cell 0"):
        release.handout_notebook(_notebook(("code", "seconds = 1.0", ["reference"]),
                                           ("code", "print(seconds)", [])), "nb")


def test_notebook_01_runs_in_a_completed_handout(handout, tmp_path):
    """Notebook 01 under nbval in the hand-out, after its exercises are written (the solution's
    trees.py standing in for the student's): nothing in it needs solutions/."""
    student = tmp_path / "course"
    shutil.copytree(handout, student)
    shutil.copyfile(ROOT / "solutions" / "trees.py", student / "lessons" / "trees.py")
    # No shuffle: a hand-out has no conftest.py to keep a notebook's cells in order.
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist",
                           "-p", "no:randomly", "--nbval-lax", "notebooks/01_token_trees.ipynb"], cwd=student,
                          env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
