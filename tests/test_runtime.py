"""The runtime picks GPU or simulator before numba loads, and refuses to be fooled."""

import os
import subprocess
import sys

import pytest

import course


def _python(code, **env):
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET", "COURSE_SIM")}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=120)


def test_importing_course_first_turns_the_simulators_on():
    result = _python("import course, os; print(course.MODE, os.environ['NUMBA_ENABLE_CUDASIM'], "
                     "os.environ['TRITON_INTERPRET'])", COURSE_SIM="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["simulator", "1", "1"]


def test_importing_numba_first_fails_clearly():
    result = _python("import numba\nimport course", COURSE_SIM="1")
    assert result.returncode != 0
    assert "numba was imported before course" in result.stderr


def test_bad_course_sim_value_is_named():
    result = _python("import course", COURSE_SIM="yes")
    assert result.returncode != 0 and "COURSE_SIM must be 0, 1 or unset" in result.stderr


@pytest.mark.skipif(course.on_gpu(), reason="only meaningful without a GPU")
def test_asking_for_a_gpu_without_one_fails_clearly():
    result = _python("import course", COURSE_SIM="0")
    assert result.returncode != 0 and "PyTorch sees none" in result.stderr


def test_describe_says_where_kernels_run():
    text = course.describe()
    assert course.MODE in text and "kernels :" in text


def test_impl_choice_is_validated(monkeypatch):
    from course.core import impl

    monkeypatch.setenv("COURSE_IMPL", "answers")
    with pytest.raises(ValueError, match="COURSE_IMPL must be one of"):
        impl.impl_name()
    with pytest.raises(ValueError, match="impl must be one of"):
        impl.load("trees", "answers")
    with pytest.raises(ValueError, match="module must be a module name"):
        impl.load("../trees", "solutions")


def test_an_edited_lesson_is_imported_again(tmp_path, monkeypatch):
    # A student edits their lesson and reruns the check cell: the check must see the new code.
    from course.core import impl

    package = tmp_path / "edited_lessons"
    package.mkdir()
    (package / "__init__.py").write_text("")
    lesson = package / "trees.py"
    lesson.write_text("ANSWER = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "edited_lessons.trees", raising=False)
    assert impl._import_fresh("edited_lessons.trees").ANSWER == 1
    assert impl._import_fresh("edited_lessons.trees").ANSWER == 1  # unchanged: the same module
    lesson.write_text("ANSWER = 22\n")
    os.utime(lesson, ns=(lesson.stat().st_atime_ns, lesson.stat().st_mtime_ns + 10**9))
    assert impl._import_fresh("edited_lessons.trees").ANSWER == 22
