"""Every Numba kernel compiles to PTX for an H100 (sm_90) as the CPU checks launch it, without a GPU.

`python -m course.ptx_compile` compiles each launch recorded in course/numba_launches.json
(its arguments' Numba types and the constants it was specialized with) with NVVM, which the CPU
install brings (the `ptx` extra). CI (CI=true) must have NVVM; elsewhere these tests skip without it.
"""

from __future__ import annotations

import importlib
import json
import os
import re

import pytest

import course  # noqa: F401  (the simulator before numba)
from course import ptx_compile
from course.registry import EXERCISES


def nvvm_installed() -> bool:
    from cuda.pathfinder import load_nvidia_dynamic_lib

    try:
        load_nvidia_dynamic_lib("nvvm")
    except Exception:  # cuda.pathfinder's DynamicLibNotFoundError, whatever the version names it
        return False
    return True


needs_nvvm = pytest.mark.skipif(not nvvm_installed() and not os.environ.get("CI"),
                                reason="NVVM is not installed (pip install -e '.[dev,ptx]')")
RECORD = json.loads(ptx_compile.RECORD.read_text())

BROKEN = '''
from numba import cuda


@cuda.jit
def dict_kernel(out):
    seen = {}  # the simulator runs Python; the CUDA target has no dict
    seen[0] = 1.0
    out[0] = seen[0]


@cuda.jit
def plain_kernel(out, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = 2 * out[i]
'''


@needs_nvvm
def test_every_numba_kernel_compiles_to_ptx():
    done = ptx_compile.run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every kernel compiles" in done.stdout
    assert int(re.search(r"compiled (\d+) launches", done.stdout)[1]) >= len(RECORD)


@needs_nvvm
def test_a_kernel_the_cuda_target_refuses_fails_naming_it(tmp_path):
    (tmp_path / "broken_kernels.py").write_text(BROKEN)
    array = {"array": "float32", "ndim": 1, "layout": "C"}
    launches = {
        "broken_kernels.dict_kernel": {"parameters": "", "launches": [{"types": [array], "constants": {}}]},
        "broken_kernels.plain_kernel": {"parameters": "", "launches": [{"types": [array, "int64"],
                                                                        "constants": {}}]},
    }
    record = tmp_path / "launches.json"
    record.write_text(json.dumps(launches))
    path = os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))  # keep the caller's
    done = ptx_compile.run(record, modules=["broken_kernels"], env={"PYTHONPATH": path})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "broken_kernels: kernel dict_kernel (as defined) does not compile to PTX for sm_90" in done.stdout
    assert "plain_kernel" not in done.stdout
    assert "compiled 1 launches" in done.stdout and "1 kernels FAILED" in done.stdout


def test_the_record_holds_every_numba_exercise_with_its_parameters():
    """A kernel whose parameters changed, or a new one, needs its launches recorded again."""
    stale = []
    for exercise in EXERCISES.values():
        if exercise.module not in ptx_compile.numba_modules():
            continue
        module = importlib.import_module(f"solutions.{exercise.module}")
        kernel = getattr(module, exercise.id.split(".", 1)[1])
        function = getattr(kernel, "py_func", kernel)
        entry = RECORD.get(ptx_compile.kernel_key(function))
        if entry is None or entry["parameters"] != ptx_compile.fingerprint(function) or not entry["launches"]:
            stale.append(exercise.id)
    assert not stale, (f"the launches of {', '.join(stale)} are not recorded as the kernels now stand: "
                       "run `python -m course.ptx_compile --record`")
