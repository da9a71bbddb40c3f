"""Every Triton kernel compiles for an H100 (sm_90) as the CPU tests launch it, without a GPU.

`python -m course.gpu_compile` compiles each launch recorded in course/triton_launches.json
(its arguments' types and constexprs) in a process of its own with TRITON_INTERPRET=0.
"""

from __future__ import annotations

import importlib
import json
import re

import pytest
import torch

import course  # noqa: F401  (the simulator before numba)
from course import gpu_compile
from course.core import runtime
from tests.test_triton_globals import SYNTHETIC

RECORD = json.loads(gpu_compile.RECORD.read_text())


def test_every_kernel_compiles_for_sm90():
    done = gpu_compile.run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every kernel compiles" in done.stdout
    assert int(re.search(r"compiled (\d+) launches", done.stdout)[1]) >= len(RECORD)


def test_a_plain_int_global_fails_naming_the_kernel_and_tritons_message(tmp_path):
    (tmp_path / "synthetic_kernels.py").write_text(SYNTHETIC)
    launches = {
        "synthetic_kernels.plain_global_kernel": {"parameters": "", "launches": [
            {"signature": {"out": "*i32"}, "constexprs": {}}]},
        "synthetic_kernels.constexpr_global_kernel": {"parameters": "", "launches": [
            {"signature": {"out": "*i32", "n": "i32", "BLOCK": "constexpr"}, "constexprs": {"BLOCK": 16}}]},
    }
    record = tmp_path / "launches.json"
    record.write_text(json.dumps(launches))
    done = gpu_compile.run(record, modules=["synthetic_kernels"], env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "synthetic_kernels: kernel plain_global_kernel () does not compile for sm_90" in done.stdout
    assert "Cannot access global variable OPEN" in done.stdout
    assert "constexpr_global_kernel" not in done.stdout.replace("kernel plain_global_kernel", "")
    assert "compiled 1 launches" in done.stdout and "1 kernels FAILED" in done.stdout


def kernel_modules() -> list[str]:
    return [*gpu_compile.COURSE_MODULES, *(f"solutions.{m}" for m in gpu_compile.triton_modules("solutions"))]


@pytest.mark.parametrize("name", kernel_modules())
def test_the_record_holds_every_kernel_with_its_parameters(name):
    """A kernel whose parameters changed, or a new kernel, needs its launches recorded again."""
    stale = []
    callers = [f for other in kernel_modules()
               for f in gpu_compile.jit_functions(importlib.import_module(other))]
    for function in gpu_compile.launched(gpu_compile.jit_functions(importlib.import_module(name)), callers):
        entry = RECORD.get(gpu_compile.kernel_key(function))
        if entry is None or entry["parameters"] != gpu_compile.fingerprint(function) or not entry["launches"]:
            stale.append(function.__name__)
    assert not stale, (f"{name}: the launches of {', '.join(stale)} are not recorded as the kernel now "
                       "stands: run `python -m course.gpu_compile --record`")


def test_the_search_finds_the_kernels_and_not_their_helpers():
    from solutions import triton_attention

    names = {f.__name__ for f in gpu_compile.launched(gpu_compile.jit_functions(triton_attention))}
    assert "tree_attention_kernel" in names and "online_softmax_step" not in names


@pytest.mark.skipif(not runtime.SIMULATOR, reason="records the interpreter's launches")
def test_the_recorder_notes_types_and_constexprs(tmp_path, monkeypatch):
    (tmp_path / "recorded_kernels.py").write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def scale_kernel(out, n, factor, BLOCK: tl.constexpr):\n"
        "    offsets = tl.arange(0, BLOCK)\n"
        "    values = tl.load(out + offsets, mask=offsets < n)\n"
        "    tl.store(out + offsets, values * factor, mask=offsets < n)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("recorded_kernels")
    out = torch.ones(3)
    with gpu_compile.Recorder() as recorder:
        module.scale_kernel[(1,)](out, 3, 2.0, BLOCK=4)
        module.scale_kernel[(1,)](out, 3, 2.0, BLOCK=4)  # the same launch again: noted once
    assert out.tolist() == [4.0, 4.0, 4.0]
    entry = recorder.kernels["recorded_kernels.scale_kernel"]
    signature = {"out": "*fp32", "n": "i32", "factor": "fp32", "BLOCK": "constexpr"}
    assert entry["launches"] == [{"signature": signature, "constexprs": {"BLOCK": 4}}]
    assert entry["parameters"] == gpu_compile.fingerprint(module.scale_kernel.fn)
