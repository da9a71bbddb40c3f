"""Install files agree with each other and with the README's two commands; the installer refuses
clearly and never leaves a venv that `make` would trust after a failed step."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _installer():
    spec = importlib.util.spec_from_file_location("course_installer", ROOT / "tools" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


installer = _installer()


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pyproject_requirements():
    project = _pyproject()
    return project["dependencies"] + project["optional-dependencies"]["dev"]


def _environment_requirements():
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_lines = [line.strip()[2:] for line in lines if line.startswith("      - ")]
    return [line for line in pip_lines if not line.startswith("-e")]


def _normalise(requirement):
    return re.sub(r"\s+", "", requirement.split("#")[0]).lower()


def test_environment_yml_pins_what_pyproject_pins():
    assert sorted(map(_normalise, _environment_requirements())) == sorted(
        map(_normalise, _pyproject_requirements()))


def test_the_ranges_the_course_depends_on():
    requirements = set(map(_normalise, _pyproject_requirements()))
    assert "torch>=2.11,<2.14" in requirements  # the lent GPU's torch up to the newest that passed
    assert "triton>=3.6,<3.8;platform_system=='linux'" in requirements  # follows torch; Linux wheels only
    assert "numpy>=1.26,<2.5" in requirements  # numba-cuda 0.30 cannot compile with numpy 2.5
    assert "numba-cuda==0.30.4" in requirements


def test_gpu_extras_match_torch_cuda_majors():
    extras = _pyproject()["optional-dependencies"]
    assert extras["gpu"] == ["numba-cuda[cu13]==0.30.4"]
    assert extras["gpu-cu12"] == ["numba-cuda[cu12]==0.30.4"]
    assert set(installer.GPU_EXTRA_BY_CUDA_MAJOR.values()) <= set(extras)


def test_ci_guards_the_pins_before_it_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make resolve" in ci and "make test" in ci
    assert ci.index("make resolve") < ci.index("make test")


def test_installer_reads_the_torch_range_from_pyproject():
    assert installer.requirement("torch") == "torch>=2.11,<2.14"


@pytest.mark.parametrize(("version", "inside"), [
    ("2.11.0+cu130", True), ("2.13.0+cpu", True), ("2.12.0rc1", True), ("2.13.1", True),
    ("2.10.2", False), ("2.14.0", False), ("3.0.0", False),
])
def test_installer_range_check(version, inside):
    assert installer.admits("torch>=2.11,<2.14", version) is inside


def _fake_python(tmp_path, python_version="3.11.7", torch_lines=None):
    """A stand-in interpreter: prints a Python version, or what `import torch` would report."""
    torch_reply = "printf '%s\\n' " + " ".join(torch_lines) if torch_lines else "exit 1"
    script = tmp_path / "fake-python"
    script.write_text(f'#!/bin/sh\ncase "$2" in\n  *torch*) {torch_reply} ;;\n'
                      f'  *) echo {python_version} ;;\nesac\n')
    script.chmod(0o755)
    return str(script)


def _install_args(tmp_path, python, **overrides):
    values = dict(command="install", venv=str(tmp_path / "venv"), python=python, extras="dev", gpu="0",
                  system_torch=False)
    values.update(overrides)
    return installer.argparse.Namespace(**values)


def test_installer_refuses_an_unsupported_python(tmp_path, capsys):
    python = _fake_python(tmp_path, python_version="3.10.4")
    command = ["install", "--venv", str(tmp_path / "venv"), "--python", python, "--gpu", "0"]
    assert installer.main(command) == 2
    message = capsys.readouterr().err
    assert "Python 3.10.4" in message and "3.11" in message and "PYTHON=" in message
    assert not (tmp_path / "venv").exists()


def test_installer_refuses_a_system_torch_outside_the_range(tmp_path):
    python = _fake_python(tmp_path, torch_lines=["2.9.1", "12.6"])
    outside = r"torch is 2\.9\.1, outside the course's range torch>=2\.11"
    with pytest.raises(installer.InstallError, match=outside):
        installer.install(_install_args(tmp_path, python, system_torch=True))
    assert not (tmp_path / "venv").exists()


def test_installer_refuses_system_torch_mode_without_a_torch(tmp_path):
    python = _fake_python(tmp_path)
    with pytest.raises(installer.InstallError, match="cannot import torch"):
        installer.install(_install_args(tmp_path, python, system_torch=True))


def test_a_failed_step_leaves_no_stamp(tmp_path, monkeypatch, capsys):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-cpu").write_text("cpu\n")  # an earlier install of the same mode

    def fresh_venv(path, python, keep_system_torch):  # as the real one, without making a venv
        shutil.rmtree(path)
        (path / "bin").mkdir(parents=True)
        return path / "bin" / "python"

    def failing_run(command, **kwargs):
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(installer, "fresh_venv", fresh_venv)
    monkeypatch.setattr(installer, "reachable", lambda url: False)
    monkeypatch.setattr(installer, "run", failing_run)
    python = _fake_python(tmp_path)
    assert installer.main(["install", "--venv", str(venv), "--python", python, "--gpu", "0"]) == 1
    assert list(venv.glob(".installed*")) == []
    assert "starts again" in capsys.readouterr().err


def test_a_gpu_that_torch_cannot_use_is_named(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 535.104.05\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    venv_python = tmp_path / "venv-python"
    venv_python.write_text(f'#!/bin/sh\ncase "$2" in\n  *is_available*) echo 2.13.0 13.0 False ;;\n'
                           f'  *) exec {sys.executable} "$@" ;;\nesac\n')
    venv_python.chmod(0o755)
    monkeypatch.setattr(installer, "run", lambda command, **kwargs: None)
    named = r"driver 535\.104\.05.*torch 2\.13\.0.*CUDA 13\.0.*GPU=0"
    with pytest.raises(installer.InstallError, match=named):
        installer.verify(venv_python, gpu=True)


def test_make_picks_a_stamp_per_mode():
    makefile = (ROOT / "Makefile").read_text()
    assert "STAMP        := $(VENV)/.installed-$(MODE)" in makefile
    dry = subprocess.run(["make", "-n", "-p", "GPU=0", "SYSTEM_TORCH=1", "resolve"], cwd=ROOT,
                         capture_output=True, text=True)
    assert "STAMP := .venv/.installed-system-cpu" in dry.stdout


@pytest.mark.parametrize(("platform", "advice"), [("darwin", "Linux machine"), ("win32", "WSL 2"),
                                                  ("cygwin", "WSL 2")])
def test_installer_says_where_to_run_instead(platform, advice):
    with pytest.raises(installer.InstallError, match=advice):
        installer.check_platform(platform)
    installer.check_platform("linux")


def _strip(notebook_text: str) -> str:
    """The clean filter that the installer configures (.gitattributes names it)."""
    command = [sys.executable, "-m", "nbstripout", "--keep-id", "--extra-keys", "metadata.language_info"]
    return subprocess.run(command, input=notebook_text, capture_output=True, text=True, check=True).stdout


def test_running_a_notebook_leaves_the_tracked_file_clean():
    assert "*.ipynb filter=nbstripout" in (ROOT / ".gitattributes").read_text()
    notebook = ROOT / "notebooks" / "01_token_trees.ipynb"
    committed = notebook.read_text()
    assert _strip(committed) == committed  # committed notebooks are already in the filter's form
    ran = json.loads(committed)
    ran["metadata"]["language_info"] = {"name": "python", "version": "3.11.7", "mimetype": "text/x-python"}
    for count, cell in enumerate((c for c in ran["cells"] if c["cell_type"] == "code"), start=1):
        cell["execution_count"] = count
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["a result\n"]}]
    assert _strip(json.dumps(ran, indent=1)) == committed
